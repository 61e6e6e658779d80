"""FPN decoder and 128-channel head of FedDP's segmentation network (``BuildFPN``).

FedDP (``networks/FPN/model.py:20-62``) puts segmentation_models_pytorch's ``FPNDecoder``
(0.3.x, default arguments: 256 pyramid channels, 128 segmentation channels, dropout 0.2,
merge by sum) on the four PVT-v2 levels and a 1x1 convolution from 128 channels to the
classes. This module has the same layers, names and arithmetic (written here, no dependency):

* top-down pyramid: ``p5`` = 1x1 conv of the deepest level; ``p4``, ``p3``, ``p2`` = the
  level above upsampled x2 (nearest) + a 1x1 ``skip_conv`` of the encoder level;
* ``seg_blocks``: from each of p5, p4, p3, p2, 3, 2, 1, 0 times (3x3 conv without bias,
  GroupNorm(32), ReLU, then x2 bilinear upsampling with ``align_corners=True``; the block
  without upsampling has one conv), all at 1/4 of the input;
* the four maps summed (``merged``), channel dropout (``Dropout2d``), the ``head``.

For 4 classes on PVT-v2-b0 (levels 32, 64, 160, 256) the decoder has 1,755,904 parameters and
the head 516. FedDP's head applies a sigmoid (its loss is Dice on probabilities); the study's
loss is CE + Dice on logits, so ``head`` returns logits.

The channel dropout draws its mask from :attr:`generator` when one is set (a site's training
generator, so runs repeat bit for bit in any process), else from torch's global generator.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PYRAMID_CHANNELS = 256
SEGMENTATION_CHANNELS = 128
DROPOUT = 0.2


class Conv3x3GNReLU(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, upsample: bool) -> None:
        super().__init__()
        self.upsample = upsample
        self.block = nn.Sequential(nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
                                   nn.GroupNorm(32, out_channels), nn.ReLU(inplace=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block(x)
        return F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True) if self.upsample else x


class FPNBlock(nn.Module):
    def __init__(self, pyramid_channels: int, skip_channels: int) -> None:
        super().__init__()
        self.skip_conv = nn.Conv2d(skip_channels, pyramid_channels, 1)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x, scale_factor=2, mode="nearest") + self.skip_conv(skip)


class SegmentationBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, n_upsamples: int) -> None:
        super().__init__()
        blocks = [Conv3x3GNReLU(in_channels, out_channels, upsample=bool(n_upsamples))]
        blocks += [Conv3x3GNReLU(out_channels, out_channels, upsample=True) for _ in range(1, n_upsamples)]
        self.block = nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class ChannelDropout(nn.Module):
    """``Dropout2d``: whole channels zeroed with probability p in training, the rest scaled by
    1/(1-p); the mask comes from :attr:`generator` when set."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = float(p)
        self.generator: torch.Generator | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        g = self.generator
        shape = (*x.shape[:2], 1, 1)
        noise = torch.rand(shape, generator=g, device=g.device if g is not None else x.device)
        keep = (noise >= self.p).to(device=x.device, dtype=x.dtype)
        return x * keep / (1.0 - self.p)


class FPNDecoder(nn.Module):
    """FedDP's ``FPNDecoder(chs)`` + ``_head(num_classes, 128)``; ``channels``: encoder levels, finest first."""

    def __init__(self, channels: list[int], num_classes: int, dropout: float = DROPOUT) -> None:
        super().__init__()
        if len(channels) != 4:
            raise ValueError(f"the FPN decoder needs four encoder levels, got {len(channels)}")
        c2, c3, c4, c5 = channels
        self.p5 = nn.Conv2d(c5, PYRAMID_CHANNELS, 1)
        self.p4 = FPNBlock(PYRAMID_CHANNELS, c4)
        self.p3 = FPNBlock(PYRAMID_CHANNELS, c3)
        self.p2 = FPNBlock(PYRAMID_CHANNELS, c2)
        self.seg_blocks = nn.ModuleList(SegmentationBlock(PYRAMID_CHANNELS, SEGMENTATION_CHANNELS, n) for n in (3, 2, 1, 0))
        self.dropout = ChannelDropout(dropout)
        self.head = nn.Conv2d(SEGMENTATION_CHANNELS, num_classes, 1)
        self.dim = SEGMENTATION_CHANNELS

    def pyramid(self, feats: list[torch.Tensor]) -> list[torch.Tensor]:
        """Top-down maps p5, p4, p3, p2 (strides 32, 16, 8, 4)."""
        c2, c3, c4, c5 = feats
        if c2.shape[-2] != 8 * c5.shape[-2] or c2.shape[-1] != 8 * c5.shape[-1]:
            raise ValueError(f"the FPN decoder needs input sides divisible by 32 (fedst data.input_size); "
                             f"encoder levels {tuple(c2.shape[-2:])} .. {tuple(c5.shape[-2:])}")
        p5 = self.p5(c5)
        p4 = self.p4(p5, c4)
        p3 = self.p3(p4, c3)
        return [p5, p4, p3, self.p2(p3, c2)]

    def merged(self, feats: list[torch.Tensor]) -> torch.Tensor:
        """The sum of the four segmentation blocks (B, 128, H/4, W/4), before dropout."""
        return sum(block(p) for block, p in zip(self.seg_blocks, self.pyramid(feats), strict=True))

    def fused(self, feats: list[torch.Tensor]) -> torch.Tensor:
        """What ``head`` sees: the merged map after channel dropout."""
        return self.dropout(self.merged(feats))

    def forward(self, feats: list[torch.Tensor], out_size: tuple[int, int]) -> torch.Tensor:
        return F.interpolate(self.head(self.fused(feats)), size=out_size, mode="bilinear", align_corners=False)
