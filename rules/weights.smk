# Pretrained weights as pipeline inputs (docs/weights.md): one fetch per named weight set into
# resources/weights/<name>/ with a manifest; training jobs take the manifest as an input, so
# changing a set reruns exactly the jobs that use it. Sets: config/weights.yaml + config `weights:`.
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


rule fetch_weights:
    output:
        manifest="resources/weights/{wname}/manifest.json",
    wildcard_constraints:
        wname=ID,
    params:
        # what the set is, not where it is fetched from (base_url, path are read from config)
        entry=lambda wc: {k: v for k, v in WEIGHTS[wc.wname].items() if k not in ("base_url", "path", "description", "licence")},
        catalogue=WL.CATALOGUE,
    log:
        "logs/fetch_weights/{wname}.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=60,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/fetch_weights.py"


if config["cluster"]["local_downloads"]:

    localrules:
        fetch_weights,


def _check_weight_refs():
    """Every weight-set name the config uses is defined (fails at parse time naming the key)."""
    for study, st in config["studies"].items():
        for method in st["methods"]:
            run_weights(study, method)
    model_weights(config["ultraflwr"]["model"], "ultraflwr.model")


_check_weight_refs()
