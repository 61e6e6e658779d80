"""One local SGD step's vocabulary, shared by the one-client loop (``_sgd.local_loop``), the batched
round (``_together``) and the declared perturbations (``_perturb``): dicts of per-parameter tensors and their
arithmetic, gradients and SAM's ascent, the hooks by which a method shapes a step (:class:`StepHooks`) and a
client's checked mean loss."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from fedmedbench.fl.training import StepLosses

if TYPE_CHECKING:
    from fedmedbench.fl.api.method import ClientContext

Tensors = dict[str, torch.Tensor]


def trainable(model: nn.Module) -> Tensors:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


# Per-tensor arithmetic over a model's tensors goes through torch's multi-tensor (``_foreach``) ops:
# one launch on a GPU for all of them instead of one per tensor (ConvNeXtV2-nano has 160), with the
# same elementwise results bit for bit.


Operand = Tensors | float | torch.Tensor


def _each(op: Callable, a: Tensors, b: Operand) -> Tensors:
    """``op`` applied to every tensor of ``a`` and ``b``'s tensor of the same name (or the number ``b``)."""
    if not a:
        return {}
    return dict(zip(a, op(list(a.values()), [b[n] for n in a] if isinstance(b, dict) else b), strict=True))


def add(a: Tensors, b: Operand) -> Tensors:
    """a + b for every tensor of ``a``."""
    return _each(torch._foreach_add, a, b)


def sub(a: Tensors, b: Operand) -> Tensors:
    """a - b for every tensor of ``a``."""
    return _each(torch._foreach_sub, a, b)


def mul(a: Tensors, b: Operand) -> Tensors:
    """a * b for every tensor of ``a``."""
    return _each(torch._foreach_mul, a, b)


def div(a: Tensors, b: Operand) -> Tensors:
    """a / b for every tensor of ``a``, rounded as a true division on every device.

    CUDA's multi-tensor (and plain) division by a number multiplies by its reciprocal, one bit less exact than
    the CPU's and NumPy's quotient: arrays kept on a GPU would then drift away from arrays kept on the host
    (SCAFFOLD's (theta_g - theta_i) / (K lr), the servers' sums / N). A divisor held as a 0-dim tensor on the
    device is divided by, as on the CPU. On the CPU nothing changes.
    """
    if not a or isinstance(b, dict):
        return _each(torch._foreach_div, a, b)
    first = next(iter(a.values()))
    if first.device.type == "cpu":
        return _each(torch._foreach_div, a, b)
    if any(t.dtype != first.dtype or t.device != first.device for t in a.values()):
        return {n: t / _divisor(b, t) for n, t in a.items()}
    return _each(torch._foreach_div, a, _divisor(b, first))


def _divisor(b: float | torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``b`` as a 0-dim tensor of ``like``'s dtype on its device (its value rounded to that dtype, as a number
    divisor is on the CPU)."""
    return torch.as_tensor(b, dtype=like.dtype, device=like.device).detach().reshape(())


def neg(a: Tensors) -> Tensors:
    """-a for every tensor of ``a``."""
    return dict(zip(a, torch._foreach_neg(list(a.values())), strict=True)) if a else {}


def add_(a: Tensors, b: Operand) -> None:
    """a += b in place, for every tensor of ``a``."""
    if a:
        torch._foreach_add_(list(a.values()), [b[n] for n in a] if isinstance(b, dict) else b)


def flat_norm(tensors: Tensors) -> torch.Tensor:
    """||t|| over all tensors as one vector (per-tensor sums of squares added in order)."""
    ts = [t.float() for t in tensors.values()]
    return torch.sqrt(sum(sq.sum() for sq in torch._foreach_mul(ts, ts)))  # x * x is x ** 2 bit for bit


def grads_of(model: nn.Module) -> Tensors:
    """The parameters' gradients (not copies: the next backward starts from ``set_to_none``, so these
    tensors are never written again)."""
    return {n: p.grad.detach() for n, p in trainable(model).items() if p.grad is not None}


def sam_perturbation(grads: Tensors, rho: float) -> Tensors:
    """SAM's ascent step e = rho * g / ||g|| (epsilon 1e-7 as in the reference code)."""
    if not grads:
        return {}
    scale = rho / (flat_norm(grads) + 1e-7)
    return mul(grads, scale)


def gradient_at(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> Tensors:
    """Cross-entropy gradient at the current weights (used to build SAM perturbations)."""
    model.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(model(xb), yb).backward()
    return grads_of(model)


@dataclass
class StepHooks:
    """How one method shapes a local SGD step (all optional)."""

    #: (model, xb, yb) -> perturbation e added to the weights for the gradient, or None
    perturb: Callable[[nn.Module, torch.Tensor, torch.Tensor], Tensors | None] | None = None
    #: linear gradient correction d (constant over the round), added before clipping
    correction: Tensors | None = None
    #: weight of the cross-entropy term (FedWMSAM's alpha)
    loss_weight: float = 1.0
    #: added to train.weight_decay in the SGD optimizer
    extra_weight_decay: float = 0.0
    #: called after every optimizer step
    after_step: Callable[[], None] | None = None
    #: what the method's ``client_result`` needs from before the steps (SCAFFOLD's c and c_i, FedDyn's h_i)
    keep: dict[str, Any] = field(default_factory=dict)


def mean_loss(ctx: ClientContext, losses: StepLosses) -> float:
    """The client's mean step loss, checked finite unless ``train.on_nonfinite: continue``."""
    return losses.mean(ctx.rnd, check=ctx.train.on_nonfinite != "continue",
                       hint="lower train.lr, set train.grad_clip, or train.on_nonfinite: continue")
