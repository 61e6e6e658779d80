"""PVT-v2 encoder (timm) with separately named key and value projections.

timm fuses the key and value projections of each attention layer into one ``kv`` Linear.
FedST's Table VI personalises keys and values separately, and a state_dict key can only
be shared or kept whole, so :class:`SplitKV` replaces ``attn.kv`` by two Linears ``k`` and
``v`` whose concatenated output is exactly what the fused layer returns (timm reshapes it
into (2, heads, head_dim), keys first). Parameter names: ``...attn.q.*`` (query
embeddings, rho in the paper), ``...attn.kv.k.*``, ``...attn.kv.v.*``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn


class SplitKV(nn.Module):
    """``kv(x) = cat(k(x), v(x))``: the fused timm layer, as two separately named Linears."""

    def __init__(self, fused: nn.Linear) -> None:
        super().__init__()
        dim, bias = fused.in_features, fused.bias is not None
        self.k = nn.Linear(dim, dim, bias=bias)
        self.v = nn.Linear(dim, dim, bias=bias)
        with torch.no_grad():
            self.k.weight.copy_(fused.weight[:dim])
            self.v.weight.copy_(fused.weight[dim:])
            if bias:
                self.k.bias.copy_(fused.bias[:dim])
                self.v.bias.copy_(fused.bias[dim:])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.k(x), self.v(x)], dim=-1)


class PVTEncoder(nn.Module):
    """Four-stage PVT-v2 feature pyramid (strides 4, 8, 16, 32), random init offline.

    ``weights``: optional local file with a timm PVT-v2 state_dict (ImageNet weights
    cannot be downloaded here); fused ``kv`` entries in it are split on load.
    """

    def __init__(self, name: str = "pvt_v2_b0", weights: str | None = None) -> None:
        super().__init__()
        import timm

        if not name.startswith("pvt_v2"):
            raise ValueError(f"model.encoder = {name!r}: FedST uses a PVT-v2 encoder (pvt_v2_b0 .. pvt_v2_b5)")
        self.backbone = timm.create_model(name, pretrained=False, num_classes=0)
        if weights:
            self._load(Path(weights))
        for module in self.backbone.modules():
            if hasattr(module, "kv") and isinstance(module.kv, nn.Linear):
                module.kv = SplitKV(module.kv)
        self.channels = [s["num_chs"] for s in self.backbone.feature_info]

    def _load(self, path: Path) -> None:
        if not path.is_file():
            raise FileNotFoundError(f"{path}: encoder weights file not found (fedst model.encoder_weights)")
        from fedmedbench.weights.models import load_timm

        load_timm(self.backbone, path, "fedst model.encoder_weights")

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """(B, 3, H, W) -> four (B, C_i, H/s_i, W/s_i) maps."""
        x = self.backbone.patch_embed(x)
        feats = []
        for stage in self.backbone.stages:
            x = stage(x)
            feats.append(x)
        return feats
