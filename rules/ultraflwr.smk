# UltraFlwr study (docs/ultraflwr.md): federated YOLO on the surgical YOLO exports, 14 full /
# partial aggregation strategies + the per-client centralized baseline, then Table I (from the
# model), Tables II/III (top strategies per setting), Figure 3 (validation mAP50 per round) and
# the measured communication per client and round.
include: "ultraflwr_common.smk"


rule ultraflwr_train:
    input:
        export=f"{SURG}/yolo/{{ugroup}}",
        weights=ultraflwr_weights()[1],
    output:
        metrics=f"{UF_DIR}/{{ugroup}}/{{usetting}}/{{strategy}}/seed{{seedset}}/metrics.csv",
        clients=f"{UF_DIR}/{{ugroup}}/{{usetting}}/{{strategy}}/seed{{seedset}}/client_metrics.csv",
        summary=f"{UF_DIR}/{{ugroup}}/{{usetting}}/{{strategy}}/seed{{seedset}}/summary.json",
        model=f"{UF_DIR}/{{ugroup}}/{{usetting}}/{{strategy}}/seed{{seedset}}/model.pt",
        comm=f"{UF_DIR}/{{ugroup}}/{{usetting}}/{{strategy}}/seed{{seedset}}/comm.csv",
    wildcard_constraints:
        ugroup=ID,
        usetting=ID,
        strategy="Centralized|Fed(Backbone|Neck|Head|NeckHead|BackboneHead|BackboneNeck)?(Avg|Median)",
        seedset=r"\d+",
    params:
        spec=ultraflwr_spec,
    log:
        f"logs/ultraflwr_train/{{ugroup}}/{{usetting}}/{{strategy}}/seed{{seedset}}.log",
    benchmark:
        f"benchmarks/ultraflwr_train/{{ugroup}}/{{usetting}}/{{strategy}}/seed{{seedset}}.tsv"
    threads: config["threads"]["train"]
    resources:
        mem_mb=UF["resources"]["mem_mb"],
        runtime=UF["resources"]["runtime_min"],
        gpu=1 if config["device"] == "cuda" else 0,
        gpu_mem_mb=gpu_mem_mb(UF["resources"]["gpu_mem_mb"]),
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/ultraflwr_train.py"


rule ultraflwr_table1:
    output:
        csv=f"{UF_DIR}/tables/table1_params.csv",
        md=f"{UF_DIR}/tables/table1_params.md",
        tex=f"{UF_DIR}/tables/table1_params.tex",
    params:
        cfg=UF["report"]["table1"]["cfg"],
        nc=UF["report"]["table1"]["nc"],
    log:
        "logs/ultraflwr_table1.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/ultraflwr_report.py"


rule ultraflwr_top_strategies:
    input:
        unpack(ultraflwr_group_inputs),
        paper=paper_values_input("ultraflwr"),
    output:
        csv=f"{UF_DIR}/tables/top_strategies_{{ugroup}}{STAG}.csv",
        md=f"{UF_DIR}/tables/top_strategies_{{ugroup}}{STAG}.md",
        tex=f"{UF_DIR}/tables/top_strategies_{{ugroup}}{STAG}.tex",
    wildcard_constraints:
        ugroup=ID,
    params:
        runs=ultraflwr_group_index,
        top_k=UF["report"]["top_k"],
        select=UF["train"]["select"],
        select_metric=UF["train"]["select_metric"],
        origin=SORIGIN,
        init=init_of(UF["model"]),
    log:
        f"logs/ultraflwr_top_strategies/{{ugroup}}.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/ultraflwr_report.py"


rule ultraflwr_matrix:
    input:
        unpack(ultraflwr_group_inputs),
    output:
        csv=f"{UF_DIR}/tables/pair_matrix_{{ugroup}}{STAG}.csv",
        md=f"{UF_DIR}/tables/pair_matrix_{{ugroup}}{STAG}.md",
        tex=f"{UF_DIR}/tables/pair_matrix_{{ugroup}}{STAG}.tex",
    wildcard_constraints:
        ugroup=ID,
    params:
        runs=ultraflwr_group_index,
        origin=SORIGIN,
        init=init_of(UF["model"]),
    log:
        f"logs/ultraflwr_matrix/{{ugroup}}.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/ultraflwr_report.py"


rule ultraflwr_figure3:
    input:
        unpack(ultraflwr_group_inputs),
    output:
        report(f"{UF_DIR}/figures/figure3_{{ugroup}}{STAG}.png", caption="../report/ultraflwr_figure3.rst",
               category="ultraflwr", subcategory="figures"),
    wildcard_constraints:
        ugroup=ID,
    params:
        runs=ultraflwr_group_index,
        origin=SORIGIN,
    log:
        f"logs/ultraflwr_figure3/{{ugroup}}.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/ultraflwr_report.py"


rule ultraflwr_communication:
    input:
        [r["comm"] for r in ultraflwr_comm_index()],
    output:
        csv=f"{UF_DIR}/tables/communication{STAG}.csv",
        md=f"{UF_DIR}/tables/communication{STAG}.md",
        tex=f"{UF_DIR}/tables/communication{STAG}.tex",
    params:
        runs=ultraflwr_comm_index(),
        origin=SORIGIN,
        init=init_of(UF["model"]),
    log:
        "logs/ultraflwr_communication.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/ultraflwr_report.py"
