# One Flower simulation per study/dataset/setting/method/seed. The method registry
# decides what runs inside; params.spec carries every hyper-parameter of the run, so
# changing one method's parameter reruns only that method's jobs.


rule train_federated:
    input:
        partition=partition_json,
        sources=run_sources,
        verified=run_verified,
        weights=run_weight_manifests,
    output:
        metrics="results/{study}/{dataset}/{setting}/{method}/seed{seed}/metrics.csv",
        clients="results/{study}/{dataset}/{setting}/{method}/seed{seed}/client_metrics.csv",
        summary="results/{study}/{dataset}/{setting}/{method}/seed{seed}/summary.json",
        model="results/{study}/{dataset}/{setting}/{method}/seed{seed}/model.pt",
    params:
        spec=run_spec,
    log:
        "logs/train_federated/{study}/{dataset}/{setting}/{method}/seed{seed}.log",
    benchmark:
        "benchmarks/train_federated/{study}/{dataset}/{setting}/{method}/seed{seed}.tsv"
    threads: config["threads"]["train"]
    resources:
        mem_mb=config["resources"]["train_mem_mb"],
        runtime=config["resources"]["train_runtime_min"],
        gpu=1 if config["device"] == "cuda" else 0,
        gpu_mem_mb=gpu_mem_mb(config["resources"]["train_gpu_mem_mb"]),
        cpus_per_gpu=config["threads"]["train"] if config["device"] == "cuda" else 0,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/train_federated.py"


# A study with train.seeds_together: one job per study/dataset/setting/method trains all its seeds side by side in
# one process (fl/engine/runs_together.py), each seed's outputs where train_federated writes them; one rule per such study
# (its seeds are the outputs).
for together_study in seeds_together_studies():
    n_seeds = len(config["studies"][together_study]["seeds"])

    rule:
        name:
            f"train_seeds_together_{together_study}"
        input:
            partitions=each_seed(together_study, partition_json),
            sources=run_sources,
            verified=run_verified,
            weights=run_weight_manifests,
        output:
            metrics=seed_outputs(together_study, "metrics.csv"),
            clients=seed_outputs(together_study, "client_metrics.csv"),
            summary=seed_outputs(together_study, "summary.json"),
            model=seed_outputs(together_study, "model.pt"),
        wildcard_constraints:
            study=together_study,
        params:
            specs=seed_specs(together_study),
        log:
            "logs/train_seeds_together/{study}/{dataset}/{setting}/{method}.log",
        benchmark:
            "benchmarks/train_seeds_together/{study}/{dataset}/{setting}/{method}.tsv"
        threads: config["threads"]["train"]
        resources:
            mem_mb=config["resources"]["train_mem_mb"] * n_seeds,
            runtime=config["resources"]["train_runtime_min"] * n_seeds,
            gpu=1 if config["device"] == "cuda" else 0,
            gpu_mem_mb=gpu_mem_mb(together_gpu_mem_mb(n_seeds)),
            cpus_per_gpu=config["threads"]["train"] if config["device"] == "cuda" else 0,
        conda:
            SOFTWARE_ENV
        script:
            "../scripts/train_seeds_together.py"

    workflow.ruleorder(f"train_seeds_together_{together_study}", "train_federated")
    workflow.ruleorder("show_shared_run", f"train_seeds_together_{together_study}")
