"""Snakemake entry: early-stopping Table 1 (delta acc per setting) or Table 2 (bad configuration)."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench import io
from fedmedbench.report import earlystop
from fedmedbench.runlog import log_to

with log_to(snakemake.log[0]):
    p, rule = snakemake.params, snakemake.rule
    points = earlystop.load_points(snakemake.input[0])
    es = p.es
    if rule == "earlystop_table1":
        table = earlystop.table1(points, es["tau"], list(p.settings), list(p.methods))
        what, label = ("Table 1: test-metric difference (points) between the data-free stopping point and the best "
                       "validation-based stopping point."), "tab:earlystop-table1"
        tau = es["tau"]
    else:
        table = earlystop.table2(points, es["bad_setting"], es["table2_tau"], list(p.methods))
        what, label = (f"Table 2: deliberately bad configuration '{es['bad_setting']}': metric at r*, r*, and differences "
                       "to the best validation-based stopping point."), "tab:earlystop-table2"
        tau = es["table2_tau"]
    cap = earlystop.caption(what, p.origin, list(p.seeds), tau, es["patience"], es["metric"]) + f" Models: {p.init}."
    io.write_csv(snakemake.output.csv, table)
    earlystop.write_markdown_latex(table, cap, snakemake.output.md, snakemake.output.tex, label)
