# Study fedst: glue from the rules (fedst.smk) to fedmedbench.studies.fedst.runs (runs, checks, targets).
import fedmedbench.studies.fedst.runs as FS
from fedmedbench.fl.spec import result_params

FEDST = config["fedst"]
FEDST_CLIPS = f"{SURG}/clips"
FEDST_TABLES = FS.TABLES

FS.check_config(FEDST, SURGICAL)


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


def fedst_job_weights(wildcards):
    """The manifests a job of the job's variant loads (``fedst_weights``)."""
    return fedst_weights(wildcards.variant)


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
    return FS.targets(FEDST, STAG)


wildcard_constraints:
    sites="[A-Za-z0-9]+",
    variant="|".join(["main", *FS.VARIANTS, *FS.FIG5_VARIANTS, FS.SYNMIX, "comm[0-9]+"]),
