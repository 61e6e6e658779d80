"""fedst config: schema defaults and errors, cross-field checks naming the dotted key."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import schema_error
from snakemake.utils import validate

from fedmedbench.studies.fedst import runs as FS

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = str(ROOT / "config" / "schema.yaml")
DEMO = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())


def test_demo_and_full_grid_validate_with_defaults():
    demo = copy.deepcopy(DEMO)
    validate(demo, SCHEMA)
    f = demo["fedst"]
    assert f["serq"]["lambda2"] == 0.3 and f["serq"]["mu"] == 0.5 and f["loss"]["dice_weight"] == 0.3
    assert f["train"]["optimizer"] == "adamw" and f["train"]["aggregation"] == "uniform"
    demo_runs = FS.runs(f)  # demo slices of Figs. 5 and 7: one extra run each
    assert ("syn_server", "fedst", 0) in demo_runs and not any(v == "syn_sites" for v, _, _ in demo_runs)
    assert [r for r in demo_runs if r[0] == "synmix"] == [("synmix", "seg_fedavg", 0)]
    full = yaml.safe_load((ROOT / "config" / "studies" / "fedst.yaml").read_text())
    validate(full, SCHEMA)
    assert full["fedst"]["model"]["pools"] == [7, 4, 2, 1] and full["fedst"]["model"]["fields"] == [49, 20, 6, 7]
    runs = FS.runs(full["fedst"])  # every method x 3 seeds + every variant but the main run's indicator + Figs. 5, 6
    assert len(runs) == 3 * (8 + len(FS.VARIANTS) - 1 + 4 + 2 + 8)  # Fig. 7: every method as synmix
    assert ("synmix", "seg_local", 1) in runs and ("synmix", "fedst", 0) in runs
    assert ("syn_server", "fedst", 2) in runs and ("syn_sites", "fedst", 2) in runs
    assert full["fedst"]["train"]["local_steps"] == 100 and ("comm10", "fedst", 0) in runs and ("comm100", "fedst", 0) not in runs
    assert ("ind_clip", "fedst", 0) not in runs and ("ind_onehot", "fedst", 0) in runs
    assert full["fedst"]["method_params"]["fedas"]["align_mode"] == "eval"


def test_every_variant_and_method_resolves_to_a_spec():
    demo = copy.deepcopy(DEMO)
    validate(demo, SCHEMA)
    cfg = demo["fedst"]
    spec = FS.run_spec(cfg, "abl_serq", "fedst", 0, "clips", "run", None, "cpu", 1, "synthetic")
    assert spec["task_params"]["model"]["temporal"] is False and spec["method_params"]["serq"]["enabled"] is True
    # sent: table_ix (Table IX): the decoder and head stay on the site, RSC is shared (rsc_communicated: true)
    assert spec["method_params"]["personal"] == ["enc_q", "decoder"]
    main = FS.run_spec(cfg, "main", "fedst", 0, "clips", "run", None, "cpu", 1, "synthetic")
    assert main["method_params"]["personal"] == ["enc_q", "cs", "decoder"]
    old = FS.run_spec({**cfg, "sent": "table_v", "rsc_communicated": False}, "main", "fedst", 0, "clips", "run", None, "cpu",
                      1, "synthetic")
    assert old["method_params"]["personal"] == ["enc_q", "cs", "rsc"]  # Table V row 5 + Sec. IV-D2
    assert FS.run_spec({**cfg, "rsc_communicated": False}, "main", "fedst", 0, "clips", "run", None, "cpu", 1,
                       "synthetic")["method_params"]["personal"] == ["enc_q", "cs", "decoder", "rsc"]

    def personal(variant):
        return FS.run_spec(cfg, variant, "fedst", 0, "clips", "run", None, "cpu", 1, "synthetic")["method_params"]["personal"]

    assert personal("pers_all") == ["all"]
    assert personal("pers_none") == [] and personal("pers_dec_q") == ["dec_q", "cs"]  # Table V's rows name the decoder
    assert personal("pers_k") == ["enc_k", "cs", "decoder"]  # Table VI's rows follow sent
    base = FS.run_spec(cfg, "main", "fedrep", 0, "clips", "run", None, "cpu", 1, "synthetic")
    assert base["task_params"]["model"]["selection"] == "none" and "serq" not in base["method_params"]
    for v in FS.VARIANTS:
        FS.run_spec(cfg, v, "fedst", 0, "clips", "run", None, "cpu", 1, "synthetic")
    # Fig. 5: the server fine-tunes instead of SERQ / SERQ off and the sites fine-tune serq.steps steps
    server = FS.run_spec(cfg, "syn_server", "fedst", 0, "clips", "run", None, "cpu", 1, "synthetic")["method_params"]
    assert server["serq"]["enabled"] and server["serq"]["server"] == "finetune" and server["site_finetune"] == 0
    sites = FS.run_spec(cfg, "syn_sites", "fedst", 0, "clips", "run", None, "cpu", 1, "synthetic")["method_params"]
    assert not sites["serq"]["enabled"] and sites["site_finetune"] == cfg["serq"]["steps"]
    assert main["method_params"]["serq"]["server"] == "serq" and main["method_params"]["site_finetune"] == 0
    # Fig. 7: synthetic clips of the server site mixed into the sites, iterations doubled
    mix = FS.run_spec(cfg, "synmix", "seg_fedavg", 0, "clips", "run", None, "cpu", 1, "synthetic")["task_params"]
    assert mix["synthetic_mix"] == cfg["server_site"] and mix["local_steps"] == 2 * cfg["train"]["local_steps"]
    assert main["task_params"]["synthetic_mix"] is None
    # FedAS: the grid's alignment mode reaches the job's params
    grid = yaml.safe_load((ROOT / "config" / "studies" / "fedst.yaml").read_text())
    validate(grid, SCHEMA)
    fedas = FS.run_spec(grid["fedst"], "main", "fedas", 0, "clips", "run", None, "cpu", 1, "real")["method_params"]
    assert fedas["align_mode"] == "eval"
    # metrics: the class rule reaches the task (default every part in every frame)
    assert main["task_params"]["class_rule"] == "all_classes"
    endovis = {**cfg, "eval": {**cfg["eval"], "class_rule": "gt_classes"}}
    assert FS.run_spec(endovis, "main", "fedst", 0, "clips", "run", None, "cpu", 1, "synthetic")["task_params"]["class_rule"] == "gt_classes"
    # the empty-mask rule reaches the task (default the diagonal; FedDP's pixel as option)
    assert main["task_params"]["empty_rule"] == "diagonal"
    feddp_rule = {**cfg, "eval": {**cfg["eval"], "empty_rule": "feddp_pixel"}}
    assert FS.run_spec(feddp_rule, "main", "fedst", 0, "clips", "run", None, "cpu", 1, "synthetic")["task_params"]["empty_rule"] == "feddp_pixel"
    # where frames are scored: off its default only (the default keeps earlier runs' hashes)
    assert "metrics_device" not in main["task_params"]
    numpy_path = {**cfg, "eval": {**cfg["eval"], "metrics_device": "cpu"}}
    assert FS.run_spec(numpy_path, "main", "fedst", 0, "clips", "run", None, "cpu", 1, "synthetic")["task_params"]["metrics_device"] == "cpu"


@pytest.mark.parametrize("path,value,needle", [
    (["fedst", "methods"], ["fedfoo"], "'fedfoo' is not one of"),
    (["fedst", "variants"], ["pers_x"], "'pers_x' is not one of"),
    (["fedst", "model", "encoder"], "resnet50", "does not match"),
    (["fedst", "indicator", "kind"], "bert", "'bert' is not one of"),
    (["fedst", "eval", "metrics_device"], "gpu", "'gpu' is not one of"),
    (["fedst", "serq", "mu"], 2, "mu"),
    (["fedst", "method_params"], {"fedas": {"align_mode": "batch"}}, "'batch' is not one of"),
    (["fedst", "method_params"], {"fedas": {"alignmode": "eval"}}, "Additional properties are not allowed"),
])
def test_schema_errors_name_the_key(path, value, needle):
    assert needle in schema_error(DEMO, path, value, SCHEMA)


@pytest.mark.parametrize("mutate,needle", [
    (lambda f: f.update(variants=["ind_clip"]), "fedst.indicator.clip_weights"),
    (lambda f: f["model"].update(pools=[2, 1, 1], fields=[4, 3, 2]), "fedst.model.pools"),
    (lambda f: f["model"].update(fields=[4, 3, 2]), "fedst.model.fields"),
    (lambda f: f.update(outfed_site="Z"), "fedst.outfed_site"),
])
def test_cross_field_errors_name_the_key(tmp_path, mutate, needle):
    cfg = copy.deepcopy(DEMO)
    mutate(cfg["fedst"])
    f = tmp_path / "cfg.yaml"
    f.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--quiet", "--configfile", str(f)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert needle in proc.stdout + proc.stderr


def test_a_new_pretrained_model_changes_the_run_hash(tmp_path):
    """A redone pre-training must not let a rerun resume the old checkpoint."""
    from fedmedbench.fl.spec import RunSpec

    demo = copy.deepcopy(DEMO)
    validate(demo, SCHEMA)
    pre = tmp_path / "pretrained.pt"
    spec = RunSpec.from_dict(FS.run_spec(demo["fedst"], "main", "fedst", 0, "clips", "run", str(pre), "cpu", 1, "synthetic"))
    pre.write_bytes(b"first")
    h1 = FS.pin_initial_model(spec).run_hash()
    pre.write_bytes(b"second")
    assert FS.pin_initial_model(spec).run_hash() != h1
    pre.unlink()
    with pytest.raises(FileNotFoundError, match="pretrain"):
        FS.pin_initial_model(spec)


@pytest.mark.parametrize("model,ok", [
    ({"heads": 8}, True), ({"heads": 3}, False),  # encoder level 1: 64 channels
    ({"temporal_level": 2, "heads": 5}, True), ({"temporal_level": 2, "heads": 3}, False),  # 160 channels
    ({"temporal_at": "decoder", "heads": 8}, True), ({"temporal_at": "decoder", "heads": 3}, False),  # FPN: 128
    ({"temporal_at": "decoder", "decoder": "light", "decoder_dim": 64, "heads": 8}, True),
    ({"temporal_at": "decoder", "decoder": "light", "decoder_dim": 60, "heads": 8}, False),  # RSC could not be built
    ({"temporal_at": "decoder", "decoder": "light", "decoder_dim": 60, "heads": 8, "temporal": False}, True),  # no RSC
])
def test_rsc_heads_must_divide_the_map_it_reads(model, ok):
    from fedmedbench.config.check import ConfigError

    cfg = copy.deepcopy(DEMO)
    validate(cfg, SCHEMA)
    cfg["fedst"]["model"].update(model)
    if ok:
        FS.check_config(cfg["fedst"], cfg["surgical"])
    else:
        with pytest.raises(ConfigError, match="fedst.model.heads"):
            FS.check_config(cfg["fedst"], cfg["surgical"])


def test_the_listed_pvt_widths_are_timms():
    """The config check's encoder widths (no torch while planning) are the levels timm builds."""
    import timm

    import fedmedbench  # noqa: F401  (compat first)

    for name in ("pvt_v2_b0", "pvt_v2_b1"):
        net = timm.create_model(name, pretrained=False, num_classes=0)
        assert tuple(f["num_chs"] for f in net.feature_info) == FS.PVT_V2_CHANNELS[name]
    assert {FS.PVT_V2_CHANNELS[f"pvt_v2_b{i}"] for i in range(1, 6)} == {(64, 128, 320, 512)}
