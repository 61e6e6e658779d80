"""The sampled clients of a round trained together (``train.batch_clients``).

On one process, local training of K clients is K loops of small steps, each dispatching the model's
forward, backward, clipping and optimizer ops (several hundred a step for ConvNeXtV2-nano): on a GPU the round
is bound by launching them, not by arithmetic. Here the K clients' weights are stacked (K, ...) and
every step runs one forward and backward over all of them (``torch.func.functional_call`` under
``vmap``), one per-client gradient clipping and one multi-tensor SGD step: a round costs the ops of
its longest client, not of all clients.

Each client keeps its own draws (its generator's permutations, its batches), its own gradient-norm
clip and its own momentum. The clients are stacked longest first, so that those still stepping are a
prefix of the stack: a step computes only them (views of the stacked tensors), and a client whose steps
are done is left where it is. Within a step, clients of unequal batches are padded to the step's largest
with zero-weight samples. A round with one large client (quantity skew) thus computes about what one by one
computes, not K times its longest client. The per-sample arithmetic is the same; the order of summation within a batched
convolution is not, so results equal the one-by-one loop to float32 rounding (``tests/
test_clients_together.py`` states the tolerance), not bit for bit: the option is part of the run hash.

What it serves: FL-optimizer methods whose client step is local SGD with an optional linear gradient
correction, extra weight decay, loss weight and a declared perturbation (``fl/methods/_perturb.py``)
(``LocalSGDMethod.hooks``: the ten of the earlystop study, FedAvg ... FedWMSAM, and the adaptive server
optimizers FedAdam, FedYogi, FedAdagrad; what a client sends after its steps is the method's ``client_result``),
on a model without buffers (ConvNeXt's LayerNorm, not
BatchNorm, whose batch statistics would mix the padding in). Anything else is trained one by one
(``Method.why_not_together``, said once in the log).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from fedmedbench.fl.api.method import Arrays, ClientContext, TrainConfig
from fedmedbench.fl.methods._perturb import BatchedPerturbation, Perturbation, Stack, batch_why_not
from fedmedbench.fl.methods._step import StepHooks, Tensors, mean_loss, trainable
from fedmedbench.fl.training import (
    NonFiniteLossError,
    StepLosses,
    batch_indices,
    forward_precision,
    to_device,
    to_float,
)


def model_why_not(model: nn.Module, cfg: TrainConfig) -> str | None:
    """Why clients of this model and train block cannot be trained together (None: they can)."""
    if cfg.optimizer != "sgd":
        return f"train.optimizer is {cfg.optimizer}"
    if cfg.channels_last or cfg.compile:
        return "train.channels_last / train.compile apply to one client's model"
    if any(True for _ in model.buffers()):
        return "the model has buffers (batch statistics would mix clients' padding)"
    if any(_draws_in_training(m) for m in model.modules()):
        return "the model draws at random in training (dropout, drop path): not under vmap's stacked clients"
    return None


def _draws_in_training(module: nn.Module) -> bool:
    """Whether a layer draws random numbers in training mode (dropout of p > 0, timm's DropPath of a rate > 0)."""
    if isinstance(module, nn.modules.dropout._DropoutNd):
        return module.p > 0
    return type(module).__name__ == "DropPath" and float(getattr(module, "drop_prob", 0.0) or 0.0) > 0


def hooks_why_not(hooks: StepHooks) -> str | None:
    """Why one client's step hooks cannot join a batched step (None: they can)."""
    if hooks.perturb is not None and not isinstance(hooks.perturb, Perturbation):
        return "a weight perturbation of the method's own"
    own = hooks.perturb is not None and getattr(hooks.after_step, "__self__", None) is hooks.perturb
    if hooks.after_step is not None and not own:
        return "a callback after every step"  # one of the perturbation's own is batched with it
    return None


def round_why_not(hooks: Sequence[StepHooks]) -> str | None:
    """Why a round's clients, with these step hooks, cannot be trained together (None: they can)."""
    reason = next((r for r in map(hooks_why_not, hooks) if r), None)
    if reason:
        return reason
    if len({(h.extra_weight_decay, h.loss_weight) for h in hooks}) > 1:
        return "clients of different weight decays or loss weights"
    return batch_why_not([h.perturb for h in hooks])  # what the batched form reads off the first client


def train_together(ctxs: Sequence[ClientContext], hooks: Sequence[StepHooks],
                   each_own_error: bool = False) -> list[tuple[Arrays, dict[str, float]] | NonFiniteLossError]:
    """Every client of ``ctxs`` trained as :func:`fedmedbench.fl.methods._sgd.local_loop` would train it, all
    in one batched loop; per client its trained state (as ``ctx.result_arrays`` gives it) and its metrics (as
    ``local_loop_metrics``). Each client starts from its ``ctx.model`` (its run's global weights): one model for
    a round's clients, one per run where several runs' rounds are trained together (``fl/engine/runs_together.py``);
    every client of the call has the same round, train block and network (:func:`merge_key`). A client's
    non-finite loss raises its ``NonFiniteLossError``; with ``each_own_error`` that error takes its place in the
    list instead (several runs in one call: a run fails only of its own clients)."""
    plan = BatchPlan.of(ctxs, ctxs[0].train.batch_size)
    ctxs, hooks = [ctxs[c] for c in plan.order], [hooks[c] for c in plan.order]  # longest first
    model, cfg, device = ctxs[0].model, ctxs[0].train, ctxs[0].device
    params = trainable(model)
    k = len(ctxs)
    stack = Stack({n: p.detach() for n, p in params.items()}, k, device)
    stacked = _starting_weights(ctxs)
    names, weights = list(stacked), list(stacked.values())
    corrections = stack.stacked([h.correction for h in hooks])
    perturbs = [h.perturb for h in hooks]
    kind = next((type(p) for p in perturbs if p is not None), None)
    perturb = kind.batched(perturbs, stack) if kind is not None else None
    if any(h.after_step is not None for h in hooks) and (
            perturb is None or type(perturb).after_step is BatchedPerturbation.after_step):
        raise TypeError("the clients' StepHooks.after_step would be skipped: " + (
            "no batched perturbation calls it" if perturb is None else f"{kind.__name__}.batched gives a "
            f"{type(perturb).__name__}, which does not override BatchedPerturbation.after_step"))
    decay = cfg.weight_decay + hooks[0].extra_weight_decay
    loss_weight = hooks[0].loss_weight
    x_all, y_all = plan.pooled(ctxs)
    index, sample_w = plan.tensors(x_all.device, device)
    lr = cfg.lr_at(ctxs[0].rnd)

    def client_loss(p: Tensors, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, p, (x,))
        return (nn.functional.cross_entropy(out.float(), y, reduction="none") * w).sum()

    batched_loss = torch.func.vmap(client_loss)
    momentum: list[torch.Tensor] | None = None
    step_losses = []
    for s in range(plan.steps):
        n, width = plan.active[s], plan.widths[s]
        idx, w_s = index[s, :n, :width], sample_w[s, :n, :width]  # the stepping clients' batches
        corr = None if corrections is None else stack.first(corrections, n)
        # every client steps: the stacked tensors themselves; else leaves that are views of the first n rows,
        # updated in place
        leaves = weights if n == k else [w.detach()[:n].requires_grad_(True) for w in weights]
        current = dict(zip(names, leaves, strict=True))
        xb = to_float(x_all[idx], device)
        yb = y_all[idx].to(device, non_blocking=True)
        e = None
        if perturb is not None:
            g = None
            if perturb.needs_gradient:  # the gradient at the current weights on this batch (SAM's ascent)
                for w in leaves:
                    w.grad = None
                with forward_precision(cfg, device):
                    batched_loss(current, xb, yb, w_s).sum().backward()
                g = [w.grad for w in leaves]
            with torch.no_grad():
                e = perturb.e(leaves, g, n)
                if e is not None:
                    torch._foreach_add_(leaves, e)
        for w in leaves:
            w.grad = None
        with forward_precision(cfg, device):
            losses = batched_loss(current, xb, yb, w_s)
        # a weight of 1 (every method but FedWMSAM) is no op to launch; x * 1.0 == x bit for bit
        (losses.sum() if loss_weight == 1.0 else (losses * loss_weight).sum()).backward()
        with torch.no_grad():
            if e is not None:
                torch._foreach_sub_(leaves, e)
            grads = [w.grad for w in leaves]
            if any(g is None for g in grads):  # one by one, SGD and clipping would skip it; batched it has no row
                unused = next(name for name, g in zip(names, grads, strict=True) if g is None)
                raise ValueError(f"train.batch_clients: the model's parameter {unused!r} gets no gradient, so its "
                                 "clients cannot be trained together; set train.batch_clients: false")
            if corr is not None:
                torch._foreach_add_(grads, corr)
            if cfg.grad_clip:
                coef = torch.clamp(cfg.grad_clip / (stack.norms(grads) + 1e-6), max=1.0)  # clip_grad_norm_, per client
                torch._foreach_mul_(grads, stack.by_rank(coef))
            if decay:
                grads = torch._foreach_add(grads, leaves, alpha=decay)
            if cfg.momentum:
                if momentum is None:  # SGD's first buffer is the step's gradient: these tensors, not read again
                    momentum = grads
                else:
                    buffers = momentum if n == len(momentum[0]) else [m[:n] for m in momentum]
                    torch._foreach_mul_(buffers, cfg.momentum)
                    torch._foreach_add_(buffers, grads)
                    grads = buffers
            torch._foreach_add_(leaves, grads, alpha=-lr)
            if perturb is not None:
                perturb.after_step(n)
        step_losses.append(losses.detach())
    if perturb is not None:
        perturb.finish()
    values = np.zeros((plan.steps, k))
    if step_losses:
        flat = torch.cat(step_losses).double().cpu().numpy()
        for s, row in enumerate(np.split(flat, np.cumsum(plan.active)[:-1])):
            values[s, : len(row)] = row
    out = _results(ctxs, stacked, values, plan, each_own_error)
    back = [None] * k  # the callers' order
    for pos, c in enumerate(plan.order):
        back[c] = out[pos]
    return back


def merge_key(ctx: ClientContext) -> tuple:
    """What clients trained in one call share: the round (its learning rate), the train block but for the budget
    of rounds, and the network's trainable tensors (names and shapes)."""
    shapes = tuple((n, tuple(p.shape), p.dtype) for n, p in trainable(ctx.model).items())
    return ctx.rnd, repr(dataclasses.replace(ctx.train, rounds=0)), type(ctx.model), shapes


def _starting_weights(ctxs: Sequence[ClientContext]) -> Tensors:
    """The clients' starting weights stacked (K, ...), each its model's; leaves that take gradients."""
    models = list({id(c.model): c.model for c in ctxs}.values())
    for m in models:
        m.train()
    if len(models) == 1:  # one run's round: its global weights, K times
        return {n: p.detach().unsqueeze(0).expand(len(ctxs), *p.shape).clone().requires_grad_(True)
                for n, p in trainable(models[0]).items()}
    weights = [trainable(c.model) for c in ctxs]
    return {n: torch.stack([w[n].detach() for w in weights]).requires_grad_(True) for n in weights[0]}


class BatchPlan:
    """Which samples each client trains on at each batched step, drawn as the one-by-one loop draws them.

    The clients are taken longest first (``order``: positions in the callers' list), so that the clients
    still stepping at a step are a prefix. ``rows[s][c]``: the c-th client's sample indices (into its own
    training data) at step s, or None once its ``ctx.steps`` are done. Steps: the most any client takes."""

    def __init__(self, rows: list[list[np.ndarray | None]], sizes: list[int], order: list[int]) -> None:
        self.rows = rows
        self.sizes = sizes
        self.order = order
        self.steps = len(rows)
        self.width = max((len(r) for step in rows for r in step if r is not None), default=1)
        #: per step: how many clients step (the first ones), and their largest batch (known on the host)
        self.active = [sum(r is not None for r in step) for step in rows]
        self.widths = [max((len(r) for r in step if r is not None), default=1) for step in rows]

    @classmethod
    def of(cls, ctxs: Sequence[ClientContext], batch_size: int) -> BatchPlan:
        draws = [[idx.numpy() for idx in batch_indices(c.data.num_train, batch_size, c.steps, c.generator)]
                 for c in ctxs]
        order = sorted(range(len(ctxs)), key=lambda c: -len(draws[c]))  # stable: equal ones keep their order
        draws = [draws[c] for c in order]
        steps = max((len(d) for d in draws), default=0)
        rows = [[d[s] if s < len(d) else None for d in draws] for s in range(steps)]
        return cls(rows, [ctxs[c].data.num_train for c in order], order)

    @staticmethod
    def pooled(ctxs: Sequence[ClientContext]) -> tuple[torch.Tensor, torch.Tensor]:
        """The clients' training images and labels back to back, in the plan's order (``ctxs`` ordered as
        ``order``), where the first client's data are."""
        xs = [c.data.train_x for c in ctxs]
        ys = [c.data.train_y for c in ctxs]
        where = xs[0].device
        return torch.cat([x.to(where) for x in xs]), torch.cat([y.to(where) for y in ys])

    def tensors(self, data_device: torch.device, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(steps, K, width) indices into the pooled data and (steps, K, width) sample weights (1/b for a
        client's b samples, 0 for padding and for a client whose steps are done)."""
        k, offsets = len(self.sizes), np.concatenate([[0], np.cumsum(self.sizes)[:-1]])
        index = np.zeros((self.steps, k, self.width), dtype=np.int64)
        weight = np.zeros((self.steps, k, self.width), dtype=np.float32)
        for s, step in enumerate(self.rows):
            for c, rows in enumerate(step):
                index[s, c, :] = offsets[c]
                if rows is None:
                    continue
                index[s, c, : len(rows)] = rows + offsets[c]
                weight[s, c, : len(rows)] = 1.0 / len(rows)
        return torch.from_numpy(index).to(data_device), torch.from_numpy(weight).to(device)


def _results(ctxs: Sequence[ClientContext], stacked: Tensors, values: np.ndarray, plan: BatchPlan,
             each_own_error: bool = False) -> list[tuple[Arrays, dict[str, float]] | NonFiniteLossError]:
    """Each client's trained state (views of the stacked tensors, where the job keeps its arrays) and its
    step losses as ``local_loop_metrics`` reports them."""
    where = ctxs[0].array_device
    states = {id(c.model): c.model.state_dict() for c in ctxs}  # each run's model: its entries not trained
    rows = {n: t.detach().to(where).unbind(0) for n, t in stacked.items()}
    out = []
    for c, ctx in enumerate(ctxs):
        state = states[id(ctx.model)]
        fixed = {n: t.detach() for n, t in state.items() if n not in stacked}
        taken = sum(1 for step in plan.rows if step[c] is not None)
        losses = StepLosses.of_values(values[:taken, c].tolist(), ctx.steps_per_epoch())
        try:
            loss = mean_loss(ctx, losses)
        except NonFiniteLossError as exc:  # one by one, the engine names the client that raised
            if not each_own_error:
                raise NonFiniteLossError(f"client {ctx.pid}: {exc}") from None
            out.append(NonFiniteLossError(f"client {ctx.pid}: {exc}"))
            continue
        arrays: Arrays = {n: rows[n][c] if n in rows else fixed[n].clone().to(where) for n in state}
        out.append((arrays, {"train_loss": loss, **losses.epoch_metrics()}))
    return out


def predict_together(models: Sequence[nn.Module], x_u8: torch.Tensor, y: torch.Tensor, batch_size: int,
                     device: torch.device) -> list[tuple[np.ndarray, np.ndarray]]:
    """``predict_samples`` of each of ``models`` (one network, buffer-free, other weights) on the same images, in
    one batched forward a batch (their weights stacked, ``vmap`` over them): per model its class probabilities
    and per-sample cross-entropy, as ``predict_samples`` gives them to float32 rounding."""
    base = models[0]
    for m in models:
        to_device(m, device).eval()
    params = [dict(m.named_parameters()) for m in models]  # each model's walked once, not once a parameter
    stacked = {n: torch.stack([p[n].detach() for p in params]) for n in params[0]}
    forward = torch.func.vmap(lambda p, xb: functional_call(base, p, (xb,)), in_dims=(0, None))
    k, floats = len(models), torch.is_floating_point(x_u8)
    probs, losses = [], []
    with torch.no_grad():
        for start in range(0, y.shape[0], batch_size):
            chunk = x_u8[start : start + batch_size]
            xb = chunk.to(device, non_blocking=True) if floats else to_float(chunk, device)
            yb = y[start : start + batch_size].to(device, non_blocking=True)
            logits = forward(stacked, xb).float()  # (K, B, C)
            ce = nn.functional.cross_entropy(logits.flatten(0, 1), yb.repeat(k), reduction="none")
            losses.append(ce.view(k, -1).double())
            probs.append(torch.softmax(logits, dim=2))
    if not probs:
        return [(np.zeros((0, 1)), np.zeros(0)) for _ in models]
    p_all, l_all = torch.cat(probs, dim=1).cpu().numpy(), torch.cat(losses, dim=1).cpu().numpy()
    return [(p_all[i], l_all[i]) for i in range(k)]
