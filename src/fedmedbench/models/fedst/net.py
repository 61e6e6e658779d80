"""FedSTNet = PVT-v2 encoder -> RSC -> channel selection -> decoder (FedST Eq. 3-8).

One network serves FedST and every baseline of the study, so that methods differ only in
what they train, share and aggregate (the paper trains all methods with the same
backbone and schedule). ``decoder``: ``fpn`` (default) is FedDP's public network for
PVT-v2-b0 (``networks/FPN/model.py:20-62``, ``BuildFPN(num_classes, 'pvtb0')``: the encoder,
an FPN decoder of segmentation_models_pytorch's shape and a 128-channel head, 5,166,180
parameters for 4 classes); ``light`` a small attention decoder (:mod:`.decoder`). The encoder's
stochastic depth is FedDP's (``drop_path_rate``, :mod:`.encoder`).

``temporal`` off (Table IV rows without TS, and the baselines) encodes the current frame
only. ``temporal_at``: where RSC works.

* ``encoder`` (default; the paper's order, Eq. 7-8 and "the enhanced features F' are fed into
  the decoder"): every frame of the clip through the encoder; RSC enhances the current frame's
  map at pyramid level ``temporal_level`` (default 1: 1/8, 64 channels for pvt_v2_b0, CFFM's
  working scale, where r = {49, 20, 6, 7} fit) from all frames' maps at that level (F*); channel
  selection reads F* (Eq. 7) and gates it (Eq. 8, F'); the decoder reads F' at that level and the
  current frame's own maps at the others. History frames only run the stages up to that level.
* ``decoder`` (CFFM's head, ``mmseg/models/decode_heads/cffm_head.py:99-158``): every frame
  through encoder and decoder; the decoder's fused map (1/4) is resized to half its size (1/8) and
  RSC enhances the current frame's from all frames' maps; channel selection reads RSC's output
  (Eq. 7 on F*); the head reads the gated 1/8 map. ``temporal_level`` is not used.

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
from fedmedbench.models.fedst.rsc import BLOCKS, RSCTemporal
from fedmedbench.models.fedst.select import ChannelSelection

_MEAN = (0.485, 0.456, 0.406)
_STD = (0.229, 0.224, 0.225)
#: ``model.decoder`` choices and ``model.temporal_at`` choices
DECODERS = ("fpn", "light")
TEMPORAL_AT = ("encoder", "decoder")


@dataclass(frozen=True)
class ModelConfig:
    encoder: str = "pvt_v2_b0"
    encoder_weights: str | None = None
    drop_path_rate: float = 0.1
    num_classes: int = 4
    temporal: bool = True
    temporal_at: str = "encoder"
    temporal_level: int = 1
    temporal_block: str = "cffm"
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
        for key, allowed in (("decoder", DECODERS), ("temporal_at", TEMPORAL_AT), ("temporal_block", BLOCKS)):
            if getattr(cfg, key) not in allowed:
                raise ValueError(f"fedst model.{key} = {getattr(cfg, key)!r}: choose one of {list(allowed)}")
        if cfg.temporal_level not in range(4):
            raise ValueError(f"fedst model.temporal_level = {cfg.temporal_level!r}: an encoder level 0 (1/4) .. 3 (1/32)")
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
        self.encoder = PVTEncoder(cfg.encoder, cfg.encoder_weights, cfg.drop_path_rate)
        if cfg.decoder == "fpn":
            self.decoder = FPNDecoder(self.encoder.channels, cfg.num_classes)
        else:
            self.decoder = Decoder(self.encoder.channels, cfg.decoder_dim, cfg.decoder_heads, cfg.num_classes)
        #: the map RSC enhances and channel selection gates (F*): an encoder level, or the decoder's map
        self.width = self.decoder.dim if cfg.temporal_at == "decoder" else self.encoder.channels[cfg.temporal_level]
        self.rsc = (RSCTemporal(self.width, cfg.heads, cfg.window, cfg.pools, cfg.fields, cfg.temporal_block)
                    if cfg.temporal else None)
        self.cs = ChannelSelection(self.width, cfg.indicator_dim, cfg.selection) if cfg.selection != "none" else None
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
        """Where the decoder's channel dropout and the encoder's stochastic depth draw their masks
        (None: torch's global generator)."""
        if hasattr(self.decoder.dropout, "generator"):
            self.decoder.dropout.generator = generator
        self.encoder.set_generator(generator)

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

    def _select(self, f: torch.Tensor) -> torch.Tensor:
        """Eq. 7-8 on F* (identity without a selection network)."""
        return f if self.cs is None else self.cs(f)

    def head_input(self, clip: torch.Tensor, temporal: bool = True) -> torch.Tensor:
        """What the classifier ``decoder.head`` sees: the output of everything but the head, the
        representation a base/head split (FedAS) works on: (B, C, H/4, W/4); with RSC in the
        decoder (B, C, H/8, W/8), the current frame's map enhanced by RSC and gated by channel
        selection (``temporal=False``: not enhanced, F* = F_ts, at the same scale)."""
        if self.cfg.temporal_at == "decoder":
            return self.decoder.dropout(self._select(self.temporal_map(clip, temporal)))
        return self.decoder.fused(self.decoder_inputs(clip, temporal))

    def temporal_map(self, clip: torch.Tensor, temporal: bool = True) -> torch.Tensor:
        """``temporal_at: decoder``: F*, the decoder's merged map of the current frame halved (1/8) and
        enhanced by RSC from every frame's; without RSC the merged map itself (1/4)."""
        if self.rsc is None:
            self._temporal(clip, False)
            return self.decoder.merged(self.features(clip[:, -1]))
        use = self._temporal(clip, temporal)
        b, t = clip.shape[:2]
        frames = clip if use else clip[:, -1:]
        merged = self.decoder.merged(self.features(frames.reshape(-1, *clip.shape[2:])))
        h, w = merged.shape[-2:]
        half = F.interpolate(merged, size=(h // 2, w // 2), mode="bilinear", align_corners=False)
        return self.rsc(half.reshape(b, t, *half.shape[1:])) if use else half

    def decoder_inputs(self, clip: torch.Tensor, temporal: bool = True) -> list[torch.Tensor]:
        """The current frame's encoder pyramid as the decoder reads it. With RSC at the encoder, level
        ``temporal_level`` is F' = CS(RSC(that level of every frame)) (Eq. 4, 7-8); the other levels are
        the current frame's own. With RSC in the decoder, the current frame's pyramid as encoded."""
        if self.cfg.temporal_at == "decoder":
            self._temporal(clip, False)
            return self.features(clip[:, -1])
        level = self.cfg.temporal_level
        if self._temporal(clip, temporal):
            b, t = clip.shape[:2]
            low = self.encoder(self.normalize(clip.reshape(b * t, *clip.shape[2:])), levels=level + 1)
            clip_maps = [f.reshape(b, t, *f.shape[1:]) for f in low]
            cur = self.encoder.resume([f[:, -1] for f in clip_maps], clip_maps[-1][:, -1])
            cur[level] = self.rsc(clip_maps[level])  # F*
        else:
            self._temporal(clip, False)
            cur = self.features(clip[:, -1])
        cur[level] = self._select(cur[level])  # F'
        return cur


def dropout_generator(source: torch.Generator) -> torch.Generator:
    """The decoder's dropout generator for a training run drawing from ``source``: seeded from
    ``source``'s seed, so it leaves ``source``'s own draws (clips, augmentation) as they were."""
    return torch.Generator().manual_seed((source.initial_seed() ^ 0xD809) % 2**63)


def build_fedst_net(cfg: dict[str, Any] | ModelConfig) -> FedSTNet:
    return FedSTNet(cfg if isinstance(cfg, ModelConfig) else ModelConfig.from_dict(cfg))
