# Pretrained weights as pipeline inputs (docs/weights.md): one fetch per named weight set into
# resources/weights/<name>/ with a manifest; training jobs take the manifest as an input, so
# changing a set reruns exactly the jobs that use it. Sets: config/weights.yaml + config `weights:`.
include: "weights_common.smk"


rule fetch_weights:
    output:
        manifest="resources/weights/{wname}/manifest.json",
    wildcard_constraints:
        wname=ID,
    params:
        entry=weight_set_entry,
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
