"""Light decoder (``model.decoder: light``): SegFormer-style fusion of the four encoder levels
plus one self-attention block on the deepest level (its ``attn.q`` is the "decoder query
embedding" of FedST's Table V), then a 1x1 classifier, upsampled to the input size. The
default is FedDP's FPN decoder (:mod:`.fpn`); this one has the same interface (``merged``,
``dropout``, ``fused``, ``head``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class DecoderAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(dim)
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        t = self.norm(x.flatten(2).transpose(1, 2))
        q, k, v = (m(t).reshape(b, h * w, self.heads, -1).transpose(1, 2) for m in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, h * w, c)
        return x + self.proj(out).transpose(1, 2).reshape(b, c, h, w)


class Decoder(nn.Module):
    def __init__(self, channels: list[int], dim: int, heads: int, num_classes: int) -> None:
        super().__init__()
        self.proj = nn.ModuleList(nn.Conv2d(c, dim, 1) for c in channels)
        self.attn = DecoderAttention(dim, heads)
        self.fuse = nn.Sequential(nn.Conv2d(dim * len(channels), dim, 1), nn.BatchNorm2d(dim), nn.ReLU(inplace=True))
        self.head = nn.Conv2d(dim, num_classes, 1)
        self.dropout = nn.Identity()
        self.dim = dim

    def fused(self, feats: list[torch.Tensor]) -> torch.Tensor:
        return self.merged(feats)

    def merged(self, feats: list[torch.Tensor]) -> torch.Tensor:
        """The classifier's input (B, dim, h0, w0) at the finest level's size (FedAS's representation)."""
        size = feats[0].shape[2:]
        levels = [p(f) for p, f in zip(self.proj, feats, strict=True)]
        levels[-1] = self.attn(levels[-1])
        up = [lv if lv.shape[2:] == size else F.interpolate(lv, size=size, mode="bilinear", align_corners=False) for lv in levels]
        return self.fuse(torch.cat(up, dim=1))

    def forward(self, feats: list[torch.Tensor], out_size: tuple[int, int]) -> torch.Tensor:
        return F.interpolate(self.head(self.fused(feats)), size=out_size, mode="bilinear", align_corners=False)
