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
