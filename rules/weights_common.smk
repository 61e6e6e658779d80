# Weight sets (docs/weights.md): config/weights.yaml merged with the config's `weights:`, name checks,
# and the helpers that give training jobs their weight file and manifest (rule in weights.smk).
import os

import fedmedbench.weights.layout as WL

try:
    WEIGHTS = WL.weight_sets(config["weights"], WL.CATALOGUE)
except ValueError as exc:
    raise ValueError(str(exc)) from None


def weight_set_name(name, key):
    """``name`` checked against the defined sets (error names the config key)."""
    if name not in WEIGHTS:
        _config_error(key, f"unknown weight set '{name}'; defined: {sorted(WEIGHTS)} (config/weights.yaml, weights:)")
    return name


def weight_set_entry(wildcards):
    """What the job's set is, not where it is fetched from (base_url and path are read from the config)."""
    return {k: v for k, v in WEIGHTS[wildcards.wname].items() if k not in ("base_url", "path", "description", "licence")}


def weights_file(name):
    """Path of a set's weight file (what the training job loads)."""
    return WL.weight_path(name, WEIGHTS[name])


def weights_manifest(name):
    return WL.manifest_path(name)


def model_weights(model, key):
    """(file to load, manifests to depend on) of a model block with ``weights`` / ``pretrained_path``."""
    if model.get("weights") and model.get("pretrained_path"):
        _config_error(f"{key}.weights", "set either weights (a named set) or pretrained_path (a local file), not both")
    if model.get("weights"):
        name = weight_set_name(model["weights"], f"{key}.weights")
        return weights_file(name), [weights_manifest(name)]
    return model.get("pretrained_path"), []


def init_of(model):
    """Caption words for how a model block starts: its weight set, its local file, or random init."""
    if model.get("weights"):
        return f"pretrained {model['weights']}"
    if model.get("pretrained_path"):
        return f"pretrained {os.path.basename(model['pretrained_path'])}"
    return "random init"


def study_init(study):
    """How a study's models start (per method where methods differ), for its table captions."""
    labels = {}
    for m in config["studies"][study]["methods"]:
        labels.setdefault(init_of(run_model(study, m)), []).append(m)
    if len(labels) == 1:
        return next(iter(labels))
    return "; ".join(f"{label} ({', '.join(ms)})" for label, ms in labels.items())


def fedst_init():
    f = config["fedst"]
    enc = f"pretrained {f['model']['encoder_weights']} encoder" if f["model"]["encoder_weights"] else "random init encoder"
    return enc + (f", CLIP {f['indicator']['clip_weights']}" if f["indicator"]["clip_weights"] else "")


def _check_weight_refs():
    """Every weight-set name the config uses is defined (fails at parse time naming the key)."""
    for study, st in config["studies"].items():
        for method in st["methods"]:
            run_weights(study, method)
    model_weights(config["ultraflwr"]["model"], "ultraflwr.model")


_check_weight_refs()
