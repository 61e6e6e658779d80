# Tables (mean ± std over seeds) and convergence figures per study; `snakemake --report`.


rule aggregate_results:
    input:
        study_summaries,
    output:
        csv=f"results/{{study}}/tables/final_metrics{TAG}.csv",
        md=f"results/{{study}}/tables/final_metrics{TAG}.md",
        tex=f"results/{{study}}/tables/final_metrics{TAG}.tex",
    params:
        metrics=study_value("report", "metrics"),
        origin=of_study(study_origin),
        overrides=of_study(study_train_overrides),
    log:
        "logs/aggregate_results/{study}.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/aggregate_results.py"


rule plot_study:
    input:
        study_metrics,
    output:
        report(
            f"results/{{study}}/figures/convergence{TAG}.png",
            caption="../report/figure.rst",
            category="{study}",
            subcategory="figures",
        ),
    params:
        metric=study_value("report", "curve_metric"),
        origin=of_study(study_origin),
    log:
        "logs/plot_study/{study}.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/plot_study.py"
