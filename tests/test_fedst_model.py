"""FedST network: the temporal module sees exactly the configured history frames."""

from __future__ import annotations

import pytest
import torch

import fedmedbench  # noqa: F401  (compat first: timm needs the torchvision shim)
from fedmedbench.models.fedst import build_fedst_net
from fedmedbench.models.fedst.rsc import RSCTemporal

TINY = {"window": 2, "pools": [2, 1, 1, 1], "fields": [4, 3, 2, 2], "indicator_dim": 8}


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


def test_eq3_pools_each_channel_with_one_shared_linear():
    """Eq. 3 (as CFFM): c x p^2 -> c per channel, p^2 + 1 parameters per frame, initialised to the mean."""
    rsc = RSCTemporal(dim=8, heads=2, window=2, pools=[2, 1], fields=[2, 2])
    assert [sum(t.numel() for t in fc.parameters()) for fc in rsc.pool_fc] == [2 * 2 + 1, 1 * 1 + 1]
    f = torch.arange(2 * 8 * 4 * 4, dtype=torch.float32).reshape(2, 8, 4, 4)
    pooled = rsc._pooled(f, 0)
    assert pooled.shape == (2, 2, 2, 8)
    # initial weights = 1/p^2: the per-channel mean of each 2x2 patch
    assert torch.allclose(pooled.permute(0, 3, 1, 2), torch.nn.functional.avg_pool2d(f, 2))
    # channels never mix: changing channel 3 changes only channel 3 of the pooled map
    with torch.no_grad():
        rsc.pool_fc[0].weight.normal_()
    g = f.clone()
    g[:, 3] += 1.0
    diff = (rsc._pooled(g, 0) - rsc._pooled(f, 0)).abs().sum(dim=(0, 1, 2))
    assert diff[3] > 0 and diff[torch.arange(8) != 3].sum() == 0


def test_baselines_network_is_feddps_buildfpn_pvtb0_with_5166180_parameters():
    """FedDP's ``BuildFPN(4, 'pvtb0')``: PVT-v2-b0 3,409,760 + FPN decoder 1,755,904 + head 516."""
    torch.manual_seed(0)
    net = build_fedst_net({"temporal": False, "selection": "none"})
    count = {part: sum(p.numel() for n, p in net.named_parameters() if n.startswith(part)) for part in ("encoder.", "decoder.")}
    head = sum(p.numel() for n, p in net.named_parameters() if n.startswith("decoder.head."))
    assert (count["encoder."], count["decoder."] - head, head) == (3_409_760, 1_755_904, 128 * 4 + 4)
    assert sum(p.numel() for p in net.parameters()) == 5_166_180
    # smp's layer names (a FedDP decoder state_dict loads by name); GroupNorm: no buffers to share
    names = {n for n, _ in net.decoder.named_parameters()}
    assert {"p5.weight", "p4.skip_conv.weight", "p2.skip_conv.bias", "seg_blocks.0.block.2.block.1.weight", "head.weight"} <= names
    assert [len(b.block) for b in net.decoder.seg_blocks] == [3, 2, 1, 1]
    assert not [n for n, _ in net.named_buffers() if n.startswith("decoder.")]
    light = build_fedst_net({"temporal": False, "selection": "none", "decoder": "light"})
    assert sum(p.numel() for n, p in light.named_parameters() if n.startswith("decoder.")) == 66_628  # the option


def test_fpn_top_down_pyramid_and_merge_on_hand_made_levels():
    """p5 = conv(c5); p_i = nearest-x2(p_{i+1}) + conv(c_i); 1x1 convs set to pass channel 0 through."""
    from fedmedbench.models.fedst.fpn import FPNDecoder

    dec = FPNDecoder([1, 1, 1, 1], num_classes=2).eval()
    with torch.no_grad():
        for conv in (dec.p5, dec.p4.skip_conv, dec.p3.skip_conv, dec.p2.skip_conv):
            conv.weight.zero_()
            conv.bias.zero_()
            conv.weight[0, 0] = 1.0
    c5 = torch.tensor([[[[1.0, 2.0]]]])
    feats = [torch.full((1, 1, 8, 16), 100.0), torch.full((1, 1, 4, 8), 10.0), torch.ones(1, 1, 2, 4), c5]
    p5, p4, p3, p2 = dec.pyramid(feats)
    assert p5[0, 0].tolist() == [[1.0, 2.0]] and p5[0, 1:].abs().sum() == 0
    assert p4[0, 0].tolist() == [[2.0, 2.0, 3.0, 3.0]] * 2
    assert p3[0, 0, 0].tolist() == [12.0] * 4 + [13.0] * 4
    assert p2[0, 0, 0].tolist() == [112.0] * 8 + [113.0] * 8
    merged = dec.merged(feats)
    assert merged.shape == (1, 128, 8, 16)
    assert torch.equal(merged, sum(b(p) for b, p in zip(dec.seg_blocks, (p5, p4, p3, p2), strict=True)))
    with pytest.raises(ValueError, match="divisible by 32"):
        dec.pyramid([torch.ones(1, 1, 9, 16), torch.ones(1, 1, 4, 8), torch.ones(1, 1, 2, 4), c5])


