"""The FedST study: which runs exist and how one run's RunSpec is resolved from the ``fedst``
config block. The workflow reads this module while it plans, so it imports no torch; the
synthetic pre-training is in :mod:`.pretrain`, the deployed model's evaluation in :mod:`.deploy`.

A run = sites x variant x method x seed. Variant ``main`` runs every method with its own
architecture (baselines: PVT-v2 + decoder, no temporal module, no channel selection, as
FedST's Table IV row 1; FedST: RSC temporal module + channel selection + SERQ). The other
variants are FedST with one thing changed, one per row of Tables IV-VII (:data:`VARIANTS`).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from fedmedbench.config.check import config_error
from fedmedbench.metrics.scoring import SCORING_DEFAULTS

#: architecture of the baselines and of FedST in variant ``main``
BASELINE_MODEL = {"temporal": False, "selection": "none"}
FEDST_MODEL = {"temporal": True, "selection": "cs"}
#: FedST's personal groups (Sec. III-B: encoder queries rho + the channel-selection network)
FEDST_PERSONAL = ("enc_q", "cs")
#: ``fedst.sent``: what a FedST site sends. ``table_ix`` (Table IX's 12.69 MB: the encoder without its
#: queries + RSC; the decoder and head stay on the site with the queries and the selection network);
#: ``table_v`` (Table V row 5: only the queries and the selection network stay, the decoder is shared)
SENT = ("table_ix", "table_v")
#: groups ``sent: table_ix`` adds to FedST's personal ones
TABLE_IX_PERSONAL = ("decoder",)
#: Table V's rows name the decoder's part themselves: ``sent`` does not change them
TABLE_V_VARIANTS = ("pers_none", "pers_all", "pers_dec_q", "pers_enc_dec_q")
#: encoder level widths of the PVT-v2 variants (timm's ``feature_info``; ``tests/test_fedst_config.py``)
PVT_V2_CHANNELS = {"pvt_v2_b0": (32, 64, 160, 256), **{f"pvt_v2_b{i}": (64, 128, 320, 512) for i in range(1, 6)}}
BASELINES = ("seg_local", "seg_centralized", "seg_fedavg", "fedrep", "feddp", "fedld", "fedas")
METHODS = (*BASELINES, "fedst")

#: FedST variants: model overrides, SERQ on/off, personal groups, indicator kind
VARIANTS: dict[str, dict[str, Any]] = {
    # Table IV (row 1 = main/feddp, row 7 = main/fedst)
    "abl_ts": {"model": {"temporal": True, "selection": "none"}, "serq": False, "personal": ["enc_q"]},
    "abl_ts_prompt": {"model": {"temporal": True, "selection": "prompt"}, "serq": False, "personal": ["enc_q", "cs"]},
    "abl_ts_cs": {"model": {"temporal": True, "selection": "cs"}, "serq": False, "personal": ["enc_q", "cs"]},
    "abl_serq": {"model": {"temporal": False, "selection": "none"}, "serq": True, "personal": ["enc_q"]},
    "abl_ts_serq": {"model": {"temporal": True, "selection": "none"}, "serq": True, "personal": ["enc_q"]},
    # Table V (row 5 = main/fedst)
    "pers_none": {"personal": []},
    "pers_all": {"personal": ["all"]},
    "pers_dec_q": {"personal": ["dec_q", "cs"]},
    "pers_enc_dec_q": {"personal": ["enc_q", "dec_q", "cs"]},
    # Table VI (row 5 = main/fedst)
    "pers_norm": {"personal": ["enc_norm", "cs"]},
    "pers_k": {"personal": ["enc_k", "cs"]},
    "pers_v": {"personal": ["enc_v", "cs"]},
    "pers_kv": {"personal": ["enc_k", "enc_v", "cs"]},
    # Table VII (the main run uses fedst.indicator.kind)
    "ind_random": {"indicator": "random"},
    "ind_gaussian": {"indicator": "gaussian"},
    "ind_onehot": {"indicator": "onehot"},
    "ind_clip": {"indicator": "clip"},
}

#: Fig. 5 curves other than SERQ (= main/fedst): FedST without SERQ, the synthetic clips used
#: to fine-tune the averaged model on the server, or to fine-tune each site's model locally
FIG5_VARIANTS: dict[str, dict[str, Any]] = {
    "syn_server": {"server": "finetune"},
    "syn_sites": {"serq": False, "site_finetune": True},
}


def sites_key(cfg: dict[str, Any]) -> str:
    return "".join(cfg["sites"])


def comm_variants(cfg: dict[str, Any]) -> list[str]:
    """Fig. 6: FedST communicating every k local iterations (``comm<k>``); k = train.local_steps is the main run."""
    base = cfg["train"].get("local_steps")
    return [f"comm{k}" for k in cfg.get("fig6", {}).get("intervals", []) if k != base]


def comm_interval(variant: str) -> int | None:
    return int(variant.removeprefix("comm")) if variant.startswith("comm") and variant[4:].isdigit() else None


#: Fig. 7: a method with the synthetic clips mixed into every site's training set, iterations doubled
SYNMIX = "synmix"


def fig7_methods(cfg: dict[str, Any]) -> list[str]:
    return [m for m in cfg.get("fig7", {}).get("methods", []) if m in cfg["methods"]]


def fig5_variants(cfg: dict[str, Any]) -> list[str]:
    """Fig. 5: the other ways of using the synthetic clips (FedST runs) the config asks for."""
    if "fedst" not in cfg["methods"]:
        return []
    return [v for v in cfg.get("fig5", {}).get("variants", list(FIG5_VARIANTS)) if v in FIG5_VARIANTS]


def runs(cfg: dict[str, Any]) -> list[tuple[str, str, int]]:
    """(variant, method, seed) of every run the config asks for (duplicates of main left out)."""
    out = [("main", m, s) for m in cfg["methods"] for s in cfg["seeds"]]
    for v in [*cfg["variants"], *comm_variants(cfg), *fig5_variants(cfg)]:
        if v == f"ind_{cfg['indicator']['kind']}":
            continue  # the same run as main/fedst
        out += [(v, "fedst", s) for s in cfg["seeds"]]
    out += [(SYNMIX, m, s) for m in fig7_methods(cfg) for s in cfg["seeds"]]
    return out


#: the paper's tables the study reproduces (rule fedst_tables)
TABLES = ("table2", "table3", "table4", "table5", "table6", "table7", "table8", "table9")


def check_config(cfg: dict[str, Any], surgical: dict[str, Any]) -> None:
    """Cross-checks of the ``fedst`` block against ``surgical`` (sites, clip length, indicator weights)."""
    if not cfg["enabled"]:
        return
    sites = surgical["sites"]
    for key in ("outfed_site", "unseen_site", "server_site"):
        if cfg[key] not in sites:
            config_error(f"fedst.{key}", f"'{cfg[key]}' is not a surgical.sites entry {sorted(sites)}")
    for s in cfg["sites"]:
        if s not in sites:
            config_error("fedst.sites", f"'{s}' is not a surgical.sites entry {sorted(sites)}")
        elif sites[s].get("role", "federated") != "federated":
            config_error("fedst.sites", f"site '{s}' has role {sites[s]['role']}, not federated")
    m = cfg["model"]
    if len(m["pools"]) != len(m["fields"]):
        config_error("fedst.model.fields", f"needs one entry per entry of fedst.model.pools ({len(m['pools'])})")
    if len(m["pools"]) != surgical["clips"]["num_previous"] + 1:
        config_error("fedst.model.pools", f"needs one entry per clip frame (surgical.clips.num_previous + 1 = "
                     f"{surgical['clips']['num_previous'] + 1})")
    size = cfg["data"]["input_size"]
    if m.get("decoder", "fpn") == "fpn" and size is not None and any(int(side) % 32 for side in size):
        config_error("fedst.data.input_size", f"{list(size)}: the FPN decoder (fedst.model.decoder: fpn) needs sides "
                     "divisible by 32 (e.g. [480, 480]); or model.decoder: light")
    if m.get("temporal") is not False:
        channels, name = rsc_width(m)
        if channels % int(m.get("heads", 8)):
            config_error("fedst.model.heads", f"{m.get('heads')} must divide the {name} {channels} channels (RSC's width)")
    if "ind_clip" in cfg["variants"] or cfg["indicator"]["kind"] == "clip":
        if not cfg["indicator"]["clip_weights"]:
            config_error("fedst.indicator.clip_weights", "the CLIP indicator (kind clip or variant ind_clip) needs an open_clip "
                         "weight set (e.g. clip_vit_b32_laion2b, docs/weights.md); or use kind onehot/gaussian/random and drop ind_clip")
    if cfg["indicator"]["kind"] != "clip" and cfg["model"]["indicator_dim"] < len(sites):
        config_error("fedst.model.indicator_dim", f"must be >= the number of sites ({len(sites)}) for one-hot indicators")
    if cfg["fig6"]["intervals"] and cfg["train"]["local_steps"] is None:
        config_error("fedst.fig6.intervals", "needs fedst.train.local_steps (iterations per round); or set intervals: []")
    if cfg["fig7"]["methods"] and cfg["train"]["local_steps"] is None:
        config_error("fedst.fig7.methods", "needs fedst.train.local_steps (iterations per round, doubled); or set methods: []")
    unknown = set(cfg["method_params"]) - set(cfg["methods"])
    if unknown:
        config_error("fedst.method_params", f"{sorted(unknown)} are not among fedst.methods")


def rsc_width(m: dict[str, Any]) -> tuple[int, str]:
    """The channels RSC and channel selection work on (``fedst.model``) and what they are."""
    if m.get("temporal_at", "encoder") == "decoder":
        if m.get("decoder", "fpn") == "fpn":
            return 128, "FPN decoder's"
        return int(m.get("decoder_dim", 64)), "light decoder's (model.decoder_dim)"
    level = int(m.get("temporal_level", 1))
    return PVT_V2_CHANNELS[m.get("encoder", "pvt_v2_b0")][level], f"encoder level {level}'s (model.temporal_level)"


def targets(cfg: dict[str, Any], tag: str) -> list[str]:
    """Every fedst output the config asks for (added to rule all)."""
    if not cfg["enabled"]:
        return []
    out = [f"results/fedst/tables/{t}{tag}.md" for t in TABLES]
    if comm_variants(cfg) and "fedst" in cfg["methods"]:
        out.append(f"results/fedst/figures/fig6{tag}.png")
    if fig5_variants(cfg):
        out.append(f"results/fedst/figures/fig5{tag}.png")
    if fig7_methods(cfg):
        out.append(f"results/fedst/figures/fig7{tag}.png")
    return out


def train_config(cfg: dict[str, Any], variant: str) -> tuple[dict[str, Any], int | None]:
    """The run's ``train`` block (without local_steps) and its local steps per round. A Fig. 6
    variant ``comm<k>`` trains k iterations per round for as many rounds as keep the total
    number of iterations of the main run (rounds x local_steps)."""
    train = {k: v for k, v in cfg["train"].items() if k != "local_steps"}
    steps = cfg["train"].get("local_steps")
    k = comm_interval(variant)
    if k is not None:
        if steps is None:
            raise ValueError("fedst.fig6.intervals needs fedst.train.local_steps (iterations per round), not null")
        train["rounds"] = max(1, round(int(cfg["train"]["rounds"]) * int(steps) / k))
        steps = k
    if variant == SYNMIX:  # Fig. 7: twice the iterations, so the sites see as much real data as without mixing
        if steps is None:
            raise ValueError("fedst.fig7.methods needs fedst.train.local_steps (iterations per round), not null")
        steps = 2 * int(steps)
    return train, steps


def model_config(cfg: dict[str, Any], variant: str, method: str) -> dict[str, Any]:
    model = dict(cfg["model"])
    model.update(FEDST_MODEL if method == "fedst" else BASELINE_MODEL)
    model.update(VARIANTS.get(variant, {}).get("model", {}))
    return model


def indicator_config(cfg: dict[str, Any], variant: str) -> dict[str, Any]:
    ind = dict(cfg["indicator"])
    if "indicator" in VARIANTS.get(variant, {}):
        ind["kind"] = VARIANTS[variant]["indicator"]
    ind["dim"] = int(cfg["model"]["indicator_dim"])
    return ind


def method_params(cfg: dict[str, Any], variant: str, method: str, clips_root: str) -> dict[str, Any]:
    params = copy.deepcopy(cfg["method_params"].get(method, {}))
    var = {**VARIANTS, **FIG5_VARIANTS}.get(variant, {})
    if method == "fedst":
        personal = list(var.get("personal", params.get("personal", FEDST_PERSONAL)))
        if "all" not in personal:
            if cfg["sent"] == "table_ix" and variant not in TABLE_V_VARIANTS:
                personal += [g for g in TABLE_IX_PERSONAL if g not in personal]  # Table IX: the decoder stays
            if not cfg["rsc_communicated"]:
                personal.append("rsc")  # Sec. IV-D2: the temporal module is not communicated
        params["personal"] = personal
        serq = dict(cfg["serq"])
        serq.update(enabled=bool(var.get("serq", True)), server=var.get("server", "serq"), clips_root=clips_root, site=cfg["server_site"],
                    input_size=cfg["data"]["input_size"], cache_mb=int(cfg["data"]["cache_mb"]),
                    num_frames=len(cfg["model"]["pools"]), indicator=indicator_config(cfg, variant), loss=dict(cfg["loss"]))
        params["serq"] = serq
        # Fig. 5 "synthetic data at the sites": each site fine-tunes on the synthetic clips after
        # its local iterations, as many steps as the server would take (serq.steps)
        params["site_finetune"] = int(cfg["serq"]["steps"]) if var.get("site_finetune") else 0
    return params


def pretrain_params(cfg: dict[str, Any], clips_root: str) -> dict[str, Any]:
    """Everything the synthetic pre-training job depends on (its ``params:``)."""
    return {"clips_root": clips_root, "site": cfg["server_site"], "model": model_config(cfg, "main", "fedst"),
            "indicator": indicator_config(cfg, "main"), "loss": dict(cfg["loss"]), **cfg["pretrain"],
            "input_size": cfg["data"]["input_size"], "cache_mb": int(cfg["data"]["cache_mb"]),
            "batch_size": cfg["train"]["batch_size"]}


def run_spec(cfg: dict[str, Any], variant: str, method: str, seed: int, clips_root: str, run_dir: str,
             pretrained: str | None, device: str, threads: int, origin: str) -> dict[str, Any]:
    """The RunSpec dict of one run (travels through ``params:``: every hyper-parameter is in it)."""
    return {
        "run_dir": run_dir, "study": "fedst", "dataset": sites_key(cfg), "setting": variant, "method": method,
        "seed": int(seed), "partition_path": "", "sources": {}, "image_size": 0, "model": "fedst_net",
        "pretrained_path": pretrained, "train": train_config(cfg, variant)[0], "clients_per_round": None,
        "method_params": method_params(cfg, variant, method, clips_root), "device": device, "threads": int(threads),
        "data_origin": origin, "log_every": 1, "eval_every": int(cfg["eval"]["eval_every"]),
        "task": "segmentation",
        "task_params": {
            "clips_root": clips_root, "sites": list(cfg["sites"]), "model": model_config(cfg, variant, method),
            "indicator": indicator_config(cfg, variant), "loss": dict(cfg["loss"]),
            "input_size": cfg["data"]["input_size"], "cache_mb": int(cfg["data"]["cache_mb"]),
            "local_steps": train_config(cfg, variant)[1],
            "synthetic_mix": cfg["server_site"] if variant == SYNMIX else None,
            "cross_site_eval": bool(cfg["eval"]["cross_site_eval"]), "eval_batch_size": int(cfg["eval"]["batch_size"]),
            **scoring_config(cfg),
        },
    }


def scoring_config(cfg: dict[str, Any]) -> dict[str, str]:
    """How frames are scored (``eval``): class rule, ASSD definition, resolution, and ``metrics_device`` only
    off its default ``auto`` (where a frame is scored moves ASSD by float64 rounding only, so runs from before the
    option keep their hash); unset keys take :data:`fedmedbench.metrics.scoring.SCORING_DEFAULTS`, as the evaluation does."""
    ev = cfg["eval"]
    out = {key: ev.get(key, default) for key, default in SCORING_DEFAULTS.items()}
    if out["metrics_device"] == SCORING_DEFAULTS["metrics_device"]:
        del out["metrics_device"]
    return out


def pin_initial_model(spec):
    """The spec with the pre-trained file's SHA-256 in ``task_params.init_sha256``.

    The path alone does not change when the pre-training is redone, so without this a rerun
    would resume the old run's checkpoint (the resume guard compares spec hashes)."""
    import hashlib
    from dataclasses import replace

    if not spec.pretrained_path:
        return spec
    path = Path(spec.pretrained_path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: pre-trained model not found (fedst pretrain)")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return replace(spec, task_params={**spec.task_params, "init_sha256": digest})
