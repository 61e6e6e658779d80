# Study fedst: config checks, wildcard constraints and target helpers (rules in fedst.smk).
import fedmedbench.studies.fedst.runs as FS
from fedmedbench.fl.spec import result_params

FEDST = config["fedst"]
FEDST_CLIPS = f"{SURG}/clips"
FEDST_TABLES = ["table2", "table3", "table4", "table5", "table6", "table7", "table8", "table9"]


def _check_fedst_config():
    if not FEDST["enabled"]:
        return
    sites = SURGICAL["sites"]
    for key in ("outfed_site", "unseen_site", "server_site"):
        if FEDST[key] not in sites:
            _config_error(f"fedst.{key}", f"'{FEDST[key]}' is not a surgical.sites entry {sorted(sites)}")
    for s in FEDST["sites"]:
        if s not in sites:
            _config_error("fedst.sites", f"'{s}' is not a surgical.sites entry {sorted(sites)}")
        elif sites[s].get("role", "federated") != "federated":
            _config_error("fedst.sites", f"site '{s}' has role {sites[s]['role']}, not federated")
    m = FEDST["model"]
    if len(m["pools"]) != len(m["fields"]):
        _config_error("fedst.model.fields", f"needs one entry per entry of fedst.model.pools ({len(m['pools'])})")
    if len(m["pools"]) != SURGICAL["clips"]["num_previous"] + 1:
        _config_error("fedst.model.pools", f"needs one entry per clip frame (surgical.clips.num_previous + 1 = "
                      f"{SURGICAL['clips']['num_previous'] + 1})")
    if "ind_clip" in FEDST["variants"] or FEDST["indicator"]["kind"] == "clip":
        if not FEDST["indicator"]["clip_weights"]:
            _config_error("fedst.indicator.clip_weights", "the CLIP indicator (kind clip or variant ind_clip) needs an open_clip "
                          "weight set (e.g. clip_vit_b32_laion2b, docs/weights.md); or use kind onehot/gaussian/random and drop ind_clip")
    if FEDST["indicator"]["kind"] != "clip" and FEDST["model"]["indicator_dim"] < len(sites):
        _config_error("fedst.model.indicator_dim", f"must be >= the number of sites ({len(sites)}) for one-hot indicators")
    if FEDST["fig6"]["intervals"] and FEDST["train"]["local_steps"] is None:
        _config_error("fedst.fig6.intervals", "needs fedst.train.local_steps (iterations per round); or set intervals: []")
    if FEDST["fig7"]["methods"] and FEDST["train"]["local_steps"] is None:
        _config_error("fedst.fig7.methods", "needs fedst.train.local_steps (iterations per round, doubled); or set methods: []")
    unknown = set(FEDST["method_params"]) - set(FEDST["methods"])
    if unknown:
        _config_error("fedst.method_params", f"{sorted(unknown)} are not among fedst.methods")


_check_fedst_config()


def _fedst_weight(key, name):
    return (weights_file(weight_set_name(name, key)), weights_manifest(name)) if name else (None, None)


FEDST_ENCODER_FILE, FEDST_ENCODER_MANIFEST = _fedst_weight("fedst.model.encoder_weights", FEDST["model"]["encoder_weights"])
FEDST_CLIP_FILE, FEDST_CLIP_MANIFEST = _fedst_weight("fedst.indicator.clip_weights", FEDST["indicator"]["clip_weights"])
#: the fedst block with weight-set names resolved to the files the jobs load
FEDST_RUN = {**FEDST, "model": {**FEDST["model"], "encoder_weights": FEDST_ENCODER_FILE},
             "indicator": {**FEDST["indicator"], "clip_weights": FEDST_CLIP_FILE}}


def fedst_weights(variant="main"):
    """Manifests a job loads: the encoder's always, CLIP's when the job's indicator is CLIP."""
    out = [FEDST_ENCODER_MANIFEST] if FEDST_ENCODER_MANIFEST else []
    if FEDST_CLIP_MANIFEST and FS.indicator_config(FEDST, variant)["kind"] == "clip":
        out.append(FEDST_CLIP_MANIFEST)
    return out


def fedst_run_dir(w):
    return f"results/fedst/{w.sites}/{w.variant}/{w.method}/seed{w.seed}"


def fedst_pretrained(w):
    return f"results/fedst/{w.sites}/pretrain/seed{w.seed}/pretrained.pt" if FEDST["pretrain"]["enabled"] else []


def fedst_spec(w):
    pre = fedst_pretrained(w) or None
    # result fields only: threads come from the job (fedmedbench.fl.spec.for_job), so changing them reruns nothing
    return result_params(FS.run_spec(FEDST_RUN, w.variant, w.method, int(w.seed), FEDST_CLIPS, fedst_run_dir(w), pre,
                                     config["device"], config["threads"]["train"], SORIGIN))


def fedst_run_files(name):
    key = FS.sites_key(FEDST)
    return [f"results/fedst/{key}/{v}/{m}/seed{s}/{name}" for v, m, s in FS.runs(FEDST)]


def fedst_comm_files(name):
    """Fig. 6 runs: the main FedST run and every comm<k> variant."""
    key = FS.sites_key(FEDST)
    return [f"results/fedst/{key}/{v}/fedst/seed{s}/{name}" for v in ["main", *FS.comm_variants(FEDST)] for s in FEDST["seeds"]]


def fedst_fig5_files(name):
    """Fig. 5 runs: SERQ (the main FedST run) and the two other uses of the synthetic clips."""
    key = FS.sites_key(FEDST)
    return [f"results/fedst/{key}/{v}/fedst/seed{s}/{name}" for v in ["main", *FS.fig5_variants(FEDST)] for s in FEDST["seeds"]]


def fedst_fig7_files(name):
    """Fig. 7 runs: each listed method without (main) and with (synmix) synthetic data at the sites."""
    key = FS.sites_key(FEDST)
    return [f"results/fedst/{key}/{v}/{m}/seed{s}/{name}" for m in FS.fig7_methods(FEDST) for v in ("main", FS.SYNMIX)
            for s in FEDST["seeds"]]


def fedst_targets():
    """Every fedst output the config asks for (added to rule all)."""
    if not FEDST["enabled"]:
        return []
    out = [f"results/fedst/tables/{t}{STAG}.md" for t in FEDST_TABLES]
    if FS.comm_variants(FEDST) and "fedst" in FEDST["methods"]:
        out.append(f"results/fedst/figures/fig6{STAG}.png")
    if FS.fig5_variants(FEDST):
        out.append(f"results/fedst/figures/fig5{STAG}.png")
    if FS.fig7_methods(FEDST):
        out.append(f"results/fedst/figures/fig7{STAG}.png")
    return out


wildcard_constraints:
    sites="[A-Za-z0-9]+",
    variant="|".join(["main", *FS.VARIANTS, *FS.FIG5_VARIANTS, FS.SYNMIX, "comm[0-9]+"]),
