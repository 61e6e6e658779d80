# Deployment: one self-contained data folder per site, for running a run's federation across real
# sites with Flower's SuperLink/SuperNodes (docs/deployment.md). Built on demand, not part of `all`.


rule export_site_data:
    input:
        partition=partition_json,
        sources=lambda wc: sorted(set(setting_sources(wc.study, wc.dataset, wc.setting).values())),
    output:
        directory("deploy/{study}/{dataset}/{setting}/{method}/seed{seed}"),
    params:
        spec=run_spec,
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
