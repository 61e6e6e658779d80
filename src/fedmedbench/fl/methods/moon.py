"""MOON: model-contrastive federated learning (Li, He, Song, CVPR 2021), Algorithm 1.

Client k in round t starts from the global model w^t and, for every mini-batch (x, y), takes
one step of  CE(logits, y) + mu * l_con  with

    z = R_w(x)               representation of the model being trained
    z_glob = R_{w^t}(x)      global model of this round (frozen copy)
    z_prev = R_{w_k^{t-1}}(x)  the client's own model after its previous round (frozen)
    l_con = -log( e^{sim(z, z_glob)/tau} / (e^{sim(z, z_glob)/tau} + e^{sim(z, z_prev)/tau}) ),

sim = cosine similarity. The client keeps its trained model in ``ctx.state['prev']`` for
its next round. In its first round it has no previous model, so it trains on CE alone: the
reference code's pool of previous models is empty in round 1, its contrastive logits have the
single positive column and the term is exactly 0 (QinbinLi/MOON main.py:297-311, pool filled
after the round at main.py:537-543). Server: FedAvg.

Defaults from the paper: tau = 0.5; mu = 1 (the paper's value for CIFAR-100 and
Tiny-ImageNet; 5 for CIFAR-10). Representation: ``model.embed(x)`` (``gpaf_cnn``: the
encoder's latent mean, the input of the classifier, which plays the role of MOON's
projection-head output); models without ``embed`` use their flattened ``features(x)``.
As in the reference implementation both frozen models run in evaluation mode (running
batch-norm statistics; ``global_model.eval()`` at main.py:486, previous nets ``.eval()`` at
main.py:540). With mu = 0, and in a client's first round, a MOON client step is exactly a
FedAvg client step.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from fedmedbench.fl.api.method import ClientContext, ClientResult, Method, Param
from fedmedbench.fl.api.registry import register_method
from fedmedbench.fl.augment import batch_images
from fedmedbench.fl.methods._shared import tensors_of
from fedmedbench.fl.training import (
    StepLosses,
    batch_indices,
    index_device,
    make_optimizer,
    optimizer_step,
    to_device,
)


def representation(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    if hasattr(model, "embed"):
        return model.embed(x)
    if hasattr(model, "features"):
        return torch.flatten(model.features(x), 1)
    raise TypeError(f"MOON needs a model with embed() or features(); {type(model).__name__} has neither")


def representation_and_logits(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward pass giving the representation and the logits computed from it."""
    if not hasattr(model, "classifier"):
        raise TypeError(f"MOON needs a model with a 'classifier' head; {type(model).__name__} has none")
    z = representation(model, x)
    return z, model.classifier(z)


def model_contrastive_loss(z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, temperature: float) -> torch.Tensor:
    """l_con: cross-entropy of the positive pair (z, z_glob) against the negative (z, z_prev)."""
    logits = torch.stack([F.cosine_similarity(z, z_glob, dim=-1), F.cosine_similarity(z, z_prev, dim=-1)], dim=1)
    return F.cross_entropy(logits / temperature, torch.zeros(z.shape[0], dtype=torch.long, device=z.device))


def moon_loss(logits: torch.Tensor, y: torch.Tensor, z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor,
              mu: float, temperature: float) -> torch.Tensor:
    return F.cross_entropy(logits, y) + mu * model_contrastive_loss(z, z_glob, z_prev, temperature)


def frozen(model: nn.Module) -> nn.Module:
    return model.requires_grad_(False)


@register_method("moon")
class MOON(Method):
    #: batches are indexed wherever the client's data is (the engine may keep it on the device)
    device_data = True

    params = (Param("mu", float, 1.0, "weight of the model-contrastive loss", low=0),
              Param("temperature", float, 0.5, "tau of the contrastive loss", low=0, low_open=True))

    def client_fit(self, ctx: ClientContext) -> ClientResult:
        model, cfg, device = to_device(ctx.model, ctx.device), ctx.train, ctx.device
        global_model = frozen(copy.deepcopy(model)).eval()  # w^t
        prev_model = None
        if "prev" in ctx.state:  # w_k^{t-1}; none in the client's first round -> CE only
            prev_model = frozen(copy.deepcopy(model)).eval()
            prev_model.load_state_dict(ctx.state["prev"])
        model.train()
        opt = make_optimizer(model, cfg, ctx.rnd)
        mu, tau = self.p["mu"], self.p["temperature"]
        losses = StepLosses(ctx.steps_per_epoch())  # read once after the last step: no host sync per step
        x_all, y_all = ctx.data.train_x, ctx.data.train_y
        for idx in batch_indices(y_all.shape[0], cfg.batch_size, ctx.steps, ctx.generator,
                                 index_device(x_all, y_all)):
            xb, yb = batch_images(ctx.data, idx, device, ctx.generator), y_all[idx].to(device, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            z, logits = representation_and_logits(model, xb)
            if prev_model is None:
                loss = F.cross_entropy(logits, yb)
            else:
                with torch.no_grad():
                    z_glob, z_prev = representation(global_model, xb), representation(prev_model, xb)
                loss = moon_loss(logits, yb, z, z_glob, z_prev, mu, tau)
            optimizer_step(loss, model, opt, cfg)
            losses.add(loss)
        train_loss = losses.mean(ctx.rnd, what="MOON", hint="lower train.lr or enable train.grad_clip")
        ctx.state["prev"] = tensors_of(model)
        return ClientResult(arrays=ctx.result_arrays(model), num_examples=ctx.data.num_train,
                            metrics={"train_loss": train_loss, **losses.epoch_metrics()})
