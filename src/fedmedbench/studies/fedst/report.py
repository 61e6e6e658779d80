"""FedST study tables (II-IX) from the runs' client_metrics.csv, deploy.json and summary.json.

Per-site numbers are the last evaluated round of ``client_metrics.csv`` (``local_*``: each
site's own test clips, with its personalised model, or the global model for FedAvg-like
methods). Site E and the binary set come from ``deploy.json`` (the deployed model: shared
parameters + weighted average of the personalised ones). Dice and IoU are in %, HD95 and
ASSD in pixels; cells are mean ± std over seeds (std shown only with more than one seed).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

METRICS = ("dice", "iou", "hd95", "assd")
LABELS = {"dice": "Dice(%)↑", "iou": "IoU(%)↑", "hd95": "HD95(pix.)↓", "assd": "ASSD(pix.)↓"}
METHOD_NAMES = {"seg_local": "Local Train", "seg_centralized": "Upperbound", "seg_fedavg": "FedAvg", "fedrep": "FedRep",
                "feddp": "FedDP", "fedld": "FedLD", "fedas": "FedAS", "fedst": "FedST"}


def load_runs(clients: list[str], deploys: list[str]) -> pd.DataFrame:
    """One row per run: variant, method, seed, ``<site>_<metric>`` of the last evaluated round,
    and every deploy.json entry."""
    rows = []
    for cpath, dpath in zip(sorted(clients), sorted(deploys), strict=True):
        run = Path(cpath).parent
        if run != Path(dpath).parent:
            raise ValueError(f"{cpath} and {dpath} belong to different runs")
        variant, method, seed = run.parent.parent.name, run.parent.name, int(run.name.removeprefix("seed"))
        cm = pd.read_csv(cpath)
        if cm.empty:
            raise ValueError(f"{cpath}: no evaluated round")
        last = cm[cm["round"] == cm["round"].max()]
        row: dict[str, Any] = {"variant": variant, "method": method, "seed": seed}
        for _, r in last.iterrows():
            for m in METRICS:
                row[f"c{int(r['client'])}_{m}"] = float(r[f"local_{m}"])
        row.update(json.loads(Path(dpath).read_text()))
        rows.append(row)
    return pd.DataFrame(rows)


def _scale(metric: str) -> float:
    return 100.0 if metric in ("dice", "iou") else 1.0


def _cell(values: pd.Series, metric: str) -> str:
    v = values.dropna().to_numpy(dtype=float) * _scale(metric)
    if len(v) == 0:
        return "n/a"
    return f"{v.mean():.2f}" if len(v) == 1 else f"{v.mean():.2f} ± {v.std(ddof=0):.2f}"


def _with_avg(runs: pd.DataFrame, sites: list[str]) -> pd.DataFrame:
    runs = runs.copy()
    for m in METRICS:
        runs[f"avg_{m}"] = runs[[f"c{i}_{m}" for i in range(len(sites))]].mean(axis=1)
    return runs


def table2(runs: pd.DataFrame, sites: list[str], methods: list[str]) -> pd.DataFrame:
    runs = _with_avg(runs[runs["variant"] == "main"], sites)
    out = []
    for method in methods:
        sel = runs[runs["method"] == method]
        row = {"Method": METHOD_NAMES[method]}
        for m in METRICS:
            for i, s in enumerate(sites):
                row[f"{LABELS[m]} {s}"] = _cell(sel[f"c{i}_{m}"], m)
            row[f"{LABELS[m]} Avg."] = _cell(sel[f"avg_{m}"], m)
        out.append(row)
    return pd.DataFrame(out)


def table_deploy(runs: pd.DataFrame, methods: list[str], prefix: str) -> pd.DataFrame:
    """Table III (``outfed``) or VIII (``unseen``): the deployed model of each method."""
    sel = runs[runs["variant"] == "main"]
    return pd.DataFrame([{"Method": METHOD_NAMES[m], **{LABELS[k]: _cell(sel[sel["method"] == m][f"{prefix}_{k}"], k) for k in METRICS}}
                         for m in methods])


#: (label, variant, method, flags) rows of tables IV-VII; ``main`` rows reuse the main runs
ROWS: dict[str, list[tuple[str, str, str, dict[str, str]]]] = {
    "table4": [
        ("FedDP baseline", "main", "feddp", {"TS": "", "Prompt": "", "CS": "", "SERQ": ""}),
        ("+TS", "abl_ts", "fedst", {"TS": "✓", "Prompt": "", "CS": "", "SERQ": ""}),
        ("+TS +Prompt", "abl_ts_prompt", "fedst", {"TS": "✓", "Prompt": "✓", "CS": "", "SERQ": ""}),
        ("+TS +Prompt +CS", "abl_ts_cs", "fedst", {"TS": "✓", "Prompt": "✓", "CS": "✓", "SERQ": ""}),
        ("SERQ only", "abl_serq", "fedst", {"TS": "", "Prompt": "", "CS": "", "SERQ": "✓"}),
        ("+TS +SERQ", "abl_ts_serq", "fedst", {"TS": "✓", "Prompt": "", "CS": "", "SERQ": "✓"}),
        ("FedST (full)", "main", "fedst", {"TS": "✓", "Prompt": "✓", "CS": "✓", "SERQ": "✓"}),
    ],
    "table5": [
        ("all shared", "pers_none", "fedst", {"Enc. Attn.q": "", "Dec. Attn.q": "", "Dec. other": ""}),
        ("all personalised", "pers_all", "fedst", {"Enc. Attn.q": "Δ", "Dec. Attn.q": "Δ", "Dec. other": "Δ"}),
        ("decoder q", "pers_dec_q", "fedst", {"Enc. Attn.q": "", "Dec. Attn.q": "Δ", "Dec. other": ""}),
        ("encoder + decoder q", "pers_enc_dec_q", "fedst", {"Enc. Attn.q": "Δ", "Dec. Attn.q": "Δ", "Dec. other": ""}),
        ("encoder q (FedST)", "main", "fedst", {"Enc. Attn.q": "Δ", "Dec. Attn.q": "", "Dec. other": ""}),
    ],
    "table6": [
        ("Norm", "pers_norm", "fedst", {}), ("Key", "pers_k", "fedst", {}), ("Value", "pers_v", "fedst", {}),
        ("Key&Value", "pers_kv", "fedst", {}), ("Query (FedST)", "main", "fedst", {}),
    ],
    "table7": [
        ("Random", "ind_random", "fedst", {}), ("Gaussian", "ind_gaussian", "fedst", {}),
        ("One-hot", "ind_onehot", "fedst", {}), ("CLIP", "ind_clip", "fedst", {}),
    ],
}


def history_cell(fractions: dict[str, float]) -> str:
    """How real each site's clip history is, from the share of its history slots that repeat the current
    frame (``site.json``'s ``history_duplicated_fraction``): real, repeated, or the share repeated."""
    def one(f: float) -> str:
        return "real" if f == 0 else "repeated" if f >= 1 else f"{100 * f:.0f}% repeated"

    return ", ".join(f"{site} {one(f)}" for site, f in fractions.items())


def table_dice_rows(runs: pd.DataFrame, sites: list[str], rows, main_indicator: str,
                    history: dict[str, float] | None = None) -> pd.DataFrame:
    """Dice per site, average and site E for a list of (label, variant, method, flags); a
    variant that is the main run (the configured indicator) reads the main run; one not
    run says so. ``history`` (site -> share of history slots repeating the current frame): a
    "Clip history" column, filled in the rows that use the temporal module (flag ``TS``)."""
    runs = _with_avg(runs, sites)
    out = []
    for label, variant, method, flags in rows:
        if variant == f"ind_{main_indicator}":
            variant = "main"
        sel = runs[(runs["variant"] == variant) & (runs["method"] == method)]
        row = {"Setting": label, **flags}
        for i, s in enumerate(sites):
            row[f"Dice {s}"] = _cell(sel[f"c{i}_dice"], "dice") if len(sel) else "not run"
        row["Dice Avg."] = _cell(sel["avg_dice"], "dice") if len(sel) else "not run"
        row["Dice E (out fed)"] = _cell(sel["outfed_dice"], "dice") if len(sel) else "not run"
        if history is not None:
            row["Clip history"] = history_cell(history) if flags.get("TS") else "no temporal module"
        out.append(row)
    return pd.DataFrame(out)


def _time_cell(rows: pd.DataFrame, column: str) -> str:
    return _cell(rows[column], "time") if column in rows else "n/a"


def table9(runs: pd.DataFrame, methods: list[str]) -> pd.DataFrame:
    """Communication (shared trainable parameters), training time split into local and server
    work (SERQ), FPS at the configured input size."""
    sel = runs[runs["variant"] == "main"]
    out = []
    for m in methods:
        r = sel[sel["method"] == m]
        out.append({"Method": METHOD_NAMES[m],
                    "Cost (MB/round)": f"{r['comm_mb_per_round'].mean():.2f}" if len(r) else "n/a",
                    "Training time (s)": _time_cell(r, "train_time_s"), "Local time (s)": _time_cell(r, "local_time_s"),
                    "Server time (s)": _time_cell(r, "server_time_s"), "FPS": _cell(r["fps"], "fps") if len(r) else "n/a"})
    return pd.DataFrame(out)


def _mean_of(cell: Any) -> float:
    """The mean printed in a cell ("84.73 ± 0.87", "84.73"); NaN for "n/a" / "not run"."""
    try:
        return float(str(cell).split(" ± ")[0])
    except ValueError:
        return float("nan")


#: the run's columns compared with the paper's, per table (same names in config/paper_values/fedst.yaml)
PAPER_COLUMNS: dict[str, list[str]] = {
    "table2": [f"{LABELS[m]} {s}" for m in METRICS for s in ("A", "B", "C", "D", "Avg.")],
    "table3": [LABELS[m] for m in METRICS],
    "table8": [LABELS[m] for m in METRICS],
    "table9": ["Cost (MB/round)", "FPS"],
    **{t: ["Dice A", "Dice B", "Dice C", "Dice D", "Dice Avg.", "Dice E (out fed)"]
       for t in ("table4", "table5", "table6", "table7")},
}


def with_paper(frame: pd.DataFrame, name: str, synthetic: bool, root: str | Path | None = None) -> tuple[pd.DataFrame, str]:
    """``frame`` with ``<column> (paper)`` and ``<column> Δ`` after each compared column (the run's
    mean minus the paper's; empty on synthetic data), and the caption sentence saying where the
    paper's numbers come from. Tables without paper values come back unchanged."""
    from fedmedbench.report import paper_values as PV

    paper = PV.load("fedst", name, **({"root": root} if root else {}))
    cols = [c for c in PAPER_COLUMNS.get(name, []) if c in frame.columns]
    if not cols:
        return frame, PV.note(paper, synthetic)
    numeric = frame.copy()
    for c in cols:
        numeric[c] = [_mean_of(v) for v in frame[c]]
    out = PV.beside(numeric, paper, {c: c for c in cols}, synthetic)
    for c in cols:
        out[c] = frame[c]  # keep the run's "mean ± std" text
    return out, PV.note(paper, synthetic)


def scoring_note(ev: dict[str, Any], input_size: list[int] | None) -> str:
    """Where and by which empty-mask rule the frames were scored (``fedst.eval``, ``fedst.data.input_size``)."""
    res = ev.get("resolution", "input")
    size = f"{input_size[0]}x{input_size[1]}" if input_size else "as stored"
    where = {"input": f"the input size ({size})", "native_units": f"the input size ({size}), HD95/ASSD in native pixels",
             "native": "each mask file's native size"}[res]
    rule = {"diagonal": "Dice = IoU = 0, HD95 = ASSD = the image diagonal",
            "feddp_pixel": "FedDP's one pixel at (0, 0) in an empty prediction, then MedPy"}[ev.get("empty_rule", "diagonal")]
    return (f"Scored at {where} (fedst.eval.resolution: {res}); a part empty in exactly one of prediction / ground "
            f"truth: {rule} (fedst.eval.empty_rule: {ev.get('empty_rule', 'diagonal')}).")


def sent_note(cfg: dict[str, Any]) -> str:
    """The reading each method's communication column is computed with (what its replies carry)."""
    fedst = ("the encoder without its queries" if cfg.get("sent", "table_ix") == "table_ix"
             else "the encoder without its queries, the decoder and head")
    fedst += " + RSC" if cfg.get("rsc_communicated", True) else ""
    feddp = cfg.get("method_params", {}).get("feddp", {}).get("sent", "reference_code")
    feddp_text = "its decoder and head" if feddp == "paper_text" else "every parameter but the encoder queries"
    return (f"MB = MiB (2^20 B) of float32 trainable parameters in one site's reply: FedST {fedst} (fedst.sent: "
            f"{cfg.get('sent', 'table_ix')}, rsc_communicated: {str(cfg.get('rsc_communicated', True)).lower()}); "
            f"FedDP {feddp_text} (method_params.feddp.sent: {feddp}); FedRep the encoder; FedAS all but its classifier; "
            "FedAvg, FedLD every parameter.")


def caption(title: str, origin: str, seeds: list[int], rounds: int) -> str:
    src = ("SYNTHETIC surgical clips (demo data; NOT a reproduction of the paper's numbers)"
           if origin == "synthetic" else "real surgical datasets")
    return f"{title}. Source: {src}; seeds {seeds}; {rounds} rounds."


def to_markdown(frame: pd.DataFrame, cap: str) -> str:
    body = frame.to_markdown(index=False) if not frame.empty else "(no rows)"
    return f"{cap}\n\n{body}\n"


# ----------------------------------------------------------------------------- Fig. 6


def fig6_frame(clients: list[str], sites: list[str], base_steps: int) -> pd.DataFrame:
    """Fig. 6: final Dice (%) per site and average vs the communication interval (local
    iterations per round), mean and std over seeds. ``main`` runs communicate every
    ``base_steps`` iterations, ``comm<k>`` runs every k."""
    rows = []
    for path in clients:
        run = Path(path).parent
        variant = run.parent.parent.name
        k = base_steps if variant == "main" else int(variant.removeprefix("comm"))
        cm = pd.read_csv(path)
        if cm.empty:
            raise ValueError(f"{path}: no evaluated round")
        last = cm[cm["round"] == cm["round"].max()].sort_values("client")
        dice = [float(v) * 100 for v in last["local_dice"]]
        if len(dice) != len(sites):
            raise ValueError(f"{path}: {len(dice)} clients, fedst.sites has {len(sites)}")
        rows += [{"interval": k, "site": s, "dice": d} for s, d in zip(sites, dice, strict=True)]
        rows.append({"interval": k, "site": "Avg.", "dice": sum(dice) / len(dice)})
    frame = pd.DataFrame(rows)
    out = frame.groupby(["interval", "site"], sort=True)["dice"].agg(["mean", lambda v: v.std(ddof=0), "count"])
    out.columns = ["dice_mean", "dice_std", "seeds"]
    return out.reset_index()


def fig6_plot(frame: pd.DataFrame, origin: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    for site, g in frame.groupby("site", sort=False):
        ax.errorbar(g["interval"], g["dice_mean"], yerr=g["dice_std"], marker="o", capsize=2, label=str(site))
    ax.set_xscale("log")
    ax.set_xlabel("local iterations between communications")
    ax.set_ylabel("test Dice (%)")
    ax.legend(fontsize=7)
    tag = " — SYNTHETIC data (not a paper reproduction)" if origin == "synthetic" else ""
    ax.set_title("Fig. 6: communication frequency (FedST)" + tag, fontsize=8)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------- Fig. 5

#: Fig. 5 curves: run variant of FedST -> label (the paper's red, blue and green lines)
FIG5_CURVES = {"main": "SERQ (FedST)", "syn_server": "synthetic fine-tuning on the server",
               "syn_sites": "synthetic data at the sites"}


def fig5_frame(clients: list[str], sites: list[str]) -> pd.DataFrame:
    """Fig. 5: test Dice (%) per evaluated round, per site and their average, for each way of
    using the synthetic clips; mean and std over seeds."""
    rows = []
    for path in clients:
        variant = Path(path).parent.parent.parent.name
        if variant not in FIG5_CURVES:
            raise ValueError(f"{path}: variant {variant!r} is not a Fig. 5 curve {sorted(FIG5_CURVES)}")
        cm = pd.read_csv(path)
        if cm.empty:
            raise ValueError(f"{path}: no evaluated round")
        for rnd, g in cm.groupby("round", sort=True):
            dice = [float(v) * 100 for v in g.sort_values("client")["local_dice"]]
            if len(dice) != len(sites):
                raise ValueError(f"{path}: round {rnd}: {len(dice)} clients, fedst.sites has {len(sites)}")
            base = {"curve": FIG5_CURVES[variant], "round": int(rnd)}
            rows += [{**base, "site": s, "dice": d} for s, d in zip(sites, dice, strict=True)]
            rows.append({**base, "site": "Avg.", "dice": sum(dice) / len(dice)})
    out = pd.DataFrame(rows).groupby(["curve", "site", "round"], sort=True)["dice"].agg(["mean", lambda v: v.std(ddof=0), "count"])
    out.columns = ["dice_mean", "dice_std", "seeds"]
    return out.reset_index()


def fig5_plot(frame: pd.DataFrame, origin: str):
    """One panel per site (average first, as the paper), one line per curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = ["Avg.", *[s for s in dict.fromkeys(frame["site"]) if s != "Avg."]]
    fig, axes = plt.subplots(1, len(panels), figsize=(2.6 * len(panels), 2.8), squeeze=False)
    colours = dict(zip(FIG5_CURVES.values(), ("tab:red", "tab:blue", "tab:green"), strict=True))
    for ax, site in zip(axes[0], panels, strict=True):
        for curve, g in frame[frame["site"] == site].groupby("curve", sort=False):
            ax.plot(g["round"], g["dice_mean"], marker="o", ms=3, color=colours.get(curve), label=str(curve))
            ax.fill_between(g["round"], g["dice_mean"] - g["dice_std"], g["dice_mean"] + g["dice_std"],
                            color=colours.get(curve), alpha=0.2)
        ax.set_title(f"site {site}" if site != "Avg." else "average", fontsize=8)
        ax.set_xlabel("communication round")
    axes[0][0].set_ylabel("test Dice (%)")
    axes[0][0].legend(fontsize=6)
    tag = " — SYNTHETIC data (not a paper reproduction)" if origin == "synthetic" else ""
    fig.suptitle("Fig. 5: ways of using the synthetic data" + tag, fontsize=8)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------- Fig. 7


def fig7_frame(clients: list[str], sites: list[str], methods: list[str]) -> pd.DataFrame:
    """Fig. 7: final test Dice (%) per site and average of each method without (``main``) and
    with (``synmix``: synthetic clips mixed into every site, iterations doubled) synthetic data;
    mean and std over seeds. Rows in ``methods`` order."""
    rows = []
    for path in clients:
        run = Path(path).parent
        variant, method = run.parent.parent.name, run.parent.name
        if variant not in ("main", "synmix"):
            raise ValueError(f"{path}: variant {variant!r} is not a Fig. 7 bar (main or synmix)")
        cm = pd.read_csv(path)
        if cm.empty:
            raise ValueError(f"{path}: no evaluated round")
        dice = [float(v) * 100 for v in cm[cm["round"] == cm["round"].max()].sort_values("client")["local_dice"]]
        if len(dice) != len(sites):
            raise ValueError(f"{path}: {len(dice)} clients, fedst.sites has {len(sites)}")
        base = {"method": METHOD_NAMES[method], "synthetic": variant == "synmix"}
        rows += [{**base, "site": s, "dice": d} for s, d in zip(sites, dice, strict=True)]
        rows.append({**base, "site": "Avg.", "dice": sum(dice) / len(dice)})
    out = pd.DataFrame(rows).groupby(["method", "synthetic", "site"], sort=False)["dice"].agg(["mean", lambda v: v.std(ddof=0), "count"])
    out.columns = ["dice_mean", "dice_std", "seeds"]
    out = out.reset_index()
    order = {METHOD_NAMES[m]: i for i, m in enumerate(methods)}
    return out.sort_values(["method", "synthetic"], key=lambda c: c.map(order) if c.name == "method" else c, kind="stable").reset_index(drop=True)


def fig7_plot(frame: pd.DataFrame, origin: str):
    """One panel per site (average first); light bar without, dark bar with synthetic data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    panels = ["Avg.", *[s for s in dict.fromkeys(frame["site"]) if s != "Avg."]]
    methods = list(dict.fromkeys(frame["method"]))
    fig, axes = plt.subplots(1, len(panels), figsize=((1.2 + 0.45 * len(methods)) * len(panels), 3.4), squeeze=False)
    x = np.arange(len(methods))
    for ax, site in zip(axes[0], panels, strict=True):
        sel = frame[frame["site"] == site]
        for off, syn, alpha, label in ((-0.2, False, 0.4, "without synthetic"), (0.2, True, 1.0, "with synthetic (mixed, 2x iterations)")):
            g = sel[sel["synthetic"] == syn].set_index("method").reindex(methods)
            ax.bar(x + off, g["dice_mean"], 0.4, yerr=g["dice_std"], color="tab:blue", alpha=alpha, label=label, capsize=2)
        ax.set_xticks(x, methods, rotation=60, fontsize=6)
        ax.set_title(f"site {site}" if site != "Avg." else "average", fontsize=8)
    axes[0][0].set_ylabel("test Dice (%)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=6, loc="lower center", ncol=2)
    tag = " — SYNTHETIC data (not a paper reproduction)" if origin == "synthetic" else ""
    fig.suptitle("Fig. 7: with and without synthetic data at the sites" + tag, fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig
