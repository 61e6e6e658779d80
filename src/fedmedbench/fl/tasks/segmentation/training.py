"""The local training loop every method of the FedST study uses: CE + lambda1 Dice (Eq. 9),
AdamW, Adam or SGD, rotation/scale augmentation drawn on the CPU generator.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from fedmedbench.fl.api.method import TrainConfig
from fedmedbench.fl.tasks.segmentation.clips import ClipSet
from fedmedbench.fl.training import on_device


def dice_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Soft multi-class Dice loss (mean over classes present in the batch or predicted)."""
    prob = logits.softmax(dim=1)
    onehot = F.one_hot(target, logits.shape[1]).permute(0, 3, 1, 2).float()
    inter = (prob * onehot).sum(dim=(0, 2, 3))
    denom = prob.sum(dim=(0, 2, 3)) + onehot.sum(dim=(0, 2, 3))
    return 1.0 - ((2 * inter + 1e-5) / (denom + 1e-5)).mean()


def seg_loss(logits: torch.Tensor, target: torch.Tensor, dice_weight: float) -> torch.Tensor:
    """Eq. 9: L_CE + lambda1 * L_Dice."""
    return F.cross_entropy(logits, target) + dice_weight * dice_loss(logits, target)


def augment(x: torch.Tensor, y: torch.Tensor, g: torch.Generator, degrees: float, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Random rotation and scale (the paper's augmentation), the same for every frame of a clip."""
    return rotate_scale(x, y, *draw_rotate_scale(x.shape[0], g, degrees, scale))


def draw_rotate_scale(b: int, g: torch.Generator, degrees: float, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`augment`'s draws for a batch of ``b`` clips (angles, then scales; on the CPU generator wherever the
    clips are): a loop may draw them before it has the batch."""
    ang = (torch.rand(b, generator=g) * 2 - 1) * math.radians(degrees)
    sc = 1 + (torch.rand(b, generator=g) * 2 - 1) * scale
    return ang, sc


def rotate_scale(x: torch.Tensor, y: torch.Tensor, ang: torch.Tensor, sc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Clips (B, T, C, H, W) and masks (B, H, W) rotated by ``ang`` and scaled by ``sc`` (one each a clip)."""
    b, t, c, h, w = x.shape
    cos, sin = torch.cos(ang) / sc, torch.sin(ang) / sc
    theta = torch.stack([torch.stack([cos, -sin, torch.zeros(b)], 1), torch.stack([sin, cos, torch.zeros(b)], 1)], 1)
    grid = F.affine_grid(on_device(theta, x.device), [b, c, h, w], align_corners=False)
    xf = x.float().reshape(b, t * c, h, w)
    xa = F.grid_sample(xf, grid, mode="bilinear", align_corners=False).reshape(b, t, c, h, w)
    ya = F.grid_sample(y[:, None].float(), grid, mode="nearest", align_corners=False)[:, 0].long()
    return xa.round().clamp(0, 255).to(torch.uint8), ya


def make_optimizer(params: list[torch.nn.Parameter], train: TrainConfig, lr: float) -> torch.optim.Optimizer:
    if train.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=train.weight_decay)
    if train.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=train.weight_decay)
    if train.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=train.momentum, weight_decay=train.weight_decay)
    raise ValueError(f"fedst train.optimizer = {train.optimizer!r}: choose adamw, adam or sgd")


def train_steps(
    model: torch.nn.Module,
    data: ClipSet,
    steps: int,
    train: TrainConfig,
    lr: float,
    device: torch.device,
    generator: torch.Generator,
    loss_cfg: dict[str, Any],
    params: list[torch.nn.Parameter] | None = None,
    extra_loss: Callable[[torch.nn.Module, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    temporal: bool = True,
) -> float:
    """``steps`` optimisation steps on random batches of ``data``; returns the mean loss.

    ``params``: what is trained (default: every parameter); ``extra_loss(model, x, y,
    logits)`` adds a method's regulariser (FedLD's margin control, ...); ``temporal=False``
    bypasses the temporal module (still synthetic frames).
    """
    if len(data) == 0:
        raise ValueError(f"{data.source}: no training clips")
    model.train()
    params = [p for p in (params if params is not None else model.parameters()) if p.requires_grad]
    opt = make_optimizer(params, train, lr)
    bs = min(train.batch_size, len(data))
    ahead = max(bs, data.cache.workers)  # clips decoding ahead, of the steps still to come
    order: list[int] = []
    total = torch.zeros((), dtype=torch.float64, device=device)  # read once at the end: no host sync per step
    for step in range(steps):
        if len(order) < bs:
            order += torch.randperm(len(data), generator=generator).tolist()
        idx, order = order[:bs], order[bs:]
        x, y = data.batch(idx, ahead=order[:min(ahead, bs * (steps - step - 1))])
        x, y = on_device(x, device), on_device(y, device)  # augmented where the model runs; copied without waiting
        if loss_cfg.get("augment", True):
            x, y = augment(x, y, generator, float(loss_cfg.get("rotate_deg", 15)), float(loss_cfg.get("scale", 0.1)))
        logits = model(x) if temporal else model(x, temporal=False)
        loss = seg_loss(logits, y, float(loss_cfg.get("dice_weight", 0.3)))
        if extra_loss is not None:
            loss = loss + extra_loss(model, x, y, logits)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if train.grad_clip:
            torch.nn.utils.clip_grad_norm_(params, train.grad_clip)
        opt.step()
        total += loss.detach()  # float64, as the Python float sum it replaces: the same mean
    return float(total) / max(1, steps)
