"""Shared mechanics of the FL-optimizer family (FedAvg ... FedWMSAM), written once.

Client: :func:`local_loop` runs ``ctx.steps`` SGD steps; each step may (1) move the
weights by a perturbation e (SAM family) before taking the gradient and move them
back after, (2) add a linear correction d to the gradient (the gradient of a loss
term <theta, d>: SCAFFOLD/FedGamma control variates, FedProx/FedDyn/FedSpeed/FedSMOO
proximal and dual terms), (3) clip the gradient norm, (4) step SGD with weight decay
(plus a method's extra decay, e.g. the lambda*theta part of a proximal term). This
order follows the reference implementations (FL-Simulator and its descendants),
where corrections are part of the loss, hence clipped with it.

Server: :class:`LocalSGDMethod` averages client states (uniformly or by examples,
``train.aggregation``); :class:`ServerOptMethod` applies a global learning rate to the
averaged update of the parameters (the adaptive server optimizers, ``_fedopt.py``, their own
step); buffers (BatchNorm statistics) are averaged. Corrections act on trainable parameters
only (``param_keys``), never on buffers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from fedmedbench.fl.api.arrays import load_arrays, snapshot, weighted_average
from fedmedbench.fl.api.method import (
    Arrays,
    ClientContext,
    ClientResult,
    Method,
    Param,
    ServerContext,
    Trainer,
)
from fedmedbench.fl.augment import batch_images
from fedmedbench.fl.methods._step import (  # noqa: F401  (re-exported: the method files import the family's names from here)
    Operand,
    StepHooks,
    Tensors,
    add,
    add_,
    div,
    flat_norm,
    gradient_at,
    grads_of,
    mean_loss,
    mul,
    neg,
    sam_perturbation,
    sub,
    trainable,
)
from fedmedbench.fl.training import (
    StepLosses,
    add_to_grads,
    batch_indices,
    correction_on,
    forward_fn,
    forward_precision,
    index_device,
    make_optimizer,
    place_model,
)

PERTURBATION_FORMS = ("reference", "vector")
#: K of a SCAFFOLD-style control-variate update (see ``local_iterations``)
LOCAL_ITERATIONS = ("reference", "per_client")


def indexed_perturbation(direction: Iterable[torch.Tensor], order: Sequence[str], rho: float) -> Tensors:
    """The perturbation as the FedLESAM and FedWMSAM reference optimizers (optimizer/LESAM.py and
    WMSAM.py of their authors' code and of the early-stopping study) compute it from a flat direction
    v: they index v by each parameter tensor's position, so tensor j moves as a whole by the scalar
    rho * v[j] / (sum_k |v[k]| + 1e-7), k over the P parameter tensors; only v's first P entries are
    read. It is both methods' default because that code produced the study's numbers; ``vector`` is
    the papers' rho * d/||d||. ``direction`` yields v's pieces in parameter order (lazily: usually the
    first suffices)."""
    v = leading_entries(direction, len(order))
    scale = rho / (v.abs().sum() + 1e-7)
    return dict(zip(order, (v * scale).unbind(0), strict=True))  # one multiplication; entry j is v[j] * scale


def leading_entries(direction: Iterable[torch.Tensor], count: int, rows: int | None = None) -> torch.Tensor:
    """The first ``count`` entries of the flat direction whose pieces ``direction`` yields, float32 (the v of
    :func:`indexed_perturbation`); with ``rows``, pieces stacked (rows, ...) give each row's, (rows, count)."""
    lead, got = [], 0
    for t in direction:
        piece = (t.reshape(-1) if rows is None else t.reshape(rows, -1))[..., : count - got]
        lead.append(piece)
        got += piece.shape[-1]
        if got == count:
            break
    if got < count:
        raise ValueError(f"indexed perturbation: the direction has {got} entries for {count} parameter tensors")
    return torch.cat(lead, dim=-1).float()


def local_loop(ctx: ClientContext, hooks: StepHooks, losses: StepLosses | None = None) -> float:
    """``ctx.steps`` mini-batch SGD steps on the client's training data; mean loss. The step losses
    go to ``losses`` when given (per-epoch means: ``losses.epoch_metrics()``)."""
    cfg, device = ctx.train, ctx.device
    model = place_model(ctx.model, cfg, device)
    model.train()
    forward = forward_fn(model, cfg)
    params = trainable(model)
    opt = make_optimizer(model, cfg, ctx.rnd, hooks.extra_weight_decay)
    corrected = correction_on(model, hooks.correction, device)  # (parameters, d) or None
    losses = StepLosses() if losses is None else losses  # read once after the last step: no host sync per step
    x_u8, y = ctx.data.train_x, ctx.data.train_y
    for idx in batch_indices(y.shape[0], cfg.batch_size, ctx.steps, ctx.generator, index_device(x_u8, y)):
        xb, yb = batch_images(ctx.data, idx, device, ctx.generator, cfg.channels_last), y[idx].to(device, non_blocking=True)
        with forward_precision(cfg, device):
            e = hooks.perturb(model, xb, yb) if hooks.perturb else None
        if e:
            shifted = {n: params[n] for n in e}
            with torch.no_grad():
                add_(shifted, e)
        opt.zero_grad(set_to_none=True)
        with forward_precision(cfg, device):
            loss = nn.functional.cross_entropy(forward(xb).float(), yb)
        # a weight of 1 (every method but FedWMSAM) is no op to launch twice a step; x * 1.0 == x bit for bit
        (loss if hooks.loss_weight == 1.0 else hooks.loss_weight * loss).backward()
        with torch.no_grad():
            if e:
                torch._foreach_sub_(list(shifted.values()), list(e.values()))
            if corrected:
                add_to_grads(*corrected)
        if cfg.grad_clip:
            nn.utils.clip_grad_norm_(list(params.values()), cfg.grad_clip)
        opt.step()
        if hooks.after_step:
            hooks.after_step()
        losses.add(loss)
    return mean_loss(ctx, losses)


def local_loop_metrics(ctx: ClientContext, hooks: StepHooks) -> dict[str, float]:
    """:func:`local_loop`, reported as a client's metrics: ``train_loss`` and the mean loss of each
    local epoch (``train_loss_e<e>``)."""
    losses = StepLosses(ctx.steps_per_epoch())
    loss = local_loop(ctx, hooks, losses)
    return {"train_loss": loss, **losses.epoch_metrics()}


def local_iterations(ctx: ClientContext, form: str) -> float:
    """K in SCAFFOLD's c_i update (theta_g - theta_i) / (K lr).

    ``per_client``: the steps this client took (E * ceil(n_i / B); the SCAFFOLD paper).
    ``reference``: E * n_0 / B with n_0 the training size of client 0, for every client
    (the early-stopping paper's server/SCAFFOLD.py); equal to the steps only when all
    clients hold as many examples as client 0 and B divides n_0, so under quantity skew
    a client's correction is scaled by its steps over client 0's.
    """
    if form == "per_client":
        return float(ctx.steps)
    if form != "reference":
        raise ValueError(f"local_iterations = {form!r}: choose reference or per_client")
    if ctx.client_sizes is None:
        raise ValueError("local_iterations: reference needs the clients' sizes (ctx.client_sizes)")
    return ctx.train.local_epochs * ctx.client_sizes()[0] / ctx.train.batch_size


def _double_normalise(module: nn.Module, args: tuple) -> tuple:
    """Normalize(0.5, 0.5) once more on inputs already in [-1, 1]: x -> 2x - 1 (early-stopping dataset.py)."""
    return (args[0] * 2.0 - 1.0, *args[1:])


def with_input_norm(model: nn.Module, input_norm: str) -> nn.Module:
    """``train.input_norm``: single leaves the model alone; double adds the second normalisation as a pre-hook."""
    if input_norm == "double":
        model.register_forward_pre_hook(_double_normalise)
    elif input_norm != "single":
        raise ValueError(f"train.input_norm = {input_norm!r}: choose single or double")
    return model


def to_tensors(arrays: Arrays, keys, device: torch.device | None = None) -> Tensors:
    """float32 tensors of ``arrays[k]`` for ``keys``, where the arrays are (not copied when already float32:
    read only), then on ``device`` if given."""
    out = {k: torch.as_tensor(arrays[k]).detach().to(torch.float32) for k in keys}
    return {k: v.to(device) for k, v in out.items()} if device is not None else out


def state_tensors(state: dict[str, Any], name: str, like: Tensors) -> Tensors:
    """A per-client vector kept in ``ctx.state`` (zeros the first time), where ``like``'s tensors are."""
    stored = state.get(name)
    if stored is None:
        return {n: torch.zeros_like(t) for n, t in like.items()}
    devices = {t.device for t in like.values()}
    if len(devices) == 1:  # one transfer, not one per tensor (a state read back is one buffer's views)
        return snapshot({n: stored[n] for n in like}, devices.pop())
    return {n: stored[n].to(like[n].device, copy=True) for n in like}


def delta(trained: Tensors, global_arrays: Arrays) -> Tensors:
    """theta_local - theta_global over the client's trained parameters (:func:`trained_params`), float32,
    where the global arrays are."""
    theta_g = to_tensors(global_arrays, trained)
    return sub({n: p.detach().to(theta_g[n].device, torch.float32) for n, p in trained.items()}, theta_g)


def client_tensors(ctx: ClientContext) -> Tensors:
    """The model's trainable parameters (detached) where a client's vectors live (``kept_vectors``)."""
    return kept_vectors(ctx, trainable(ctx.model))


def kept_vectors(ctx: ClientContext, t: Tensors) -> Tensors:
    """A client's vectors as its state keeps them: detached, where the job keeps its arrays (``ctx.array_device``)."""
    return {n: v.detach().to(ctx.array_device) for n, v in t.items()}


def vectors64(arrays: Arrays, keys) -> Tensors:
    """float64 copies of ``arrays[k]`` where the arrays are (one conversion per device and dtype): a server
    step's arithmetic in float64."""
    return snapshot({k: torch.as_tensor(arrays[k]) for k in keys}, dtype=torch.float64)


def cast_like(t: Tensors, like: Arrays, dtype: torch.dtype | None = None) -> Arrays:
    """``t`` cast to ``dtype`` (one conversion per device and source dtype), by default to each entry's
    dtype in ``like``."""
    if dtype is not None:
        return snapshot(t, dtype=dtype)
    return {k: v.to(like[k].dtype) for k, v in t.items()}


class LocalSGDMethod(Method):
    """The family's client (local SGD shaped by the method's :class:`StepHooks`) and server (the client states
    averaged with the family's weights), with no server step of its own: :class:`ServerOptMethod` adds the global
    lr, the adaptive server optimizers (``_fedopt.py``) theirs. A subclass's own server arithmetic takes
    ``vectors64`` of the arrays and gives its result back by ``cast_like``."""

    device_data = True  # local_loop indexes batches wherever the data is

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self._param_keys: list[str] | None = None

    def build_model(self, spec) -> nn.Module:
        """The registry's model, with the study's input normalisation (``train.input_norm``)."""
        return with_input_norm(super().build_model(spec), spec.train.get("input_norm", "single"))

    def reply_keys(self, model: nn.Module, rnd: int, train) -> dict[str, list[str] | None]:
        """The extra records of this family (SCAFFOLD's and FedWMSAM's ``delta_c``, FedSMOO's ``mu``) are
        vectors over the trainable parameters."""
        return {**super().reply_keys(model, rnd, train), **{name: list(trainable(model)) for name in self.extra_records}}

    # -- helpers --------------------------------------------------------------------
    def param_keys(self, ctx: ServerContext) -> list[str]:
        if self._param_keys is None:
            self._param_keys = [n for n, p in ctx.new_model().named_parameters() if p.requires_grad]
        return self._param_keys

    @staticmethod
    def weights(ctx: ServerContext) -> np.ndarray:
        if ctx.train.aggregation == "uniform":
            w = np.ones(len(ctx.results))
        else:
            w = np.array([r.num_examples for r in ctx.results], dtype=np.float64)
        return w / w.sum()

    def average(self, ctx: ServerContext, arrays: list[Arrays] | None = None) -> Arrays:
        """Weighted mean of client arrays (see ``weighted_average``), with this method's client weights."""
        return weighted_average(arrays if arrays is not None else [r.arrays for r in ctx.results], list(self.weights(ctx)))

    def aggregate(self, ctx: ServerContext) -> Arrays:
        return self.average(ctx)

    # -- client side default: plain local SGD ----------------------------------------------
    def hooks(self, ctx: ClientContext) -> StepHooks:
        return StepHooks()

    def client_fit(self, ctx: ClientContext) -> ClientResult:
        hooks = self.hooks(ctx)
        metrics = local_loop_metrics(ctx, hooks)
        return self.client_result(ctx, hooks, metrics, ctx.result_arrays())

    def client_result(self, ctx: ClientContext, hooks: StepHooks, metrics: dict[str, float], arrays: Arrays) -> ClientResult:
        """What a client sends after its local steps; ``arrays``: its trained state (its trained parameters:
        :func:`trained_params`), whether it trained alone or with the round's other clients."""
        return ClientResult(arrays=arrays, num_examples=ctx.data.num_train, metrics=metrics)

    # -- a round's clients together (train.batch_clients): the plain SGD step above, batched ------------
    def why_not_together(self, model: nn.Module, train) -> str | None:
        if type(self).client_fit is not LocalSGDMethod.client_fit:
            return f"method '{self.name}' has its own client step"
        from fedmedbench.fl.methods import _together

        return _together.model_why_not(model, train)

    def fit_together(self, ctxs: list[ClientContext], trainer: Trainer | None = None) -> list[ClientResult] | None:
        from fedmedbench.fl.methods import _together

        hooks = [self.hooks(ctx) for ctx in ctxs]  # once a round: a method's hooks may move its clients' state
        reason = _together.round_why_not(hooks)  # e.g. a perturbation of the method's own
        if reason:
            if ctxs[0].note is not None:
                ctxs[0].note(f"train.batch_clients: a round's clients trained one by one ({reason})")
            if trainer is not None:
                trainer(ctxs, None)  # present at the round, with nothing to train together: runs beside this one go on
            return self.one_by_one(ctxs, hooks)
        trained = (trainer or _together.train_together)(ctxs, hooks)
        return [self.client_result(ctx, h, metrics, arrays) for ctx, h, (arrays, metrics) in zip(ctxs, hooks, trained, strict=True)]

    def one_by_one(self, ctxs: list[ClientContext], hooks: list[StepHooks]) -> list[ClientResult]:
        """The round's clients (sharing one model, which holds the global weights) trained one after another
        with the hooks already made, as ``client_fit`` trains each: the model put back to the global weights
        before every client but the first."""
        model = ctxs[0].model
        start = snapshot(model.state_dict())
        out = []
        for i, (ctx, h) in enumerate(zip(ctxs, hooks, strict=True)):
            if i:
                load_arrays(model, start)  # in place: the hooks' references to the model's tensors hold
            out.append(self.client_result(ctx, h, local_loop_metrics(ctx, h), ctx.result_arrays()))
        return out


class ServerOptMethod(LocalSGDMethod):
    """FedAvg-style server: average the client states, global lr on the parameters' update."""

    params = (Param("global_lr", float, 1.0, "server step on the averaged update (1 = plain averaging)", low=0, low_open=True),)

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.global_lr = float(self.p["global_lr"])

    def apply_global_lr(self, ctx: ServerContext, averaged: Arrays) -> Arrays:
        """theta + eta_g * (mean(theta_i) - theta) on parameters; eta_g = 1 returns the mean exactly."""
        if self.global_lr == 1.0:
            return averaged
        out = dict(averaged)
        for k in self.param_keys(ctx):
            g = torch.as_tensor(ctx.global_arrays[k]).to(averaged[k].device, torch.float64)
            out[k] = (g + self.global_lr * (averaged[k].to(torch.float64) - g)).to(averaged[k].dtype)
        return out

    def aggregate(self, ctx: ServerContext) -> Arrays:
        return self.apply_global_lr(ctx, self.average(ctx))


def trained_params(ctx: ClientContext, arrays: Arrays) -> Tensors:
    """A client's trained parameters, read from the state it sends (``client_result``'s ``arrays``)."""
    return {n: torch.as_tensor(arrays[n]) for n in trainable(ctx.model)}


def sent_vectors(t: Tensors) -> Arrays:
    """A client's vectors as it sends them: the tensors themselves, detached (where they are kept)."""
    return {k: v.detach() for k, v in t.items()}


def arrays_to_vector(a: Arrays) -> Tensors:
    """float32 copies of a broadcast array set (the broadcast is shared by every client), by one
    concatenation per device and dtype, not one copy per tensor."""
    return snapshot({k: torch.as_tensor(v) for k, v in a.items()}, dtype=torch.float32)
