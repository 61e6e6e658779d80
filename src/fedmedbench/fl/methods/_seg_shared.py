"""Shared machinery of the FedST study's methods (segmentation task only): the base every one of
them extends, from the three plain baselines (``seg_local``, ``seg_centralized``, ``seg_fedavg``) to
``fedst``.

Every method trains the same :class:`~fedmedbench.models.fedst.FedSTNet` (its architecture
comes from ``task_params.model``) with the same loop (``fl.tasks.segmentation.train_steps``), and
differs in which parameters stay on a site and how the server combines the rest:

* ``personal`` (method parameter) names parameter groups that never leave a site
  (:data:`PERSONAL_GROUPS`); they live in the client's persistent state and are loaded
  over the broadcast model before training and evaluation. Everything else is in
  ``shared_keys`` and is averaged. The site indicator buffer (``cs.indicator``) is a
  fixed property of the site and always stays local.
* Every build of the model is seeded by the run's seed, so the personal parameters of all
  sites start from the same initial (synthetically pre-trained, when configured) model.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import torch

from fedmedbench.fl.api.arrays import load_arrays, model_arrays, weighted_average
from fedmedbench.fl.api.method import Arrays, ClientContext, ClientResult, Method, Param, ServerContext
from fedmedbench.weights.safeload import read_state_dict

#: parameter groups a method can keep on its sites (regular expressions on state_dict keys)
PERSONAL_GROUPS: dict[str, str] = {
    "enc_q": r"^encoder\..*\.attn\.q\.",          # query embeddings of the encoder (rho, FedST)
    "enc_k": r"^encoder\..*\.attn\.kv\.k\.",      # Table VI: keys
    "enc_v": r"^encoder\..*\.attn\.kv\.v\.",      # Table VI: values
    "enc_norm": r"^encoder\..*norm",              # Table VI: LayerNorms of the encoder
    "dec_q": r"^decoder\.attn\.q\.",              # Table V: query embeddings of the decoder
    "dec_other": r"^decoder\.(?!attn\.q\.)",      # Table V: the rest of the decoder
    "decoder": r"^decoder\.",                     # FedRep: the whole decoder is the head
    "head": r"^decoder\.head\.",                  # FedAS: the classifier
    "cs": r"^cs\.",                               # the channel-selection network (site-specific)
    "rsc": r"^rsc\.",                             # the temporal module (Sec. IV-D2: not communicated)
    "all": r".",                                  # Table V row 2 / Local Train
}
#: entries that never leave a site, whatever the method (the site indicator buffer)
ALWAYS_PERSONAL = re.compile(r"^cs\.indicator$")


def personal_keys(model: torch.nn.Module, groups: list[str]) -> list[str]:
    unknown = [g for g in groups if g not in PERSONAL_GROUPS]
    if unknown:
        raise ValueError(f"personal groups {unknown} unknown; choose from {sorted(PERSONAL_GROUPS)}")
    pats = [re.compile(PERSONAL_GROUPS[g]) for g in groups]
    return [k for k in model.state_dict() if ALWAYS_PERSONAL.match(k) or any(p.search(k) for p in pats)]


#: the one freshly built model a process keeps (key -> model), copied by :func:`build_seeded`
_BUILT: dict[tuple, torch.nn.Module] = {}


def build_seeded(spec) -> torch.nn.Module:
    """The run's FedSTNet, identical in every process (seeded), with synthetic pre-training loaded.

    A job asks for a fresh model many times (each client call, the shared-key list, the server's
    SERQ step); it is built once per process and configuration, and each call gets a deep copy of
    that untouched build (same values, its own tensors)."""
    pre = spec.pretrained_path
    stat = Path(pre).stat() if pre and Path(pre).is_file() else None
    key = (int(spec.seed), repr(sorted(spec.task_params["model"].items())), pre,
           (stat.st_mtime_ns, stat.st_size) if stat else None)
    if key not in _BUILT:
        model = _build_seeded(spec)
        _BUILT.clear()  # one configuration per job: keep no other
        _BUILT[key] = model
    return copy.deepcopy(_BUILT[key])


def _build_seeded(spec) -> torch.nn.Module:
    from fedmedbench.models.fedst import build_fedst_net

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(spec.seed))
        model = build_fedst_net(spec.task_params["model"])
    if spec.pretrained_path:
        load_matching(model, spec.pretrained_path)
    return model


def load_matching(model: torch.nn.Module, path: str | Path) -> list[str]:
    """Load the entries of a state_dict file whose name and shape match (pre-training of
    another variant of the network: absent modules keep their initialisation)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: pre-trained model not found (fedst pretrain)")
    # a crafted pickle, or anything but a state_dict of tensors, is refused naming the file
    state = read_state_dict(path, "FedST pre-training weights")
    own = model.state_dict()
    take = {k: v for k, v in state.items() if k in own and tuple(v.shape) == tuple(own[k].shape) and k != "cs.indicator"}
    if not take:
        raise ValueError(f"{path}: no entry matches the model (is it a FedSTNet state_dict?)")
    model.load_state_dict(take, strict=False)
    return sorted(take)


