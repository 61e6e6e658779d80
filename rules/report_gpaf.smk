# GPAF-paper outputs for studies with `report.gpaf`: Table 1 per dataset (accuracy, F1, recall,
# precision per setting, beside the paper's), rounds to reach a target accuracy with a convergence
# figure, t-SNE of client and global latent features (first seed, last round) and the clients'
# imaging domains (Fig. 2: intensity profiles per client and class).
include: "gpaf_common.smk"


rule gpaf_table1:
    input:
        summaries=gpaf_dataset_summaries,
        metrics=gpaf_dataset_metrics,
        paper=of_study(paper_values_input),
    output:
        csv=f"results/{{study}}/tables/table1_{{dataset}}{TAG}.csv",
        md=f"results/{{study}}/tables/table1_{{dataset}}{TAG}.md",
        tex=f"results/{{study}}/tables/table1_{{dataset}}{TAG}.tex",
    params:
        report=study_value("report", "gpaf"),
        settings=study_value("settings"),
        setting_order=study_setting_names,
        origin=of_study(study_origin),
        init=of_study(study_init),
    log:
        "logs/gpaf_table1/{study}/{dataset}.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/gpaf_table1.py"


rule gpaf_convergence:
    input:
        study_metrics,
    output:
        csv=f"results/{{study}}/tables/convergence_rounds{TAG}.csv",
        md=f"results/{{study}}/tables/convergence_rounds{TAG}.md",
        figure=report(
            f"results/{{study}}/figures/gpaf_convergence{TAG}.png",
            caption="../report/gpaf_convergence.rst",
            category="{study}",
            subcategory="figures",
        ),
    params:
        report=study_value("report", "gpaf"),
        setting_order=study_setting_names,
        origin=of_study(study_origin),
    log:
        "logs/gpaf_convergence/{study}.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/gpaf_convergence.py"


rule gpaf_tsne:
    input:
        gpaf_tsne_inputs,
    output:
        report(
            f"results/{{study}}/figures/tsne_{{dataset}}_{{setting}}{TAG}.png",
            caption="../report/gpaf_tsne.rst",
            category="{study}",
            subcategory="figures",
        ),
    params:
        specs=gpaf_tsne_specs,
        tsne=study_value("report", "gpaf", "tsne"),
        origin=of_study(study_origin),
    log:
        "logs/gpaf_tsne/{study}/{dataset}_{setting}.log",
    benchmark:
        "benchmarks/gpaf_tsne/{study}/{dataset}_{setting}.tsv"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/gpaf_tsne.py"


rule gpaf_domains:
    input:
        gpaf_domain_files,
    output:
        figure=report(
            f"results/{{study}}/figures/domains_{{dataset}}_{{setting}}{TAG}.png",
            caption="../report/gpaf_domains.rst",
            category="{study}",
            subcategory="figures",
        ),
        csv=f"results/{{study}}/tables/domains_{{dataset}}_{{setting}}{TAG}.csv",
    params:
        domains=gpaf_domain_names,
        bins=32,
        origin=ORIGIN,
    log:
        "logs/gpaf_domains/{study}/{dataset}_{setting}.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/gpaf_domains.py"
