# UltraFlwr study (docs/ultraflwr.md): federated YOLO on the surgical YOLO exports, 14 full /
# partial aggregation strategies + the per-client centralized baseline, then Table I (from the
# model), Tables II/III (top strategies per setting), Figure 3 (validation mAP50 per round) and
# the measured communication per client and round. Runs and specs: fedmedbench.studies.ultraflwr.runs.
import fedmedbench.studies.ultraflwr.runs as UFR

UF = config["ultraflwr"]
UF_DIR = UFR.DIR

UFR.check_config(UF, SURGICAL)


def ultraflwr_weights():
    """(weight file, manifests) of the YOLO model: server, every client and the centralized baseline."""
    return model_weights(UF["model"], "ultraflwr.model")


def ultraflwr_spec(wildcards):
    return UFR.run_spec(UF, wildcards, SURG, ultraflwr_weights()[0], config["device"], SORIGIN)


def ultraflwr_group_index(wildcards):
    return UFR.group_index(UF, wildcards.ugroup)


def ultraflwr_group_inputs(wildcards):
    runs = ultraflwr_group_index(wildcards)
    return {part: [r[part] for r in runs] for part in ("clients", "metrics", "comm")}


def ultraflwr_comm_index():
    return UFR.comm_index(UF)


def ultraflwr_targets():
    """Every UltraFlwr output the config asks for (added to rule all)."""
    return UFR.targets(UF, STAG)
