# Early-stopping study (Beyond Fixed Rounds): stopping points per run x tau, Tables 1-2, Figures 3-4.
# Everything is computed from the runs' per-round logs, so tau sweeps need no extra training.


rule earlystop_stopping_points:
    input:
        study_metrics,
    output:
        f"results/{{study}}/tables/stopping_points{TAG}.csv",
    params:
        taus=lambda wc: es_taus(wc.study),
        patience=lambda wc: config["studies"][wc.study]["early_stopping"]["patience"],
        metric=lambda wc: config["studies"][wc.study]["early_stopping"]["metric"],
        min_delta=lambda wc: config["studies"][wc.study]["early_stopping"]["val_min_delta"],
        counting=lambda wc: config["studies"][wc.study]["early_stopping"]["counting"],
        never_fired=lambda wc: config["studies"][wc.study]["early_stopping"]["never_fired"],
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
        paper=lambda wc: paper_values_input(wc.study),
    output:
        csv=f"results/{{study}}/tables/table1{TAG}.csv",
        md=f"results/{{study}}/tables/table1{TAG}.md",
        tex=f"results/{{study}}/tables/table1{TAG}.tex",
    params:
        es=lambda wc: config["studies"][wc.study]["early_stopping"],
        settings=lambda wc: list(config["studies"][wc.study]["settings"]),
        methods=lambda wc: config["studies"][wc.study]["methods"],
        seeds=lambda wc: config["studies"][wc.study]["seeds"],
        study=lambda wc: wc.study,
        origin=lambda wc: study_origin(wc.study),
        init=lambda wc: study_init(wc.study),
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
        paper=lambda wc: paper_values_input(wc.study),
    output:
        csv=f"results/{{study}}/tables/table2{TAG}.csv",
        md=f"results/{{study}}/tables/table2{TAG}.md",
        tex=f"results/{{study}}/tables/table2{TAG}.tex",
    params:
        es=lambda wc: config["studies"][wc.study]["early_stopping"],
        settings=lambda wc: list(config["studies"][wc.study]["settings"]),
        methods=lambda wc: config["studies"][wc.study]["methods"],
        seeds=lambda wc: config["studies"][wc.study]["seeds"],
        study=lambda wc: wc.study,
        origin=lambda wc: study_origin(wc.study),
        init=lambda wc: study_init(wc.study),
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
        es=lambda wc: config["studies"][wc.study]["early_stopping"],
        setting=lambda wc: es_figure_setting(wc.study),
        methods=lambda wc: config["studies"][wc.study]["methods"],
        origin=lambda wc: study_origin(wc.study),
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
