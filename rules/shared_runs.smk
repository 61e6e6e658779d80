# A run whose inputs do not depend on the setting (a centralized run on the same pooled data) trains once,
# in its home setting (rules/train.smk), and is shown in every other such setting by a copy of its files
# (fedmedbench.studies.grid.shared_runs): each setting's table keeps its row, the DAG has one training job.


include: "grid_common.smk"


ruleorder: show_shared_run > train_federated


rule show_shared_run:
    input:
        unpack(shown_run_home),
    output:
        metrics="results/{shown_run}/metrics.csv",
        clients="results/{shown_run}/client_metrics.csv",
        summary="results/{shown_run}/summary.json",
        model="results/{shown_run}/model.pt",
    wildcard_constraints:
        shown_run=SHOWN_RUN_PATTERN,
    params:
        setting=shown_run_setting,
    log:
        "logs/show_shared_run/{shown_run}.log",
    threads: 1
    resources:
        mem_mb=500,
        runtime=5,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/show_shared_run.py"
