# Tables (mean ± std over seeds) and convergence figures per study; `snakemake --report`.


rule aggregate_results:
    input:
        study_summaries,
    output:
        csv=f"results/{{study}}/tables/final_metrics{TAG}.csv",
        md=f"results/{{study}}/tables/final_metrics{TAG}.md",
        tex=f"results/{{study}}/tables/final_metrics{TAG}.tex",
    params:
        metrics=lambda wc: config["studies"][wc.study]["report"]["metrics"],
        origin=lambda wc: study_origin(wc.study),
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
        metric=lambda wc: config["studies"][wc.study]["report"]["curve_metric"],
        origin=lambda wc: study_origin(wc.study),
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