def test_decoder_dropout_zeroes_whole_channels_from_the_given_generator():
    from fedmedbench.models.fedst.fpn import ChannelDropout

    drop = ChannelDropout(0.5).train()
    x = torch.ones(2, 64, 3, 3)
    drop.generator = torch.Generator().manual_seed(7)
    a = drop(x)
    drop.generator = torch.Generator().manual_seed(7)
    assert torch.equal(a, drop(x))  # the same generator state, the same mask
    per_channel = a.flatten(2)
    assert ((per_channel == 0).all(-1) | (per_channel == 2.0).all(-1)).all()  # kept channels scaled by 1/(1-p)
    assert 0 < (per_channel[..., 0] == 0).sum() < 128
    assert torch.equal(drop.eval()(x), x)


def test_rsc_reads_the_decoders_fused_map_at_one_eighth_with_cffms_heads():
    """Default placement (CFFM's head): RSC with 8 heads on the FPN's merged 128-channel map,
    resized to half its size (1/8 of the input); the head reads the enhanced map."""
    torch.manual_seed(0)
    net = build_fedst_net(TINY).eval()
    assert net.cfg.temporal_at == "decoder" and net.rsc.heads == 8 and net.rsc.dim == 128
    seen = []
    net.rsc.register_forward_hook(lambda m, inp, out: seen.append((inp[0].shape, out.shape)))
    clip = torch.rand(2, 4, 3, 64, 96)
    assert net.head_input(clip).shape == (2, 128, 8, 12)
    assert seen == [(torch.Size([2, 4, 128, 8, 12]), torch.Size([2, 128, 8, 12]))]
    # what RSC reads: every frame's merged decoder map, bilinearly halved
    b, t = clip.shape[:2]
    merged = net.decoder.merged(net.decoder_inputs(clip.reshape(b * t, 1, 3, 64, 96), temporal=False))
    half = torch.nn.functional.interpolate(merged, size=(8, 12), mode="bilinear", align_corners=False)
    assert torch.allclose(net.head_input(clip), net.rsc(half.reshape(b, t, 128, 8, 12)), atol=1e-6)
    # temporal bypassed: the current frame's halved map, F* = F_ts, same scale for the head
    assert torch.allclose(net.head_input(clip, temporal=False), half.reshape(b, t, 128, 8, 12)[:, -1], atol=1e-6)


def test_rsc_at_the_encoder_stays_an_option():
    """``temporal_at: encoder`` (the earlier placement): RSC on the encoder's deepest map (1/32), its heads as configured."""
    torch.manual_seed(0)
    net = build_fedst_net({**TINY, "temporal_at": "encoder", "heads": 1}).eval()
    assert net.rsc.heads == 1 and net.rsc.dim == net.encoder.channels[-1] == 256
    seen = []
    net.rsc.register_forward_hook(lambda m, inp, out: seen.append(inp[0].shape))
    assert net.head_input(torch.rand(1, 4, 3, 64, 96)).shape == (1, 128, 16, 24)
    assert seen == [torch.Size([1, 4, 256, 2, 3])]
    with pytest.raises(ValueError, match="temporal_at"):
        build_fedst_net({**TINY, "temporal_at": "middle"})


def test_fedst_network_adds_rsc_and_selection_to_the_baselines():
    """FedST = the baselines' network + RSC (8 heads at 128 channels: 4 x 128 x 129 projections,
    8 x 49 x 132 position biases, 74 pooling weights) + channel selection (Linear(256 + 512, 256))."""
    torch.manual_seed(0)
    full = dict(window=7, pools=[7, 4, 2, 1], fields=[49, 20, 6, 7])
    fedst = build_fedst_net(full)
    n_rsc = sum(p.numel() for p in fedst.rsc.parameters())
    n_cs = sum(p.numel() for p in fedst.cs.parameters())
    assert n_rsc == 4 * 128 * 129 + 8 * 49 * (49 + 25 + 9 + 49) + (50 + 17 + 5 + 2) == 117_866
    assert n_cs == (256 + 512) * 256 + 256
    assert sum(p.numel() for p in fedst.parameters()) == 5_166_180 + n_rsc + n_cs


