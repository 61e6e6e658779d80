# fedmedbench: one DAG from MedMNIST files to the papers' tables and figures.
# Config: config/config.yaml (embedded demo) or --configfile config/studies/<study>.yaml
from snakemake.utils import min_version

min_version("9.0")


# Config files are re-read strictly first (duplicate keys rejected, errors with file and line).
from fedmedbench.configcheck import check_files

check_files(workflow.overwrite_configfiles or ["config/config.yaml"])


# The embedded demo is the default; `--configfile X` runs X alone (not merged with the demo).
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"



report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/weights.smk"
include: "rules/data.smk"
include: "rules/partition.smk"
include: "rules/train.smk"
include: "rules/shared_runs.smk"
include: "rules/report.smk"
include: "rules/surgical.smk"
include: "rules/report_earlystop.smk"
include: "rules/report_gpaf.smk"
include: "rules/ultraflwr.smk"
include: "rules/fedst.smk"
include: "rules/deploy.smk"
include: "rules/report_html.smk"


# Quick steps run on the submitting node, not as cluster jobs.
localrules:
    all,
    aggregate_results,
    plot_study,
    show_shared_run,
    earlystop_stopping_points,
    earlystop_table1,
    earlystop_table2,
    earlystop_figures,
    gpaf_table1,
    gpaf_convergence,
    ultraflwr_table1,
    ultraflwr_top_strategies,
    ultraflwr_matrix,
    ultraflwr_figure3,
    ultraflwr_communication,
    fedst_tables,
    report_table_html,


if config["cluster"]["local_downloads"]:

    localrules:
        download_medmnist,


rule all:
    input:
        all_targets(),
        surgical_targets(),
        ultraflwr_targets(),
        fedst_targets(),
        report_html_targets(),
    default_target: True
