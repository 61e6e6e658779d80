"""Snakemake entry: early-stopping Table 1 (delta acc per setting) or Table 2 (bad configuration)."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench.workflow import io
from fedmedbench.studies.earlystop import report as earlystop
from fedmedbench.workflow.runlog import log_to

with log_to(snakemake.log[0]):
    p, rule = snakemake.params, snakemake.rule
    points = earlystop.load_points(snakemake.input[0])
    es = p.es
    synthetic = p.origin == "synthetic"
    if rule == "earlystop_table1":
        settings = [s for s in p.settings if s != es["bad_setting"]]  # Table 1: the partitions only
        table = earlystop.table1(points, es["tau"], settings, list(p.methods))
        table, paper = earlystop.with_paper(table, p.study, "table1", {s: s for s in settings}, synthetic)
        what, label = ("Table 1: test-metric difference (points) between the data-free stopping point and the best "
                       "validation-based stopping point."), "tab:earlystop-table1"
        tau, dropped = es["tau"], earlystop.dropped_note(points, es["tau"], settings)
    else:
        table = earlystop.table2(points, es["bad_setting"], es["table2_tau"], list(p.methods), es["round_numbering"])
        table, paper = earlystop.with_paper(table, p.study, "table2", {c: c for c in ("acc", "r_star", "delta_acc",
                                                                                       "delta_r")}, synthetic)
        what = (f"Table 2: deliberately bad configuration '{es['bad_setting']}': metric at r*, r* "
                f"({es['round_numbering'].replace('_', '-')} round index), and differences to the best "
                "validation-based stopping point (delta_r against the earlier validation stop).")
        label = "tab:earlystop-table2"
        tau, dropped = es["table2_tau"], earlystop.dropped_note(points, es["table2_tau"], [es["bad_setting"]])
    cap = " ".join([earlystop.caption(what, p.origin, list(p.seeds), tau, es["patience"], es["metric"]),
                    f"Models: {p.init}.", dropped, paper])
    io.write_csv(snakemake.output.csv, table)
    earlystop.write_markdown_latex(table, cap, snakemake.output.md, snakemake.output.tex, label)
