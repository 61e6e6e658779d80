"""Local optimisation and evaluation loops shared by all methods.

Batches are drawn from a ``torch.Generator`` seeded by (run seed, round, client), so
a client's update does not depend on which worker process runs it; this is what
makes resumed runs bit-identical to uninterrupted ones on CPU.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch import nn

from fedmedbench.metrics.classification import classification_metrics


class NonFiniteLossError(FloatingPointError):
    """Training produced a NaN/inf loss; the job stops with this message."""


def to_float(x_u8: torch.Tensor, device: torch.device, channels_last: bool = False) -> torch.Tensor:
    """uint8 images (N,C,H,W) -> float in [-1, 1] on ``device`` (optionally NHWC memory layout)."""
    x = x_u8.to(device, non_blocking=True).float().div_(127.5).sub_(1.0)
    return x.contiguous(memory_format=torch.channels_last) if channels_last and x.dim() == 4 else x


def forward_precision(cfg, device: torch.device):
    """``train.autocast: bf16`` runs forward passes under bfloat16 autocast (GPU or CPU); else fp32."""
    mode = getattr(cfg, "autocast", "none")
    if mode == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    if mode != "none":
        raise ValueError(f"train.autocast = {mode!r}: use none or bf16")
    return contextlib.nullcontext()


def to_device(model: nn.Module, device: torch.device) -> nn.Module:
    """``model.to(device)``, skipped when every parameter and buffer is there already (``Module.to``
    visits every submodule: milliseconds per call for a ConvNeXt, paid per client call and evaluation)."""
    device = torch.device(device)
    for t in (*model.parameters(), *model.buffers()):
        if t.device.type != device.type or (device.index is not None and t.device.index != device.index):
            return model.to(device)
    return model


def place_model(model: nn.Module, cfg, device: torch.device) -> nn.Module:
    """Move to ``device``; ``train.channels_last`` also switches conv weights to NHWC (faster convs on GPU)."""
    to_device(model, device)
    if getattr(cfg, "channels_last", False):
        model.to(memory_format=torch.channels_last)
    return model


def _call(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


_compiled_call: Callable[[nn.Module, torch.Tensor], torch.Tensor] | None = None


def forward_fn(model: nn.Module, cfg) -> Callable[[torch.Tensor], torch.Tensor]:
    """The model's forward for training steps; ``train.compile`` makes it ``torch.compile``d.

    One compiled function takes the model as an argument, so the graph is traced once per
    architecture and input shape in a process and reused by every client call and every model
    object of that architecture (the job's resident model, fresh copies), and the model's
    state_dict keys stay the same (``torch.compile(model)`` would prefix them)."""
    if not getattr(cfg, "compile", False):
        return model
    global _compiled_call
    if _compiled_call is None:
        _compiled_call = torch.compile(_call)
    return functools.partial(_compiled_call, model)


def steps_for_epochs(num_examples: int, epochs: float, batch_size: int) -> int:
    return max(1, int(math.ceil(epochs * math.ceil(num_examples / batch_size))))


def batch_indices(n: int, batch_size: int, steps: int, generator: torch.Generator,
                  device: torch.device | str | None = None) -> Iterator[torch.Tensor]:
    """``steps`` mini-batches, reshuffling each pass over the data (epoch).

    The permutations are drawn on the CPU (the same numbers on every device). ``device``: where the
    data to index lies; each epoch's permutation is copied there once, without waiting. Indexing a
    GPU tensor with CPU indices copies them per batch with a blocking copy, which waits for every
    queued kernel: the host could not queue the next step while the GPU runs this one."""
    device = torch.device("cpu") if device is None else torch.device(device)
    done = 0
    while done < steps:
        perm = on_device(torch.randperm(n, generator=generator), device)
        for start in range(0, n, batch_size):
            if done == steps:
                return
            yield perm[start : start + batch_size]
            done += 1


def on_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t`` on ``device``, copied without the host waiting for the device (a CPU tensor goes through pinned
    memory on CUDA; a plain ``.to(device)`` of it waits for every kernel queued so far)."""
    device = torch.device(device)
    if t.device == device or device.type == "cpu":
        return t.to(device)
    if device.type == "cuda" and t.device.type == "cpu":
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


def index_device(*tensors: torch.Tensor) -> torch.device:
    """Where batch indices into ``tensors`` should be: their device when they share one, else the CPU
    (a CPU tensor cannot be indexed by device indices)."""
    devices = {t.device for t in tensors}
    return devices.pop() if len(devices) == 1 else torch.device("cpu")


def make_optimizer(model: nn.Module, cfg, rnd: int, extra_weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """The client optimizer of round ``rnd`` (fresh each round, as in the reference FL code)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = cfg.weight_decay + extra_weight_decay
    if cfg.optimizer == "sgd":
        # multi-tensor SGD on every device (torch picks it by itself on CUDA only): a handful of ops a step
        # instead of three per parameter tensor; on the CPU the same per-tensor kernels, so the same bits
        return torch.optim.SGD(params, lr=cfg.lr_at(rnd), momentum=cfg.momentum, weight_decay=decay, foreach=True)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr_at(rnd), weight_decay=decay)
    raise ValueError(f"unknown optimizer '{cfg.optimizer}' (train.optimizer): use sgd or adam")


def optimizer_step(loss: torch.Tensor, model: nn.Module, opt: torch.optim.Optimizer, cfg,
                   correction: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] | None = None) -> None:
    """Backward, the gradient correction (``correction``: (parameters, d), :func:`add_to_grads`), clip
    (``train.grad_clip``), step. The loss is not read here (that would wait for the device every step):
    callers keep it in :class:`StepLosses`, which checks it once per client."""
    loss.backward()
    if correction is not None:
        with torch.no_grad():
            add_to_grads(*correction)
    if cfg.grad_clip:
        nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    opt.step()


def add_to_grads(params: dict[str, torch.Tensor], d: dict[str, torch.Tensor]) -> None:
    """p.grad += d (p.grad = d where a parameter got no gradient): a step's linear gradient correction, the
    gradient of a loss term <theta, d>, added after the backward pass and before clipping."""
    if all(p.grad is not None for p in params.values()):
        torch._foreach_add_([p.grad for p in params.values()], [d[n] for n in params])
        return
    for n, p in params.items():
        p.grad = d[n].clone() if p.grad is None else p.grad.add_(d[n])


def correction_on(model: nn.Module, correction: dict[str, torch.Tensor] | None,
                  device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]] | None:
    """(the corrected parameters, the correction on ``device``) for :func:`optimizer_step`; None without one.
    A name that is not a trainable parameter of the model fails naming it."""
    if not correction:
        return None
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    unknown = sorted(set(correction) - set(params))
    if unknown:
        raise KeyError(f"gradient correction: {unknown[:3]} not trainable parameters of the model")
    return {n: params[n] for n in correction}, {n: t.to(device) for n, t in correction.items()}


def epoch_means(values: list[float], steps_per_epoch: int) -> list[float]:
    """Mean of each local epoch's step values: consecutive runs of ``steps_per_epoch`` steps (the
    last run may be shorter), each summed in float64 in step order."""
    if steps_per_epoch < 1:
        raise ValueError(f"steps_per_epoch must be >= 1, got {steps_per_epoch}")
    out = []
    for start in range(0, len(values), steps_per_epoch):
        chunk = values[start : start + steps_per_epoch]
        total = 0.0
        for v in chunk:
            total += v
        out.append(total / len(chunk))
    return out


def epoch_loss_metrics(values: list[float], steps_per_epoch: int | None, key: str = "train_loss") -> dict[str, float]:
    """``{key}_e1, {key}_e2, ...``: the mean loss of each local epoch (scalars, as metric records carry);
    empty without an epoch length."""
    if not steps_per_epoch:
        return {}
    return {f"{key}_e{e}": m for e, m in enumerate(epoch_means(values, steps_per_epoch), start=1)}


class StepLosses:
    """A client's per-step losses, kept on the device and read once after its last step.

    Reading a loss (``float(loss)``, ``torch.isfinite(loss)`` in an ``if``) waits for the device
    each step; here the steps queue up and the host reads them all once. A non-finite loss
    still fails the client with the round and the first bad step (after its remaining steps ran).
    With ``steps_per_epoch``, :meth:`epoch_metrics` gives the mean of each local epoch from the
    same single read.
    """

    def __init__(self, steps_per_epoch: int | None = None) -> None:
        self._losses: list[torch.Tensor] = []
        self._values: list[float] | None = None
        self.steps_per_epoch = steps_per_epoch

    @classmethod
    def of_values(cls, values: list[float], steps_per_epoch: int | None = None) -> StepLosses:
        """Step losses already read to the host (clients trained together read theirs in one go)."""
        losses = cls(steps_per_epoch)
        losses._values = list(values)
        return losses

    def add(self, loss: torch.Tensor) -> None:
        self._losses.append(loss.detach())
        self._values = None

    def values(self) -> list[float]:
        """The step losses on the host (one device read, then cached)."""
        if self._values is None:
            self._values = torch.stack(self._losses).double().cpu().tolist() if self._losses else []
        return self._values

    def mean(self, rnd: int, what: str = "training", hint: str = "lower train.lr or set train.grad_clip",
             check: bool = True) -> float:
        """Mean loss (summed in float64 in step order); with ``check``, a non-finite step raises
        NonFiniteLossError naming the first bad one (without, the mean is non-finite too)."""
        values = self.values()
        total = 0.0
        for step, value in enumerate(values, start=1):
            if check and not math.isfinite(value):
                raise NonFiniteLossError(f"non-finite {what} loss ({value}) at round {rnd}, step {step}; {hint}")
            total += value
        return total / max(len(values), 1)

    def epoch_metrics(self, key: str = "train_loss") -> dict[str, float]:
        """``{key}_e<e>``: the mean loss of local epoch e = 1, 2, ... (empty without ``steps_per_epoch``)."""
        return epoch_loss_metrics(self.values(), self.steps_per_epoch, key)


#: a term added to a local step's loss: (model, images, labels, logits) -> a scalar tensor, or None for none
ExtraLoss = Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor], "torch.Tensor | None"]


def local_sgd(
    model: nn.Module,
    x_u8: torch.Tensor,
    y: torch.Tensor,
    steps: int,
    cfg,
    rnd: int,
    device: torch.device,
    generator: torch.Generator,
    extra_loss: ExtraLoss | None = None,
    losses: StepLosses | None = None,
    images: Callable[[torch.Tensor], torch.Tensor] | None = None,
    correction: dict[str, torch.Tensor] | None = None,
) -> float:
    """Run ``steps`` optimisation steps of cross-entropy (+ ``extra_loss(model, x, y, logits)`` where it gives a
    term); mean loss. ``correction``: a vector by trainable parameter name added to every step's gradient before
    clipping (:func:`add_to_grads`). The step losses go to ``losses`` when given (e.g. for per-epoch means).
    ``images(idx)`` gives a batch's float images (default ``to_float`` of ``x_u8[idx]``; an augmented read:
    fl/augment.py)."""
    place_model(model, cfg, device).train()
    forward = forward_fn(model, cfg)
    opt = make_optimizer(model, cfg, rnd)
    loss_fn = nn.CrossEntropyLoss()
    corrected = correction_on(model, correction, device)
    losses = StepLosses() if losses is None else losses
    for idx in batch_indices(y.shape[0], cfg.batch_size, steps, generator, index_device(x_u8, y)):
        xb = to_float(x_u8[idx], device, cfg.channels_last) if images is None else images(idx)
        yb = y[idx].to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        with forward_precision(cfg, device):
            logits = forward(xb).float()
            loss = loss_fn(logits, yb)
            term = extra_loss(model, xb, yb, logits) if extra_loss is not None else None
            if term is not None:
                loss = loss + term
        optimizer_step(loss, model, opt, cfg, corrected)
        losses.add(loss)
    return losses.mean(rnd, hint="lower train.lr or enable train.grad_clip")


#: per thread: where a run side by side with others hands its predictions, to be made with theirs in one batched
#: pass (``pool``: ``fl/runs_together.RoundPool``); unset, a run predicts alone
shared_predictions = threading.local()


def predict_samples(model: nn.Module, x_u8: torch.Tensor, y: torch.Tensor, batch_size: int,
                    device: torch.device) -> tuple[np.ndarray, np.ndarray]:
    """Class probabilities (N x C, float32) and per-sample cross-entropy (N, float64). ``x_u8``: uint8 images,
    or float images already on the model's [-1, 1] scale (an augmented read, fl/augment.py).

    Both stay on the device until the last batch and are read once: a read per batch would make
    the host wait for each batch before queuing the next."""
    pool = getattr(shared_predictions, "pool", None)
    if pool is not None:
        return pool.predict(model, x_u8, y, batch_size, device)
    return predict_alone(model, x_u8, y, batch_size, device)


@torch.no_grad()
def predict_alone(model: nn.Module, x_u8: torch.Tensor, y: torch.Tensor, batch_size: int,
                  device: torch.device) -> tuple[np.ndarray, np.ndarray]:
    """:func:`predict_samples` in this thread, whatever runs beside it."""
    to_device(model, device).eval()
    probs, losses = [], []
    floats = torch.is_floating_point(x_u8)
    for start in range(0, y.shape[0], batch_size):
        chunk = x_u8[start : start + batch_size]
        xb = chunk.to(device, non_blocking=True) if floats else to_float(chunk, device)
        yb = y[start : start + batch_size].to(device, non_blocking=True)
        logits = model(xb)
        losses.append(nn.functional.cross_entropy(logits.float(), yb, reduction="none").double())
        probs.append(torch.softmax(logits.float(), dim=1))
    if not probs:
        return np.zeros((0, 1)), np.zeros(0)
    return torch.cat(probs).cpu().numpy(), torch.cat(losses).cpu().numpy()


def predict(model: nn.Module, x_u8: torch.Tensor, y: torch.Tensor, batch_size: int, device: torch.device) -> tuple[np.ndarray, float]:
    """Class probabilities (N x C) and mean cross-entropy."""
    probs, losses = predict_samples(model, x_u8, y, batch_size, device)
    return probs, (float(losses.mean()) if len(losses) else math.nan)


def evaluate(model: nn.Module, x_u8: torch.Tensor, y: torch.Tensor, batch_size: int, device: torch.device) -> dict[str, float]:
    if y.shape[0] == 0:
        return classification_metrics(np.zeros(0), np.zeros((0, 2)), math.nan)
    probs, loss = predict(model, x_u8, y, batch_size, device)
    return classification_metrics(y.cpu().numpy(), probs, loss)
