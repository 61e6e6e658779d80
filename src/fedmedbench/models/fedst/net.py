"""FedSTNet = PVT-v2 encoder -> (channel selection) -> decoder, with the RSC temporal module.

One network serves FedST and every baseline of the study, so that methods differ only in
what they train, share and aggregate (the paper trains all methods with the same
backbone and schedule). ``decoder``: ``fpn`` (default) is FedDP's public network for
PVT-v2-b0 (``networks/FPN/model.py:20-62``, ``BuildFPN(num_classes, 'pvtb0')``: the encoder,
an FPN decoder of segmentation_models_pytorch's shape and a 128-channel head, 5,166,180
parameters for 4 classes); ``light`` a small attention decoder (:mod:`.decoder`).

``temporal`` off (Table IV rows without TS, and the baselines) encodes the current frame
only. ``temporal_at``: where RSC works. ``decoder`` (default, as CFFM's head,
``mmseg/models/decode_heads/cffm_head.py:99-158``): every frame of the clip goes through
encoder and decoder; the decoder's fused map (1/4) is resized to half its size (1/8) and
RSC enhances the current frame's from all frames' maps; the head reads the enhanced 1/8 map.
``encoder``: RSC on the encoder's deepest map (1/32) of the clip's frames, before channel
selection and decoder. ``selection`` picks Eq. 7-8 (``cs``), the prompt-only ablation
(``prompt``) or nothing; it gates the encoder's deepest map of every frame the decoder reads.

Module names matter: methods select shared / personalised parameters by them
(``encoder.`` / ``rsc.`` / ``cs.`` / ``decoder.``, classifier ``decoder.head.``; see
``fl/methods/_seg_shared.py``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fedmedbench.models.fedst.decoder import Decoder
from fedmedbench.models.fedst.encoder import PVTEncoder
from fedmedbench.models.fedst.fpn import FPNDecoder
from fedmedbench.models.fedst.rsc import RSCTemporal
from fedmedbench.models.fedst.select import ChannelSelection

_MEAN = (0.485, 0.456, 0.406)
_STD = (0.229, 0.224, 0.225)
#: ``model.decoder`` choices and ``model.temporal_at`` choices
DECODERS = ("fpn", "light")
TEMPORAL_AT = ("decoder", "encoder")


@dataclass(frozen=True)
class ModelConfig:
    encoder: str = "pvt_v2_b0"
    encoder_weights: str | None = None
    num_classes: int = 4
    temporal: bool = True
    temporal_at: str = "decoder"
    heads: int = 8
    window: int = 7
    pools: list[int] = field(default_factory=lambda: [7, 4, 2, 1])
    fields: list[int] = field(default_factory=lambda: [49, 20, 6, 7])
    selection: str = "cs"
    indicator_dim: int = 512
    decoder: str = "fpn"
    decoder_dim: int = 64
    decoder_heads: int = 1

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        known = set(cls.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"fedst model config has unknown key(s) {sorted(unknown)}; known: {sorted(known)}")
        cfg = cls(**d)
        for key, allowed in (("decoder", DECODERS), ("temporal_at", TEMPORAL_AT)):
            if getattr(cfg, key) not in allowed:
                raise ValueError(f"fedst model.{key} = {getattr(cfg, key)!r}: choose one of {list(allowed)}")
        return cfg

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
        if cfg.decoder == "fpn":
            self.decoder = FPNDecoder(self.encoder.channels, cfg.num_classes)
        else:
            self.decoder = Decoder(self.encoder.channels, cfg.decoder_dim, cfg.decoder_heads, cfg.num_classes)
        rsc_dim = self.decoder.dim if cfg.temporal_at == "decoder" else deep
        self.rsc = RSCTemporal(rsc_dim, cfg.heads, cfg.window, cfg.pools, cfg.fields) if cfg.temporal else None
        self.cs = ChannelSelection(deep, cfg.indicator_dim, cfg.selection) if cfg.selection != "none" else None
        self.register_buffer("mean", torch.tensor(_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(_STD).view(1, 3, 1, 1), persistent=False)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.uint8:
            x = x.float() / 255.0
        return (x - self.mean) / self.std

    def set_indicator(self, vector: torch.Tensor) -> None:
        if self.cs is not None:
            self.cs.set_indicator(vector)

    def set_generator(self, generator: torch.Generator | None) -> None:
        """Where the decoder's channel dropout draws its masks (None: torch's global generator)."""
        if hasattr(self.decoder.dropout, "generator"):
            self.decoder.dropout.generator = generator

    def features(self, frames: torch.Tensor) -> list[torch.Tensor]:
        """Encoder pyramid of single frames (B, 3, H, W) (SERQ's F: spatial only)."""
        return self.encoder(self.normalize(frames))

    def forward(self, clip: torch.Tensor, temporal: bool = True) -> torch.Tensor:
        """(B, T, 3, H, W) clip, oldest .. current frame -> logits (B, classes, H, W) of the current frame.

        ``temporal=False`` bypasses the RSC module (F* = F_ts): SERQ and the synthetic
        pre-training work on still synthetic frames, which carry no motion (paper Sec. III-C).
        """
        logits = self.decoder.head(self.head_input(clip, temporal))
        return F.interpolate(logits, size=tuple(clip.shape[-2:]), mode="bilinear", align_corners=False)

    def _temporal(self, clip: torch.Tensor, temporal: bool) -> bool:
        if clip.ndim != 5:
            raise ValueError(f"expected a clip tensor (B, T, 3, H, W), got shape {tuple(clip.shape)}")
        if self.rsc is None or not temporal:
            return False
        if clip.shape[1] != self.cfg.num_frames:
            raise ValueError(f"the temporal module is configured for {self.cfg.num_frames} frames, the clip has {clip.shape[1]}")
        return True

    def head_input(self, clip: torch.Tensor, temporal: bool = True) -> torch.Tensor:
        """What the classifier ``decoder.head`` sees: the output of everything but the head, the
        representation a base/head split (FedAS) works on: (B, C, H/4, W/4); with RSC in the
        decoder (B, C, H/8, W/8), the current frame's map enhanced by RSC (``temporal=False``:
        not enhanced, F* = F_ts, at the same scale)."""
        if self.cfg.temporal_at == "decoder" and self.rsc is not None:
            use = self._temporal(clip, temporal)
            b, t = clip.shape[:2]
            frames = clip if use else clip[:, -1:]
            merged = self.decoder.merged(self.decoder_inputs(frames.reshape(-1, 1, *clip.shape[2:]), temporal=False))
            h, w = merged.shape[-2:]
            half = F.interpolate(merged, size=(h // 2, w // 2), mode="bilinear", align_corners=False)
            return self.decoder.dropout(self.rsc(half.reshape(b, t, *half.shape[1:])) if use else half)
        return self.decoder.fused(self.decoder_inputs(clip, temporal))

    def decoder_inputs(self, clip: torch.Tensor, temporal: bool = True) -> list[torch.Tensor]:
        """The current frame's encoder pyramid as the decoder reads it: with RSC at the encoder,
        the deepest level through the temporal module; then channel selection when configured."""
        if self.cfg.temporal_at == "encoder" and self._temporal(clip, temporal):
            b, t = clip.shape[:2]
            pyr = self.features(clip.reshape(b * t, *clip.shape[2:]))
            cur = [f.reshape(b, t, *f.shape[1:])[:, -1] for f in pyr]
            deep = pyr[-1].reshape(b, t, *pyr[-1].shape[1:])
            cur[-1] = self.rsc(deep)
        else:
            self._temporal(clip, False)
            cur = self.features(clip[:, -1])
        if self.cs is not None:
            cur[-1] = self.cs(cur[-1])
        return cur


def dropout_generator(source: torch.Generator) -> torch.Generator:
    """The decoder's dropout generator for a training run drawing from ``source``: seeded from
    ``source``'s seed, so it leaves ``source``'s own draws (clips, augmentation) as they were."""
    return torch.Generator().manual_seed((source.initial_seed() ^ 0xD809) % 2**63)


def build_fedst_net(cfg: dict[str, Any] | ModelConfig) -> FedSTNet:
    return FedSTNet(cfg if isinstance(cfg, ModelConfig) else ModelConfig.from_dict(cfg))