def tensors(model: torch.nn.Module, keys: list[str]) -> dict[str, torch.Tensor]:
    state = model.state_dict()
    return {k: state[k].detach().cpu().clone() for k in keys}


#: a method's ``aggregation`` parameter: training clips, 1/K, or None = ``train.aggregation``
AGGREGATION_CHOICES = ("examples", "uniform", None)


def client_weights(ctx: ServerContext, rule: str | None = None) -> list[float]:
    """Aggregation weights: ``examples`` (training clips, FedAvg) or ``uniform`` (FedST Algorithm 1,
    line 8: 1/K); ``rule`` None = ``train.aggregation``."""
    if (rule or ctx.train.aggregation) == "uniform":
        return [1.0] * len(ctx.results)
    return [float(r.num_examples) for r in ctx.results]


class SegMethod(Method):
    """Base: local training of the whole model, personal groups kept on the site, averaging."""

    personalized = True
    #: False for methods whose clients send nothing (Local Train) or that have one node
    communicates = True
    task = "segmentation"
    params = (Param("personal", list, [], "parameter groups kept on the site"),)

    # --- model ---------------------------------------------------------------------------
    def build_model(self, spec) -> torch.nn.Module:
        if spec.task != "segmentation":
            raise ValueError(f"method '{self.name}' needs the segmentation task (RunSpec.task = {spec.task!r})")
        return build_seeded(spec)

    def personal(self, model: torch.nn.Module) -> list[str]:
        return personal_keys(model, list(self.p["personal"]))

    def shared_keys(self, model: torch.nn.Module) -> list[str]:
        mine = set(self.personal(model))
        return [k for k in model.state_dict() if k not in mine]

    # --- client --------------------------------------------------------------------------
    def prepare(self, ctx: ClientContext) -> torch.nn.Module:
        """The site's model: broadcast shared arrays + its own personal parameters + its indicator."""
        model = ctx.model
        if getattr(ctx.data, "local_steps", None):  # the paper's fixed 100 iterations, whatever the site's size
            ctx.steps = int(ctx.data.local_steps)
        if "personal" in ctx.state:
            load_arrays(model, ctx.state["personal"], list(ctx.state["personal"]))
        if hasattr(model, "set_indicator"):
            model.set_indicator(ctx.data.indicator)
        if hasattr(model, "set_generator"):
            from fedmedbench.models.fedst import dropout_generator

            model.set_generator(dropout_generator(ctx.generator))
        return model

    def local_train(self, ctx: ClientContext, model: torch.nn.Module) -> float:
        from fedmedbench.fl.tasks.segmentation import train_steps

        return train_steps(model, ctx.data.train, ctx.steps, ctx.train, ctx.train.lr_at(ctx.rnd), ctx.device,
                           ctx.generator, self.loss_cfg(ctx))

    @staticmethod
    def loss_cfg(ctx: ClientContext) -> dict[str, Any]:
        return ctx.data.loss

    def finish(self, ctx: ClientContext, model: torch.nn.Module, loss: float, metrics: dict[str, float] | None = None) -> ClientResult:
        """Personal entries kept on the site; the shared ones sent as CPU tensors (the study's servers
        average on the host)."""
        ctx.state["personal"] = tensors(model, self.personal(model))
        return ClientResult(arrays=model_arrays(model, self.shared_keys(model)), num_examples=ctx.data.num_train,
                            metrics={"train_loss": loss, **(metrics or {})})

    def client_fit(self, ctx: ClientContext) -> ClientResult:
        model = self.prepare(ctx)
        return self.finish(ctx, model, self.local_train(ctx, model))

    def personal_model(self, ctx: ClientContext) -> torch.nn.Module:
        return self.prepare(ctx)

    # --- server --------------------------------------------------------------------------
    def aggregate(self, ctx: ServerContext) -> Arrays:
        """The shared arrays averaged with :func:`client_weights`: by the method's ``aggregation``
        parameter where it has one (:data:`AGGREGATION_CHOICES`), else by ``train.aggregation``."""
        return weighted_average([r.arrays for r in ctx.results], client_weights(ctx, self.p.get("aggregation")))