def _sent_on_the_paper_grid(methods, method_params=None):
    """Per method: (MiB a site sends per round, the paper grid's network), with ``method_params``
    (method -> parameters) over the grid's."""
    import copy
    from pathlib import Path

    import yaml
    from snakemake.utils import validate

    from fedmedbench.fl.api.registry import get_method
    from fedmedbench.studies.fedst import runs as FS
    from fedmedbench.studies.fedst.deploy import communication_mb

    root = Path(__file__).resolve().parents[1]
    grid = yaml.safe_load((root / "config" / "studies" / "fedst.yaml").read_text())
    validate(grid, str(root / "config" / "schema.yaml"))
    for method, params in (method_params or {}).items():
        grid["fedst"]["method_params"].setdefault(method, {}).update(params)
    validate(grid, str(root / "config" / "schema.yaml"))
    cfg = copy.deepcopy(grid["fedst"])
    out = {}
    for method in methods:
        spec = FS.run_spec(cfg, "main", method, 0, "clips", "run", None, "cpu", 1, "real")
        torch.manual_seed(0)
        net = build_fedst_net({**spec["task_params"]["model"], "encoder_weights": None})
        out[method] = (communication_mb(get_method(method, spec["method_params"]), net), net)
    return out


def test_sent_mib_per_method_on_the_paper_grid_vs_table_ix():
    """Table IX's communication column (MB = MiB of fp32 transmitted trainable parameters) on
    FedDP's network: FedAvg / FedAS / FedLD 19.71 (the whole network; FedAS keeps its 516-parameter
    classifier), FedRep 13.01 (no decoder, no head), FedDP 6.70 under ``sent: paper_text`` (the
    decoder + head, 1,756,420 parameters); by default FedDP sends what its code sends, everything
    but the encoder queries (18.97), and FedST (queries, RSC, selection kept) sends as much;
    Table IX's 12.69 for FedST is below the encoder alone (docs/fedst.md, fidelity table)."""
    from pathlib import Path

    import yaml

    from fedmedbench.fl.api.registry import get_method

    root = Path(__file__).resolve().parents[1]
    paper = yaml.safe_load((root / "config" / "paper_values" / "fedst.yaml").read_text())["tables"]["table9"]["rows"]
    paper = {r["Method"]: r["Cost (MB/round)"] for r in paper}
    sent = _sent_on_the_paper_grid(("seg_fedavg", "fedas", "fedld", "fedrep", "feddp", "fedst"))
    ours = {m: v[0] for m, v in sent.items()}
    assert round(ours["seg_fedavg"], 2) == paper["FedAvg"] == 19.71
    assert round(ours["fedld"], 2) == paper["FedLD"] == 19.71
    assert round(ours["fedas"], 2) == paper["FedAS"] == 19.71
    assert round(ours["fedrep"], 2) == paper["FedRep"] == 13.01
    net = sent["feddp"][1]
    paper_text = _sent_on_the_paper_grid(("feddp",), {"feddp": {"sent": "paper_text"}})["feddp"][0]
    assert paper_text == 1_756_420 * 4 / 2**20 and round(paper_text, 2) == paper["FedDP"] == 6.70
    names = [n for n, _ in net.named_parameters()]  # what leaves a FedDP site under each reading
    assert get_method("feddp", {"sent": "paper_text"}).shared_keys(net) == [n for n in names if n.startswith("decoder.")]
    assert get_method("feddp", {}).shared_keys(net) == [n for n in names if ".attn.q." not in n]
    queries = sum(p.numel() for n, p in net.named_parameters() if ".attn.q." in n)
    assert queries == 193_536
    assert ours["feddp"] == pytest.approx((5_166_180 - queries) * 4 / 2**20) == pytest.approx(18.969, abs=1e-3)
    assert ours["fedst"] == pytest.approx(ours["feddp"])
    encoder_without_queries = (3_409_760 - queries) * 4 / 2**20
    assert round(encoder_without_queries, 2) == 12.27 < paper["FedST"] == 12.69 < paper["FedRep"]


def test_feddp_averages_parameters_only_buffers_stay_on_the_site():
    """FedDP's aggregation walks ``named_parameters``: the light decoder's BatchNorm statistics
    stay on the site (kept with its queries); FedAvg shares them."""
    from fedmedbench.fl.api.registry import get_method

    torch.manual_seed(0)
    net = build_fedst_net({"temporal": False, "selection": "none", "decoder": "light", "decoder_dim": 16})
    bn = {"decoder.fuse.1.running_mean", "decoder.fuse.1.running_var", "decoder.fuse.1.num_batches_tracked"}
    feddp, fedavg = get_method("feddp", {}), get_method("seg_fedavg", {})
    assert bn <= set(feddp.personal(net)) and not bn & set(feddp.shared_keys(net))
    assert set(feddp.shared_keys(net)) == {n for n, _ in net.named_parameters() if ".attn.q." not in n or n.startswith("decoder.")}
    assert bn <= set(fedavg.shared_keys(net))
