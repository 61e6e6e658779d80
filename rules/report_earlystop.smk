# Early-stopping study (Beyond Fixed Rounds): stopping points per run x tau, Tables 1-2, Figures 3-4.
# Everything is computed from the runs' per-round logs, so tau sweeps need no extra training.
include: "earlystop_common.smk"


rule earlystop_stopping_points:
    input:
        study_metrics,
    output:
        f"results/{{study}}/tables/stopping_points{TAG}.csv",
    params:
        taus=of_study(es_taus),
        patience=study_value("early_stopping", "patience"),
        metric=study_value("early_stopping", "metric"),
        min_delta=study_value("early_stopping", "val_min_delta"),
        counting=study_value("early_stopping", "counting"),
        never_fired=study_value("early_stopping", "never_fired"),
    log:
        "logs/earlystop_stopping_points/{study}.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/earlystop_points.py"


rule earlystop_table1:
    input:
        f"results/{{study}}/tables/stopping_points{TAG}.csv",
        paper=of_study(paper_values_input),
    output:
        csv=f"results/{{study}}/tables/table1{TAG}.csv",
        md=f"results/{{study}}/tables/table1{TAG}.md",
        tex=f"results/{{study}}/tables/table1{TAG}.tex",
    params:
        es=study_value("early_stopping"),
        settings=study_setting_names,
        methods=study_value("methods"),
        seeds=study_value("seeds"),
        study=study_name,
        origin=of_study(study_origin),
        init=of_study(study_init),
    log:
        "logs/earlystop_table1/{study}.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/earlystop_table.py"


rule earlystop_table2:
    input:
        f"results/{{study}}/tables/stopping_points{TAG}.csv",
        paper=of_study(paper_values_input),
    output:
        csv=f"results/{{study}}/tables/table2{TAG}.csv",
        md=f"results/{{study}}/tables/table2{TAG}.md",
        tex=f"results/{{study}}/tables/table2{TAG}.tex",
    params:
        es=study_value("early_stopping"),
        settings=study_setting_names,
        methods=study_value("methods"),
        seeds=study_value("seeds"),
        study=study_name,
        origin=of_study(study_origin),
        init=of_study(study_init),
    log:
        "logs/earlystop_table2/{study}.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/earlystop_table.py"


rule earlystop_figures:
    input:
        metrics=study_metrics,
        points=f"results/{{study}}/tables/stopping_points{TAG}.csv",
    output:
        fig3=report(f"results/{{study}}/figures/fig3_stopping{TAG}.png", caption="../report/earlystop_fig3.rst",
                    category="{study}", subcategory="figures"),
        fig4=report(f"results/{{study}}/figures/fig4_tau{TAG}.png", caption="../report/earlystop_fig4.rst",
                    category="{study}", subcategory="figures"),
    params:
        es=study_value("early_stopping"),
        setting=of_study(es_figure_setting),
        methods=study_value("methods"),
        origin=of_study(study_origin),
    log:
        "logs/earlystop_figures/{study}.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/earlystop_figures.py"
