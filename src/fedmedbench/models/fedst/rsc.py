"""RSC temporal module (FedST Eq. 3-4): windowed cross-attention from the current frame
to multi-scale pooled context of the current and previous frames.

Frame j of the clip (oldest .. current) has a pooling size p_j and a receptive field r_j
(paper: p = {7, 4, 2, 1}, r = {49, 20, 6, 7}, window s = 7: distant frames are seen
coarsely over a large area, the current frame at full resolution within its window).

* Eq. 3: frame j's feature map is cut into non-overlapping p_j x p_j patches and every
  channel of a patch (p_j^2 values) is mapped to one value by a Linear(p_j^2, 1) shared
  by all channels: c x p_j^2 -> c without mixing channels, p_j^2 + 1 parameters per frame
  (as CFFM, where r/p/s come from: ``pool_layers_clips`` in
  ``mmseg/models/decode_heads/cffm_module/cffm_transformer.py:687-689``, initialised to the
  patch mean, weight 1/p_j^2 and bias 0).
* For every s x s window of the current frame, the context tokens of frame j are the
  ceil(r_j / p_j)^2 pooled tokens whose cells lie in the r_j x r_j square centred on the
  window (tokens outside the map are masked out). The paper does not say how the square is
  placed; centring it on the window is our choice.
* Eq. 4: multi-head cross-attention, queries from the window, keys and values from the
  concatenated context, plus a learned position bias B (one value per head, query position
  in the window and context slot), plus the residual F_ts. Scores are scaled by the head
  dimension (standard multi-head attention; Eq. 4 writes sqrt(c) for one head).

``block`` (what surrounds Eq. 4): ``cffm`` (default) is CFFM's transformer block
(``cffm_transformer.py:629-830``, ``CffmTransformerBlock3d3``): a LayerNorm on every frame's map
before the pooling and the attention (``:716``), the residual on the un-normalised current map
(``:823``), then x + MLP(LayerNorm(x)) with a GELU MLP of ratio 4 (``:699-701,824``; ``Mlp``
``:10-27``). ``eq4`` is Eq. 4 alone: the attention and its residual. Which feature map it enhances,
and with how many heads, is :class:`~.net.FedSTNet`'s configuration (default: the encoder's 1/8
map, 8 heads as CFFM's head).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

#: ``model.temporal_block`` choices (the module docstring)
BLOCKS = ("cffm", "eq4")
#: CFFM's MLP width per channel (``cffm_head.py:78``, ``mlp_ratio=4.``)
MLP_RATIO = 4


class RSCTemporal(nn.Module):
    def __init__(self, dim: int, heads: int, window: int, pools: list[int], fields: list[int], block: str = "cffm") -> None:
        super().__init__()
        if block not in BLOCKS:
            raise ValueError(f"model.temporal_block = {block!r}: choose one of {list(BLOCKS)}")
        if len(pools) != len(fields):
            raise ValueError(f"temporal.pools ({len(pools)}) and temporal.fields ({len(fields)}) need one entry per frame")
        if dim % heads:
            raise ValueError(f"temporal.heads = {heads} must divide the feature channels ({dim})")
        self.dim, self.heads, self.window = dim, heads, window
        self.pools, self.fields = list(pools), list(fields)
        self.pool_fc = nn.ModuleList(nn.Linear(p * p, 1) for p in pools)
        for fc, p in zip(self.pool_fc, pools, strict=True):
            nn.init.constant_(fc.weight, 1.0 / (p * p))
            nn.init.zeros_(fc.bias)
        self.sizes = [math.ceil(r / p) for r, p in zip(fields, pools, strict=True)]
        n_ctx = sum(k * k for k in self.sizes)
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)
        self.bias = nn.Parameter(torch.zeros(heads, window * window, n_ctx))
        nn.init.trunc_normal_(self.bias, std=0.02)
        self.block = block
        if block == "cffm":
            self.norm1 = nn.LayerNorm(dim)
            self.norm2 = nn.LayerNorm(dim)
            self.mlp = nn.Sequential(nn.Linear(dim, MLP_RATIO * dim), nn.GELU(), nn.Linear(MLP_RATIO * dim, dim))

    @property
    def num_frames(self) -> int:
        return len(self.pools)

    def _pooled(self, f: torch.Tensor, j: int) -> torch.Tensor:
        """Eq. 3: (B, C, h, w) -> (B, ceil(h/p), ceil(w/p), C), one Linear(p^2, 1) per channel patch."""
        p = self.pools[j]
        b, c, h, w = f.shape
        f = F.pad(f, (0, (-w) % p, 0, (-h) % p))
        hp, wp = f.shape[2] // p, f.shape[3] // p
        patches = f.reshape(b, c, hp, p, wp, p).permute(0, 2, 4, 1, 3, 5).reshape(b, hp, wp, c, p * p)
        return self.pool_fc[j](patches).squeeze(-1)

    def _context(self, pooled: torch.Tensor, j: int, n_wh: int, n_ww: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Context tokens of every window from frame j: (B, nW, k*k, C) and validity (nW, k*k)."""
        p, k, s = self.pools[j], self.sizes[j], self.window
        b, hp, wp, c = pooled.shape
        dev = pooled.device

        def index(n_win: int, limit: int) -> tuple[torch.Tensor, torch.Tensor]:
            centre = (torch.arange(n_win, device=dev) * s + s / 2) / p
            start = torch.floor(centre - k / 2).long()
            idx = start[:, None] + torch.arange(k, device=dev)[None]
            return idx.clamp(0, limit - 1), (idx >= 0) & (idx < limit)

        ri, rv = index(n_wh, hp)
        ci, cv = index(n_ww, wp)
        tok = pooled[:, ri[:, :, None, None], ci[None, None, :, :]]  # (B, nWh, k, nWw, k, C)
        tok = tok.permute(0, 1, 3, 2, 4, 5).reshape(b, n_wh * n_ww, k * k, c)
        valid = (rv[:, None, :, None] & cv[None, :, None, :]).reshape(n_wh * n_ww, k * k)
        return tok, valid

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        """(B, T, C, h, w) clip features, oldest .. current -> enhanced current map (B, C, h, w)."""
        b, t, c, h, w = feats.shape
        if t != self.num_frames:
            raise ValueError(f"RSC expects {self.num_frames} frames per clip (temporal.pools), got {t}")
        s = self.window
        cur = feats[:, -1]
        if self.block == "cffm":  # every frame normalised before pooling and attention; the residual is not
            feats = self.norm1(feats.transpose(2, -1)).transpose(2, -1)
        padded = F.pad(feats[:, -1], (0, (-w) % s, 0, (-h) % s))
        hh, ww = padded.shape[2:]
        n_wh, n_ww = hh // s, ww // s
        q_tok = padded.reshape(b, c, n_wh, s, n_ww, s).permute(0, 2, 4, 3, 5, 1).reshape(b, n_wh * n_ww, s * s, c)
        ctx, valid = zip(*(self._context(self._pooled(feats[:, j], j), j, n_wh, n_ww) for j in range(t)), strict=True)
        ctx_t = torch.cat(ctx, dim=2)
        valid_t = torch.cat(valid, dim=1)
        hd = c // self.heads
        nw = n_wh * n_ww
        q = self.q(q_tok).reshape(b, nw, s * s, self.heads, hd).transpose(2, 3)
        k = self.k(ctx_t).reshape(b, nw, -1, self.heads, hd).transpose(2, 3)
        v = self.v(ctx_t).reshape(b, nw, -1, self.heads, hd).transpose(2, 3)
        attn = (q @ k.transpose(-2, -1)) / math.sqrt(hd) + self.bias[None, None]
        attn = attn.masked_fill(~valid_t[None, :, None, None, :], float("-inf")).softmax(dim=-1)
        out = self.proj((attn @ v).transpose(2, 3).reshape(b, nw, s * s, c))
        out = out.reshape(b, n_wh, n_ww, s, s, c).permute(0, 5, 1, 3, 2, 4).reshape(b, c, hh, ww)
        out = out[:, :, :h, :w] + cur  # Eq. 4
        if self.block == "cffm":
            tokens = out.permute(0, 2, 3, 1)
            out = (tokens + self.mlp(self.norm2(tokens))).permute(0, 3, 1, 2)
        return out
