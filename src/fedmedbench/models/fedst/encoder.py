"""PVT-v2 encoder (timm) with separately named key and value projections and seeded stochastic depth.

timm fuses the key and value projections of each attention layer into one ``kv`` Linear.
FedST's Table VI personalises keys and values separately, and a state_dict key can only
be shared or kept whole, so :class:`SplitKV` replaces ``attn.kv`` by two Linears ``k`` and
``v`` whose concatenated output is exactly what the fused layer returns (timm reshapes it
into (2, heads, head_dim), keys first). Parameter names: ``...attn.q.*`` (query
embeddings, rho in the paper), ``...attn.kv.k.*``, ``...attn.kv.v.*``.

Stochastic depth as FedDP's ``pvt_v2_b0`` (``networks/FPN/pvtv2.py:288-290,512``): ``drop_path_rate``
spread ``linspace(0, rate, 8)`` over the 8 blocks, one rate per block on both residual branches
(timm's ``drop_path_rate`` gives exactly these rates). timm's ``DropPath`` draws from torch's global
generator; :class:`SeededDropPath` takes its place and draws from :attr:`SeededDropPath.generator`
(the site's training generator, set with the decoder's dropout), so runs repeat bit for bit.
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


class SeededDropPath(nn.Module):
    """Stochastic depth per sample: in training, a sample's branch is zeroed with probability ``rate``
    and kept ones scaled by 1/(1-rate) (timm's ``drop_path``); the mask comes from :attr:`generator`
    when set (a CPU generator; None: torch's global one)."""

    def __init__(self, rate: float) -> None:
        super().__init__()
        self.rate = float(rate)
        self.generator: torch.Generator | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.rate == 0.0:
            return x
        g = self.generator
        shape = (x.shape[0],) + (1,) * (x.ndim - 1)
        noise = torch.rand(shape, generator=g, device=g.device if g is not None else x.device)
        keep = (noise < 1.0 - self.rate).to(device=x.device, dtype=x.dtype)
        return x * keep / (1.0 - self.rate)

    def extra_repr(self) -> str:
        return f"rate={self.rate:.4f}"


class PVTEncoder(nn.Module):
    """Four-stage PVT-v2 feature pyramid (strides 4, 8, 16, 32), random init offline.

    ``weights``: optional local file with a timm PVT-v2 state_dict (ImageNet weights
    cannot be downloaded here); fused ``kv`` entries in it are split on load.
    """

    def __init__(self, name: str = "pvt_v2_b0", weights: str | None = None, drop_path_rate: float = 0.0) -> None:
        super().__init__()
        import timm
        from timm.layers import DropPath

        if not name.startswith("pvt_v2"):
            raise ValueError(f"model.encoder = {name!r}: FedST uses a PVT-v2 encoder (pvt_v2_b0 .. pvt_v2_b5)")
        if not 0.0 <= drop_path_rate < 1.0:
            raise ValueError(f"model.drop_path_rate = {drop_path_rate}: must lie in [0, 1)")
        self.backbone = timm.create_model(name, pretrained=False, num_classes=0, drop_path_rate=float(drop_path_rate))
        if weights:
            self._load(Path(weights))
        for module in self.backbone.modules():
            if hasattr(module, "kv") and isinstance(module.kv, nn.Linear):
                module.kv = SplitKV(module.kv)
            for name_ in ("drop_path1", "drop_path2"):
                if isinstance(getattr(module, name_, None), DropPath):
                    setattr(module, name_, SeededDropPath(getattr(module, name_).drop_prob))
        self.channels = [s["num_chs"] for s in self.backbone.feature_info]

    def drop_paths(self) -> list[SeededDropPath]:
        return [m for m in self.modules() if isinstance(m, SeededDropPath)]

    def set_generator(self, generator: torch.Generator | None) -> None:
        """Where the stochastic depth draws its masks (None: torch's global generator)."""
        for m in self.drop_paths():
            m.generator = generator

    def _load(self, path: Path) -> None:
        if not path.is_file():
            raise FileNotFoundError(f"{path}: encoder weights file not found (fedst model.encoder_weights)")
        from fedmedbench.weights.models import load_timm

        load_timm(self.backbone, path, "fedst model.encoder_weights")

    def forward(self, x: torch.Tensor, levels: int = 4) -> list[torch.Tensor]:
        """(B, 3, H, W) -> the first ``levels`` of the four (B, C_i, H/s_i, W/s_i) maps."""
        x = self.backbone.patch_embed(x)
        return self.resume([], x, levels)

    def resume(self, feats: list[torch.Tensor], x: torch.Tensor, levels: int = 4) -> list[torch.Tensor]:
        """``feats`` (the first levels of a pyramid) completed to ``levels`` from ``x``, the input of the next
        stage (the last map of ``feats``, or the patch embedding when ``feats`` is empty)."""
        feats = list(feats)
        for stage in self.backbone.stages[len(feats):levels]:
            x = stage(x)
            feats.append(x)
        return feats
