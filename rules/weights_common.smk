# Weight sets (docs/weights.md): config/weights.yaml merged with the config's `weights:`, name checks,
# and the helpers that give training jobs their weight file and manifest (rule in weights.smk).
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


def _check_weight_refs():
    """Every weight-set name the config uses is defined (fails at parse time naming the key)."""
    for study, st in config["studies"].items():
        for method in st["methods"]:
            run_weights(study, method)
    model_weights(config["ultraflwr"]["model"], "ultraflwr.model")


_check_weight_refs()
