"""The GPAF authors' small Swin for 28 px images: their FedAvg network and their centralized row's.

sanywright13/GPAFflower at c2505a7, baselines/fedprox/fedprox/models.py:53-89 (``get_model('swim')``, built
for every strategy but GPAF, main.py:244-257) calls Microsoft's ``SwinTransformer`` (the Swin-Transformer-fed
submodule at c317ebc = microsoft/Swin-Transformer f82860b models/swin_transformer.py) with img 28, patch 2,
1 channel, 2 classes, embed 96, depths [4, 6], heads [12, 24], window 7, MLP ratio 4, qkv bias, drop 0.1,
drop path 0.2, no absolute position embedding, patch norm, no pretrained weights: 3,224,930 parameters.

Built here on timm's ``SwinTransformer`` (the same parameter shapes; names differ in two places: Microsoft's
``layers.0.downsample`` is timm's ``layers.1.downsample``, ``head`` is ``head.fc``). Microsoft's ``drop_rate``
is four dropouts: after the patch embedding (``pos_drop``, swin_transformer.py:546, 597), after the attention
projection and twice in the MLP; timm's ``proj_drop_rate`` covers the last three and timm has no dropout after
the patch embedding, so the class below adds ``pos_drop`` (p 0.1) there; timm's ``drop_rate`` (its head
dropout, which Microsoft's class does not have) stays 0.

Dropout and drop path draw from torch's global generator; ``set_dropout_generator`` makes each training forward
draw them from a generator the engine seeds per (run seed, round, client), so a run repeats bit for bit in any
process and on resume.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from fedmedbench.models.registry import register_model

#: the authors' arguments (models.py:57-71 at c2505a7), in timm's names
SWIN_ARGS = dict(patch_size=2, embed_dim=96, depths=(4, 6), num_heads=(12, 24), window_size=7, mlp_ratio=4.0,
                 qkv_bias=True, drop_rate=0.0, proj_drop_rate=0.1, attn_drop_rate=0.0, drop_path_rate=0.2)
#: Microsoft's dropout after the patch embedding (``drop_rate``)
POS_DROP = 0.1
#: the demo's narrow variant: embed 24, two blocks per stage, heads 3 and 6 (head dim 8, as the authors')
TINY_ARGS = {**SWIN_ARGS, "embed_dim": 24, "depths": (2, 2), "num_heads": (3, 6)}


@functools.cache
def swin_class() -> type:
    """The class, made on first use (timm is imported only by a run that builds it)."""
    from timm.models.swin_transformer import SwinTransformer

    class AuthorsSwin(SwinTransformer):
        """timm's Swin with Microsoft's dropout after the patch embedding; ``embed`` = the pooled features."""

        def __init__(self, in_channels: int, num_classes: int, image_size: int, args: dict = SWIN_ARGS):
            super().__init__(img_size=image_size, in_chans=in_channels, num_classes=num_classes, **args)
            self.pos_drop = nn.Dropout(POS_DROP)
            self.dropout_generator: torch.Generator | None = None

        def set_dropout_generator(self, generator: torch.Generator | None) -> None:
            """Where training forwards draw their dropout and drop-path masks (None: torch's global generator)."""
            self.dropout_generator = generator

        def forward_features(self, x: torch.Tensor) -> torch.Tensor:
            x = self.pos_drop(self.patch_embed(x))
            return self.norm(self.layers(x))

        def embed(self, x: torch.Tensor) -> torch.Tensor:
            """The 192-d pooled features the head reads (t-SNE)."""
            return self.forward_head(self.forward_features(x), pre_logits=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if not self.training or self.dropout_generator is None:
                return super().forward(x)
            seed = int(torch.randint(0, 2**62, (1,), generator=self.dropout_generator))
            devices = [x.device.index if x.device.index is not None else torch.cuda.current_device()] if x.is_cuda else []
            with torch.random.fork_rng(devices=devices):
                torch.random.default_generator.manual_seed(seed)
                if devices:
                    torch.cuda.manual_seed(seed)
                return super().forward(x)

    return AuthorsSwin


@register_model("swin_gpaf")
def swin_gpaf(in_channels: int, num_classes: int, image_size: int) -> nn.Module:
    return swin_class()(in_channels, num_classes, image_size)


@register_model("swin_gpaf_tiny")
def swin_gpaf_tiny(in_channels: int, num_classes: int, image_size: int) -> nn.Module:
    """The same class, embed 24, depths [2, 2], heads [3, 6] (the demo's, for a quick run on a CPU)."""
    return swin_class()(in_channels, num_classes, image_size, TINY_ARGS)
