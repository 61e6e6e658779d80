"""Snakemake entry: GPAF paper Table 1 for one dataset (methods x metric x setting) as CSV, Markdown, LaTeX."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench.report import paper_values
from fedmedbench.studies.gpaf import report as gpaf
from fedmedbench.workflow.runlog import log_to

with log_to(snakemake.log[0]) as log:
    w, p = snakemake.wildcards, snakemake.params
    table_eval = p.report["table_eval"]
    runs = gpaf.table_runs(snakemake.input.summaries, snakemake.input.metrics, table_eval)
    settings = {name: p.settings[name] for name in p.setting_order}  # config order (params may reorder dicts)
    paper = paper_values.load(w.study, "table1")
    if paper is not None and not any(str(r.get("dataset")) == w.dataset for r in paper.rows):
        paper = None  # the paper's Table 1 is for another dataset of the study
    synthetic = p.origin == "synthetic"
    columns = gpaf.table_columns(p.report["table_metrics"], table_eval)
    long, display = gpaf.table1(runs, columns, p.report["method_order"], settings, paper, synthetic)
    gpaf.write_table1(long, display, runs, snakemake.output, study=w.study, dataset=w.dataset, origin=p.origin,
                      paper=paper, init=p.init, table_eval=table_eval)
    log(f"{len(runs)} runs -> Table 1 with {len(display)} methods")
