"""FedST network: the temporal module sees exactly the configured history frames."""

from __future__ import annotations

import pytest
import torch

import fedmedbench  # noqa: F401  (compat first: timm needs the torchvision shim)
from fedmedbench.models.fedst import build_fedst_net
from fedmedbench.models.fedst.rsc import RSCTemporal

TINY = {"window": 2, "pools": [2, 1, 1, 1], "fields": [4, 3, 2, 2], "indicator_dim": 8, "decoder_dim": 16}


@pytest.fixture(scope="module")
def net():
    torch.manual_seed(0)
    return build_fedst_net(TINY).eval()


def test_output_depends_on_every_configured_frame(net):
    clip = torch.rand(1, 4, 3, 64, 64, requires_grad=True)
    net(clip).sum().backward()
    per_frame = clip.grad.abs().sum(dim=(0, 2, 3, 4))
    assert (per_frame > 0).all(), per_frame  # oldest .. current all reach the prediction


def test_clip_length_must_match_the_configuration(net):
    for t in (3, 5):
        with pytest.raises(ValueError, match="4 frames"):
            net(torch.rand(1, t, 3, 64, 64))


def test_without_temporal_module_only_the_current_frame_counts(net):
    torch.manual_seed(0)
    model = build_fedst_net({**TINY, "temporal": False}).eval()
    clip = torch.rand(1, 4, 3, 64, 64, requires_grad=True)
    model(clip).sum().backward()
    assert clip.grad[:, :3].abs().sum() == 0 and clip.grad[:, 3].abs().sum() > 0
    # SERQ / synthetic pre-training bypass RSC on still frames: history is ignored there too
    clip.grad = None
    net(clip, temporal=False).sum().backward()
    assert clip.grad[:, :3].abs().sum() == 0 and clip.grad[:, 3].abs().sum() > 0


def test_receptive_field_limits_what_a_window_sees():
    """A previous frame contributes only the pooled tokens inside its r x r square around each window."""
    torch.manual_seed(0)
    rsc = RSCTemporal(dim=8, heads=2, window=2, pools=[2, 1], fields=[2, 2]).eval()
    feats = torch.rand(1, 2, 8, 8, 8)
    base = rsc(feats)
    changed = feats.clone()
    changed[0, 0, :, 6:, 6:] += 5.0  # previous frame, bottom-right corner only
    out = rsc(changed)
    assert torch.allclose(out[..., :4, :4], base[..., :4, :4])   # the top-left windows cannot see it
    assert not torch.allclose(out[..., 6:, 6:], base[..., 6:, 6:])  # the window over it does
    with pytest.raises(ValueError, match="2 frames"):
        rsc(torch.rand(1, 3, 8, 8, 8))


def test_key_and_value_are_split_exactly():
    from fedmedbench.models.fedst.encoder import SplitKV

    fused = torch.nn.Linear(6, 12)
    split = SplitKV(fused)
    x = torch.rand(3, 6)
    assert torch.allclose(split(x), fused(x))
    assert sorted(dict(split.named_parameters())) == ["k.bias", "k.weight", "v.bias", "v.weight"]
