"""Snakemake entry: FedST study tables II-IX (markdown + csv) from the runs' outputs."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
import json
from pathlib import Path

from fedmedbench.workflow import io
from fedmedbench.studies.fedst import report as R
from fedmedbench.workflow.runlog import log_to

TITLES = {
    "table2": "Table II: sites A-D and average, personalised models on each site's test clips",
    "table3": "Table III: out-of-federation site, deployed model (weighted average of the personalised models)",
    "table4": "Table IV: ablation of TS / prompt / CS / SERQ (Dice %)",
    "table5": "Table V: which attention layers are personalised (Dice %)",
    "table6": "Table VI: personalised layers of the PVT backbone (Dice %)",
    "table7": "Table VII: indicator of the channel selection (Dice %)",
    "table8": "Table VIII: unseen binary set (all parts = foreground), deployed model",
    "table9": ("Table IX: communication per client and round (shared trainable float32 parameters), training time "
               "(wall time of the whole run, engine start-up included), inference FPS (batch 1)"),
}

with log_to(snakemake.log[0]) as log:
    cfg = dict(snakemake.params.cfg)
    runs = R.load_runs(list(snakemake.input.clients), list(snakemake.input.deploy))
    sites, methods = list(cfg["sites"]), list(cfg["methods"])
    kind = cfg["indicator"]["kind"]
    clip_sites = json.loads((Path(snakemake.input.clips) / "sites.json").read_text())["sites"]
    history = {s: float(clip_sites[s]["history_duplicated_fraction"]) for s in [*sites, cfg["outfed_site"]]}
    tables = {
        "table2": R.table2(runs, sites, methods),
        "table3": R.table_deploy(runs, methods, "outfed"),
        "table4": R.table_dice_rows(runs, sites, R.ROWS["table4"], kind, history),
        "table5": R.table_dice_rows(runs, sites, R.ROWS["table5"], kind),
        "table6": R.table_dice_rows(runs, sites, R.ROWS["table6"], kind),
        "table7": R.table_dice_rows(runs, sites, R.ROWS["table7"], kind),
        "table8": R.table_deploy(runs, methods, "unseen"),
        "table9": R.table9(runs, methods),
    }
    for name, frame in tables.items():
        stem = name + snakemake.params.tag  # _synthetic on demo data
        md = next(p for p in snakemake.output.md if Path(p).stem == stem)
        csv = next(p for p in snakemake.output.csv if Path(p).stem == stem)
        cap = R.caption(TITLES[name], snakemake.params.origin, cfg["seeds"], cfg["train"]["rounds"])
        cap += f" Models: {snakemake.params.init}."
        if name in ("table3", "table8"):
            cap += f" Site: {cfg['outfed_site'] if name == 'table3' else cfg['unseen_site']}."
        if name != "table9":
            cap += " " + R.scoring_note(cfg["eval"], cfg["data"]["input_size"])
        else:
            cap += " " + R.sent_note(cfg)
        if name == "table4":
            cap += (" Clip history: the share of each site's history slots (0.2 s apart) that repeat the current frame "
                    "because its release has no frame there (docs/fedst.md, Sites).")
        frame, paper_note = R.with_paper(frame, name, snakemake.params.origin == "synthetic")
        cap += " " + paper_note
        io.write_csv(csv, frame)
        io.write_text(md, R.to_markdown(frame, cap))
        log(f"{name}: {len(frame)} rows")
    log("done")
