# Client partitions: JSON (client -> train/val/test pool indices), label counts, heatmap.


rule build_partition:
    input:
        partition_sources,
    output:
        json="resources/partitions/{study}/{dataset}/{setting}/seed{seed}.json",
        stats="resources/partitions/{study}/{dataset}/{setting}/seed{seed}.csv",
        heatmap=report(
            "resources/partitions/{study}/{dataset}/{setting}/seed{seed}.png",
            caption="../report/partition.rst",
            category="{study}",
            subcategory="partitions",
        ),
    params:
        scheme=setting_value("scheme"),
        num_clients=setting_value("num_clients"),
        scheme_params=setting_value("params"),
        random_draws=study_value("random_draws"),
        user_dataset=user_dataset,
        file_format=PARTITION.FILE_FORMAT,
    log:
        "logs/build_partition/{study}/{dataset}/{setting}/seed{seed}.log",
    benchmark:
        "benchmarks/build_partition/{study}/{dataset}/{setting}/seed{seed}.tsv"
    threads: 1
    resources:
        mem_mb=config["resources"]["data_mem_mb"],
        runtime=30,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/build_partition.py"
