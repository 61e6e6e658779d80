"""Textual-guided channel selection (FedST Eq. 7-8) and the site indicators it uses.

``mode``:
* ``cs`` (FedST): xi_hat = sigmoid(FC(concat(GAP(F*), xi_k))); F' = F* + F* x xi_hat. The
  paper writes xi in R^{h x w} but calls the operation channel selection and builds it from
  globally average-pooled (per-channel) features: we produce one gate per channel,
  broadcast over the map.
* ``prompt`` (Table IV row 3, "prompt without the channel selection network"): the
  indicator enters as a learned per-channel offset, F' = F* + FC(xi_k), with no gating by
  the features. The paper does not define this row further; this is our reading.
* ``none``: identity.

The indicator xi_k is a buffer set per site (:meth:`ChannelSelection.set_indicator`):
it never trains and, with the selection network, stays on its site.
"""

from __future__ import annotations

import torch
from torch import nn

MODES = ("none", "prompt", "cs")


class ChannelSelection(nn.Module):
    def __init__(self, dim: int, indicator_dim: int, mode: str) -> None:
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"model.selection = {mode!r}: choose one of {list(MODES)}")
        self.mode = mode
        self.register_buffer("indicator", torch.zeros(indicator_dim))
        if mode == "cs":
            self.fc = nn.Linear(dim + indicator_dim, dim)
        elif mode == "prompt":
            self.fc = nn.Linear(indicator_dim, dim)

    def set_indicator(self, vector: torch.Tensor) -> None:
        if vector.shape != self.indicator.shape:
            raise ValueError(f"indicator has shape {tuple(vector.shape)}, the model expects {tuple(self.indicator.shape)}")
        self.indicator.copy_(vector.to(self.indicator))

    def forward(self, f: torch.Tensor) -> torch.Tensor:
        if self.mode == "none":
            return f
        b = f.shape[0]
        ind = self.indicator[None].expand(b, -1)
        if self.mode == "prompt":
            return f + self.fc(ind)[:, :, None, None]
        gate = torch.sigmoid(self.fc(torch.cat([f.mean(dim=(2, 3)), ind], dim=1)))
        return f + f * gate[:, :, None, None]
