# Deployment: one self-contained data folder per site and the server's spec, for running a run's
# federation across real sites with Flower's SuperLink/SuperNodes (docs/deployment.md). Built on
# demand, not part of `all`. One rule per study family (each builds its runs' specs its own way).
include: "deploy_common.smk"


rule export_site_data:
    input:
        partition=partition_json,
        sources=run_sources,
        weights=run_weight_manifests,
    output:
        directory("deploy/{study}/{dataset}/{setting}/{method}/seed{seed}"),
    wildcard_constraints:
        study="|".join(config["studies"]) or "^$",
    params:
        spec=deployable(run_spec, "deploy/{study}/{dataset}/{setting}/{method}/seed{seed}"),
    log:
        "logs/export_site_data/{study}/{dataset}/{setting}/{method}/seed{seed}.log",
    benchmark:
        "benchmarks/export_site_data/{study}/{dataset}/{setting}/{method}/seed{seed}.tsv"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/export_site_data.py"


rule export_site_data_ultraflwr:
    input:
        export=f"{SURG}/yolo/{{ugroup}}",
        weights=ultraflwr_weights()[1],
    output:
        directory("deploy/ultraflwr/{ugroup}/{usetting}/{strategy}/seed{seedset}"),
    wildcard_constraints:
        ugroup=ID,
        usetting=ID,
        strategy="Fed(Backbone|Neck|Head|NeckHead|BackboneHead|BackboneNeck)?(Avg|Median)",
        seedset=r"\d+",
    params:
        spec=deployable(ultraflwr_spec, "deploy/ultraflwr/{ugroup}/{usetting}/{strategy}/seed{seedset}"),
    log:
        "logs/export_site_data/ultraflwr/{ugroup}/{usetting}/{strategy}/seed{seedset}.log",
    benchmark:
        "benchmarks/export_site_data/ultraflwr/{ugroup}/{usetting}/{strategy}/seed{seedset}.tsv"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/export_site_data.py"


rule export_site_data_fedst:
    input:
        clips=FEDST_CLIPS,
        pretrained=fedst_pretrained,
        weights=fedst_job_weights,
    output:
        directory("deploy/fedst/{sites}/{variant}/{method}/seed{seed}"),
    wildcard_constraints:
        sites=ID,
        variant=ID,
        method="|".join(FS.METHODS),
        seed=r"\d+",
    params:
        spec=deployable(fedst_spec, "deploy/fedst/{sites}/{variant}/{method}/seed{seed}"),
    log:
        "logs/export_site_data/fedst/{sites}/{variant}/{method}/seed{seed}.log",
    benchmark:
        "benchmarks/export_site_data/fedst/{sites}/{variant}/{method}/seed{seed}.tsv"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/export_site_data.py"
