# Study fedst (FedST, seed 002): synthetic pre-training, one Flower simulation per
# sites/variant/method/seed on the surgical clips, tables II-IX (docs/fedst.md).
# params carry every hyper-parameter of a job, so a change reruns exactly the affected jobs.


include: "fedst_common.smk"


rule fedst_pretrain:
    input:
        clips=FEDST_CLIPS,
        weights=fedst_weights("main"),
    output:
        "results/fedst/{sites}/pretrain/seed{seed}/pretrained.pt",
    params:
        pre=FS.pretrain_params(FEDST_RUN, FEDST_CLIPS),
        device=config["device"],
    log:
        "logs/fedst_pretrain/{sites}/seed{seed}.log",
    benchmark:
        "benchmarks/fedst_pretrain/{sites}/seed{seed}.tsv"
    threads: config["threads"]["train"]
    resources:
        mem_mb=FEDST["resources"]["mem_mb"],
        runtime=FEDST["resources"]["runtime_min"],
        gpu=0,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/fedst_pretrain.py"


rule fedst_train:
    input:
        clips=FEDST_CLIPS,
        pretrained=fedst_pretrained,
        weights=fedst_job_weights,
    output:
        metrics="results/fedst/{sites}/{variant}/{method}/seed{seed}/metrics.csv",
        clients="results/fedst/{sites}/{variant}/{method}/seed{seed}/client_metrics.csv",
        summary="results/fedst/{sites}/{variant}/{method}/seed{seed}/summary.json",
        model="results/fedst/{sites}/{variant}/{method}/seed{seed}/model.pt",
        deploy="results/fedst/{sites}/{variant}/{method}/seed{seed}/deploy.json",
    params:
        spec=fedst_spec,
        deploy={"outfed_site": FEDST["outfed_site"], "unseen_site": FEDST["unseen_site"], "fps_clips": FEDST["eval"]["fps_clips"]},
    log:
        "logs/fedst_train/{sites}/{variant}/{method}/seed{seed}.log",
    benchmark:
        "benchmarks/fedst_train/{sites}/{variant}/{method}/seed{seed}.tsv"
    threads: config["threads"]["train"]
    resources:
        mem_mb=FEDST["resources"]["mem_mb"],
        runtime=FEDST["resources"]["runtime_min"],
        gpu=1 if config["device"] == "cuda" else 0,
        gpu_mem_mb=gpu_mem_mb(FEDST["resources"]["gpu_mem_mb"]),
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/fedst_train.py"


rule fedst_tables:
    input:
        clients=fedst_run_files("client_metrics.csv"),
        deploy=fedst_run_files("deploy.json"),
        summary=fedst_run_files("summary.json"),
        paper=paper_values_input("fedst"),
        clips=FEDST_CLIPS,
    output:
        md=[f"results/fedst/tables/{t}{STAG}.md" for t in FEDST_TABLES],
        csv=[f"results/fedst/tables/{t}{STAG}.csv" for t in FEDST_TABLES],
    params:
        cfg={k: FEDST[k] for k in ("sites", "outfed_site", "unseen_site", "seeds", "methods", "variants", "indicator", "train",
                                   "eval", "data", "sent", "rsc_communicated", "method_params")},
        origin=SORIGIN,
        tag=STAG,
        init=fedst_init(),
    log:
        "logs/fedst_tables/tables.log",
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/fedst_tables.py"


rule fedst_fig6:
    input:
        clients=fedst_comm_files("client_metrics.csv"),
    output:
        fig=report(f"results/fedst/figures/fig6{STAG}.png", caption="../report/fedst_fig6.rst", category="fedst",
                   subcategory="figures"),
        csv=f"results/fedst/figures/fig6{STAG}.csv",
    params:
        sites=FEDST["sites"],
        base_steps=FEDST["train"]["local_steps"],
        origin=SORIGIN,
    log:
        "logs/fedst_figures/fig6.log",
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/fedst_figures.py"


rule fedst_fig5:
    input:
        clients=fedst_fig5_files("client_metrics.csv"),
    output:
        fig=report(f"results/fedst/figures/fig5{STAG}.png", caption="../report/fedst_fig5.rst", category="fedst",
                   subcategory="figures"),
        csv=f"results/fedst/figures/fig5{STAG}.csv",
    params:
        sites=FEDST["sites"],
        origin=SORIGIN,
    log:
        "logs/fedst_figures/fig5.log",
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/fedst_figures.py"


rule fedst_fig7:
    input:
        clients=fedst_fig7_files("client_metrics.csv"),
    output:
        fig=report(f"results/fedst/figures/fig7{STAG}.png", caption="../report/fedst_fig7.rst", category="fedst",
                   subcategory="figures"),
        csv=f"results/fedst/figures/fig7{STAG}.csv",
    params:
        sites=FEDST["sites"],
        methods=FS.fig7_methods(FEDST),
        origin=SORIGIN,
    log:
        "logs/fedst_figures/fig7.log",
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/fedst_figures.py"
