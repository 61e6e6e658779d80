# Client partitions: JSON (client -> train/val/test pool indices), label counts, heatmap.


rule build_partition:
    input:
        lambda wc: [base_npz(wc.dataset, study_size(wc.study)), *verified_marker(wc.dataset, study_size(wc.study))],
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
        scheme=lambda wc: config["studies"][wc.study]["settings"][wc.setting]["scheme"],
        num_clients=lambda wc: config["studies"][wc.study]["settings"][wc.setting]["num_clients"],
        scheme_params=lambda wc: config["studies"][wc.study]["settings"][wc.setting]["params"],
        random_draws=lambda wc: config["studies"][wc.study]["random_draws"],
        user_dataset=lambda wc: user_dataset(wc.dataset),
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
