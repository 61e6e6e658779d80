"""Which state_dict entries of a YOLO model belong to its backbone, neck and head.

Partial aggregation (UltraFlwr's YOLO-PA) averages only some components; this module
derives the key sets from the model itself (layer index ``m.i`` of every module in
``model.model``, the Detect layer by type, the yaml's ``backbone``/``head`` sections),
so any YOLO detection yaml works, and the counts of Table I are computed, not copied.

Splits (``partial.split``):

* ``ultraflwr``: UltraFlwr's current code: backbone = layers before the first SPPF
  (0-8 in YOLO11), neck = SPPF .. the layer before Detect (9-22), head = Detect (23).
* ``ultraflwr_2025_01``: the split of UltraFlwr's code from January to May 2025 (neck =
  layers 17, 20, 21, 22 of YOLO11; backbone = every other non-Detect layer). Its counts
  are the ones printed in the paper's Table I (see docs/ultraflwr.md).
* ``yaml``: the yaml's own sections: ``backbone`` = backbone, ``head`` minus Detect = neck.

``num_batches_tracked`` counters and the fixed DFL projection (``.dfl.``, frozen by
Ultralytics) are never aggregated or sent: they are not learnt.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

COMPONENTS = ("backbone", "neck", "head")
SPLITS = ("ultraflwr", "ultraflwr_2025_01", "yaml")

#: strategy name -> aggregated components (the paper's FA + six PA strategies)
PARTS: dict[str, tuple[str, ...]] = {
    "Fed": COMPONENTS,
    "FedBackbone": ("backbone",),
    "FedNeck": ("neck",),
    "FedHead": ("head",),
    "FedNeckHead": ("neck", "head"),
    "FedBackboneHead": ("backbone", "head"),
    "FedBackboneNeck": ("backbone", "neck"),
}
AGGREGATORS = {"Avg": "mean", "Median": "median"}


def strategy_names() -> list[str]:
    """The 14 strategies: FedAvg, FedMedian, FedBackboneAvg, ..., FedBackboneNeckMedian."""
    return [f"{p}{a}" for p in PARTS for a in AGGREGATORS]


def parse_strategy(name: str) -> tuple[tuple[str, ...], str]:
    """``FedBackboneNeckMedian`` -> (("backbone", "neck"), "median")."""
    for agg_suffix, agg in AGGREGATORS.items():
        prefix = name[: -len(agg_suffix)]
        if name.endswith(agg_suffix) and prefix in PARTS:
            return PARTS[prefix], agg
    raise ValueError(f"unknown strategy '{name}'; choose one of {', '.join(strategy_names())}")


def _layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    seq = getattr(model, "model", None)
    if not isinstance(seq, torch.nn.Sequential):
        raise TypeError(f"{type(model).__name__} is not an Ultralytics model (no model.model Sequential)")
    return list(seq)


def layer_components(model: torch.nn.Module, split: str) -> dict[int, str]:
    """Layer index -> component name for ``split``."""
    from ultralytics.nn.modules import SPPF, Detect

    layers = _layers(model)
    detect = [i for i, m in enumerate(layers) if isinstance(m, Detect)]
    if len(detect) != 1 or detect[0] != len(layers) - 1:
        raise ValueError("partial aggregation needs exactly one Detect layer, the model's last")
    head = detect[0]
    out = {head: "head"}
    if split == "ultraflwr":
        sppf = [i for i, m in enumerate(layers) if isinstance(m, SPPF)]
        if not sppf:
            raise ValueError("partial.split 'ultraflwr' needs an SPPF layer (the first neck layer); use 'yaml'")
        out.update({i: "backbone" if i < sppf[0] else "neck" for i in range(head)})
    elif split == "ultraflwr_2025_01":
        if head != 23:
            raise ValueError(f"partial.split 'ultraflwr_2025_01' is defined for YOLO11 (Detect = layer 23), not {head}")
        out.update({i: "neck" if i in (17, 20, 21, 22) else "backbone" for i in range(head)})
    elif split == "yaml":
        n_backbone = len(model.yaml["backbone"])
        out.update({i: "backbone" if i < n_backbone else "neck" for i in range(head)})
    else:
        raise ValueError(f"partial.split must be one of {SPLITS}, got '{split}'")
    return out


def _layer_of(key: str) -> int:
    parts = key.split(".")
    if len(parts) < 3 or parts[0] != "model" or not parts[1].isdigit():
        raise ValueError(f"state_dict key '{key}' is not of the form model.<layer>.<...>")
    return int(parts[1])


def is_learnt(key: str) -> bool:
    """False for entries that are not learnt: BN step counters and the frozen DFL projection."""
    return not key.endswith("num_batches_tracked") and ".dfl." not in key


def component_keys(model: torch.nn.Module, split: str, learnt_only: bool = True) -> dict[str, list[str]]:
    """Component -> state_dict keys (in state_dict order)."""
    comp = layer_components(model, split)
    out: dict[str, list[str]] = {c: [] for c in COMPONENTS}
    for key in model.state_dict():
        if learnt_only and not is_learnt(key):
            continue
        out[comp[_layer_of(key)]].append(key)
    return out


def aggregated_keys(model: torch.nn.Module, components: Iterable[str], split: str) -> list[str]:
    """Keys a strategy sends and aggregates (state_dict order)."""
    keys = component_keys(model, split)
    wanted = set(components)
    unknown = wanted - set(COMPONENTS)
    if unknown:
        raise ValueError(f"unknown component(s) {sorted(unknown)}; choose from {COMPONENTS}")
    chosen = {k for c in wanted for k in keys[c]}
    return [k for k in model.state_dict() if k in chosen]


def component_sizes(model: torch.nn.Module, split: str, learnt_only: bool = False) -> dict[str, int]:
    """Number of state_dict elements per component (Table I counts every entry, as the paper)."""
    state = model.state_dict()
    return {c: int(sum(state[k].numel() for k in ks)) for c, ks in component_keys(model, split, learnt_only).items()}
