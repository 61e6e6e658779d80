"""Snakemake entry for the UltraFlwr report rules (Table I, Tables II/III, Figure 3, communication)."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench.report import ultraflwr as U
from fedmedbench.runlog import log_to

with log_to(snakemake.log[0]) as log:
    rule, p, out = snakemake.rule, snakemake.params, snakemake.output
    if rule == "ultraflwr_table1":
        t = U.table1(p.cfg, p.nc)
        cap = (f"UltraFlwr Table I: state_dict elements saved per client per round vs full aggregation, "
               f"computed from {p.cfg} with {p.nc} classes, per component split; paper_saved = the paper's Table I.")
        U.write_table(t, t, cap, out.csv, out.md, out.tex, "tab:ultraflwr_table1")
        log(t.to_string())
    elif rule == "ultraflwr_top_strategies":
        ranked, shown = U.top_strategies(U.collect(list(p.runs)), p.top_k)
        cap = (f"UltraFlwr Tables II/III, group {snakemake.wildcards.ugroup}: top-{p.top_k} strategies per setting by "
               f"federated ID mAP50 (%), mean±std over clients x seed sets; -C = per-client centralized. "
               f"Source: {U.source_note(p.origin)}. Models: {p.init}.")
        U.write_table(ranked, shown, cap, out.csv, out.md, out.tex, f"tab:ultraflwr_{snakemake.wildcards.ugroup}")
        log(shown.to_string())
    elif rule == "ultraflwr_figure3":
        U.figure3(U.curves(list(p.runs)), snakemake.wildcards.ugroup, p.origin, out[0])
    elif rule == "ultraflwr_communication":
        t = U.communication(list(p.runs))
        cap = (f"UltraFlwr: measured bytes sent per client per round (fp32 arrays). Source: {U.source_note(p.origin)}. "
               f"Models: {p.init}.")
        U.write_table(t, t, cap, out.csv, out.md, out.tex, "tab:ultraflwr_communication")
    else:
        raise ValueError(f"unknown rule {rule}")
