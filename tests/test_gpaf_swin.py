"""GPAF's centralized row: the authors' small Swin from scratch by default (Swin-Transformer-fed main.py:92-183 at
c317ebc); the paper-text option, an ImageNet Swin-T: a file in the hub weight set's layout (timm, 224 px, RGB) loads
into the Swin-T built for 28 px grey images."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
SWIN = "swin_tiny_patch4_window7_224"


@pytest.mark.slow
def test_imagenet_swin_layout_loads_into_the_28px_grey_swin(tmp_path):
    import timm
    from safetensors.torch import save_file

    from fedmedbench.models import build_model

    torch.manual_seed(0)
    state = timm.create_model(SWIN, pretrained=False, num_classes=1000).state_dict()  # the hub file's layout
    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    model = build_model(f"timm:{SWIN}", 1, 2, 28, pretrained_path=str(path)).eval()
    own = model.state_dict()
    # grey input: timm's rule sums the RGB patch filters (adapt_input_conv)
    assert torch.allclose(own["patch_embed.proj.weight"], state["patch_embed.proj.weight"].sum(1, keepdim=True))
    # the 28 px token grid (7 x 7, then 4 x 4) shrinks the later stages' windows: their bias tables are resized
    key = "layers.1.blocks.0.attn.relative_position_bias_table"
    assert state[key].shape == (169, 6) and own[key].shape == (49, 6)
    assert torch.equal(own["layers.0.blocks.0.attn.qkv.weight"], state["layers.0.blocks.0.attn.qkv.weight"])
    with torch.no_grad():
        out = model(torch.rand(3, 1, 28, 28))
    assert out.shape == (3, 2) and torch.isfinite(out).all()


def test_paper_grid_trains_the_centralized_row_on_the_authors_swin_from_scratch():
    from fedmedbench.studies import grid as study_grid

    grid = yaml.safe_load((ROOT / "config" / "studies" / "gpaf.yaml").read_text())["studies"]
    gpaf = {"method_train": {}, **grid["gpaf"]}
    assert study_grid.run_model(gpaf, "centralized") == {"name": "swin_gpaf"}  # no weights: from scratch
    train = study_grid.run_train(gpaf, "alpha0.5", "centralized")
    assert (train["optimizer"], train["lr"], train["weight_decay"], train["batch_size"]) == \
        ("adamw", 0.00013914064388085564, 0.0001, 16)
    assert "centralized" not in grid["gpaf_pathmnist"]["method_model"]
