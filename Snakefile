# fedmedbench: one DAG from MedMNIST files to the papers' tables and figures.
# Config: config/config.yaml (embedded demo) or --configfile config/studies/<study>.yaml
from snakemake.utils import min_version

min_version("9.0")


# Config files are re-read strictly first (duplicate keys rejected, errors with file and line).
# A config error is one line naming the file (or --config) and key (FEDMEDBENCH_DEBUG=1: with its traceback);
# jobs learn the config files and --config from the environment, to name them in their errors.
import os

from fedmedbench.compat import patch_snakemake_params_reason
from fedmedbench.config.check import check_files
from fedmedbench.workflow.diagnostics import announce, exit_on_config_error

CONFIG_FILES = [str(f) for f in workflow.overwrite_configfiles or ["config/config.yaml"]]
announce(CONFIG_FILES, workflow.config_settings.config)  # an error names the file, or --config, that sets its key
with exit_on_config_error(CONFIG_FILES):
    check_files(CONFIG_FILES)
# a job rerun because its params changed names the changed keys, old -> new
patch_snakemake_params_reason()


# The embedded demo is the default; `--configfile X` runs X alone (not merged with the demo).
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"



with exit_on_config_error(CONFIG_FILES):

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


# The report's landing text shows its first page (rule report_landing) once that is built.
report: "report/workflow.rst" if os.path.exists(REPORT_LANDING) else "report/workflow_pending.rst"


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
    report_landing,


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
