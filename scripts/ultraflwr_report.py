"""Snakemake entry for the UltraFlwr report rules (Table I, Tables II/III, Figure 3, communication)."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench.studies.ultraflwr import report as U
from fedmedbench.workflow.runlog import log_to

with log_to(snakemake.log[0]) as log:
    rule, p, out = snakemake.rule, snakemake.params, snakemake.output
    if rule == "ultraflwr_table1":
        t = U.table1(p.cfg, p.nc)
        cap = (f"UltraFlwr Table I: state_dict elements saved per client per round vs full aggregation, "
               f"computed from {p.cfg} with {p.nc} classes, per component split; paper_saved = the paper's Table I.")
        U.write_table(t, t, cap, out.csv, out.md, out.tex, "tab:ultraflwr_table1")
        log(t.to_string())
    elif rule == "ultraflwr_top_strategies":
        group = snakemake.wildcards.ugroup
        scores = U.id_cd(U.pair_matrix(U.collect(list(p.runs))))
        ranked, shown = U.top_strategies(scores, p.top_k)
        shown, paper_note = U.with_paper(shown, group, p.origin == "synthetic")
        cap = (f"UltraFlwr Tables II/III, group {group}: top-{p.top_k} strategies per setting by federated ID mAP50 "
               f"(%), mean and std (ddof=1) over clients x seed sets, from the ID/CD matrix (ID = own test split, "
               f"CD = mean over the other clients' test splits); -C = per-client centralized; local model selected "
               f"by {p.select} epoch ({p.select_metric}). {paper_note} Source: {U.source_note(p.origin)}. "
               f"Models: {p.init}.")
        U.write_table(ranked, shown, cap, out.csv, out.md, out.tex, f"tab:ultraflwr_{group}")
        log(shown.to_string())
    elif rule == "ultraflwr_matrix":
        group = snakemake.wildcards.ugroup
        mean, wide = U.matrix_table(U.pair_matrix(U.collect(list(p.runs))))
        cap = (f"UltraFlwr ID/CD matrix, group {group}: mAP50 (%) of the final model of client i (row) on the test "
               f"split of client j (column), mean over seed sets; the diagonal is ID, the rest CD. The .csv holds "
               f"mAP50 and mAP50-95 means, stds and counts. Source: {U.source_note(p.origin)}. Models: {p.init}.")
        U.write_table(mean, wide, cap, out.csv, out.md, out.tex, f"tab:ultraflwr_matrix_{group}")
    elif rule == "ultraflwr_figure3":
        U.figure3(U.curves(list(p.runs)), snakemake.wildcards.ugroup, p.origin, out[0])
    elif rule == "ultraflwr_communication":
        t = U.communication(list(p.runs))
        cap = (f"UltraFlwr: measured bytes sent per client per round (fp32 arrays). Source: {U.source_note(p.origin)}. "
               f"Models: {p.init}.")
        U.write_table(t, t, cap, out.csv, out.md, out.tex, "tab:ultraflwr_communication")
    else:
        raise ValueError(f"unknown rule {rule}")
