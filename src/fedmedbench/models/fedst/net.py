"""FedSTNet = PVT-v2 encoder -> (RSC temporal module) -> (channel selection) -> decoder.

One network serves FedST and every baseline of the study, so that methods differ only in
what they train, share and aggregate (the paper trains all methods with the same
backbone and schedule). ``temporal`` off (Table IV rows without TS, and the baselines)
encodes the current frame only; ``selection`` picks Eq. 7-8 (``cs``), the prompt-only
ablation (``prompt``) or nothing.

Module names matter: methods select shared / personalised parameters by them
(``encoder.`` / ``rsc.`` / ``cs.`` / ``decoder.``; see ``fl/methods/_seg_shared.py``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from fedmedbench.models.fedst.decoder import Decoder
from fedmedbench.models.fedst.encoder import PVTEncoder
from fedmedbench.models.fedst.rsc import RSCTemporal
from fedmedbench.models.fedst.select import ChannelSelection

_MEAN = (0.485, 0.456, 0.406)
_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class ModelConfig:
    encoder: str = "pvt_v2_b0"
    encoder_weights: str | None = None
    num_classes: int = 4
    temporal: bool = True
    heads: int = 1
    window: int = 7
    pools: list[int] = field(default_factory=lambda: [7, 4, 2, 1])
    fields: list[int] = field(default_factory=lambda: [49, 20, 6, 7])
    selection: str = "cs"
    indicator_dim: int = 512
    decoder_dim: int = 64
    decoder_heads: int = 1

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        known = set(cls.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"fedst model config has unknown key(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def num_frames(self) -> int:
        return len(self.pools)


class FedSTNet(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = PVTEncoder(cfg.encoder, cfg.encoder_weights)
        deep = self.encoder.channels[-1]
        self.rsc = RSCTemporal(deep, cfg.heads, cfg.window, cfg.pools, cfg.fields) if cfg.temporal else None
        self.cs = ChannelSelection(deep, cfg.indicator_dim, cfg.selection) if cfg.selection != "none" else None
        self.decoder = Decoder(self.encoder.channels, cfg.decoder_dim, cfg.decoder_heads, cfg.num_classes)
        self.register_buffer("mean", torch.tensor(_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(_STD).view(1, 3, 1, 1), persistent=False)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.uint8:
            x = x.float() / 255.0
        return (x - self.mean) / self.std

    def set_indicator(self, vector: torch.Tensor) -> None:
        if self.cs is not None:
            self.cs.set_indicator(vector)

    def features(self, frames: torch.Tensor) -> list[torch.Tensor]:
        """Encoder pyramid of single frames (B, 3, H, W) (SERQ's F: spatial only)."""
        return self.encoder(self.normalize(frames))

    def forward(self, clip: torch.Tensor, temporal: bool = True) -> torch.Tensor:
        """(B, T, 3, H, W) clip, oldest .. current frame -> logits (B, classes, H, W) of the current frame.

        ``temporal=False`` bypasses the RSC module (F* = F_ts): SERQ and the synthetic
        pre-training work on still synthetic frames, which carry no motion (paper Sec. III-C).
        """
        return self.decoder(self.decoder_inputs(clip, temporal), tuple(clip.shape[-2:]))

    def head_input(self, clip: torch.Tensor, temporal: bool = True) -> torch.Tensor:
        """What the classifier ``decoder.head`` sees (B, decoder_dim, H/4, W/4): the output of
        everything but the head, the representation a base/head split (FedAS) works on."""
        return self.decoder.fused(self.decoder_inputs(clip, temporal))

    def decoder_inputs(self, clip: torch.Tensor, temporal: bool = True) -> list[torch.Tensor]:
        """The four maps the decoder fuses: the current frame's pyramid, its deepest level
        through the temporal module and channel selection when configured."""
        if clip.ndim != 5:
            raise ValueError(f"expected a clip tensor (B, T, 3, H, W), got shape {tuple(clip.shape)}")
        b, t = clip.shape[:2]
        if self.rsc is not None and temporal:
            if t != self.cfg.num_frames:
                raise ValueError(f"the temporal module is configured for {self.cfg.num_frames} frames, the clip has {t}")
            pyr = self.features(clip.reshape(b * t, *clip.shape[2:]))
            cur = [f.reshape(b, t, *f.shape[1:])[:, -1] for f in pyr]
            deep = pyr[-1].reshape(b, t, *pyr[-1].shape[1:])
            cur[-1] = self.rsc(deep)
        else:
            cur = self.features(clip[:, -1])
        if self.cs is not None:
            cur[-1] = self.cs(cur[-1])
        return cur


def build_fedst_net(cfg: dict[str, Any] | ModelConfig) -> FedSTNet:
    return FedSTNet(cfg if isinstance(cfg, ModelConfig) else ModelConfig.from_dict(cfg))
