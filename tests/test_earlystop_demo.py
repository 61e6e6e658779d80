"""The demo's earlystop slice (config/config.yaml) makes its stopping rules fire.

One run of the slice's Fig. 3 configuration (method, setting, first seed, its train block,
synthetic data as the demo builds it), in process: the data-free rule and a validation rule
must both fire within the slice's rounds at its tau and patience, so Fig. 3 shows both
stopping points. A config change that stops the rules firing fails here.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml
from snakemake.utils import validate

from fedmedbench.data import medmnist, synthetic
from fedmedbench.fl.engine import federation as fed
from fedmedbench.fl.spec import RunSpec
from fedmedbench.partition import schemes as P
from fedmedbench.studies.earlystop import report as earlystop
from fedmedbench.workflow import io

ROOT = Path(__file__).resolve().parents[1]


def test_demo_slice_fires_both_rules_of_figure3(tmp_path):
    cfg = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    validate(cfg, str(ROOT / "config" / "schema.yaml"))  # fills the schema defaults
    st, syn = cfg["studies"]["earlystop"], cfg["data"]["synthetic"]
    es = st["early_stopping"]
    dataset, seed = st["datasets"][0], st["seeds"][0]
    setting = st["settings"][es["figure3_setting"]]
    counts = synthetic.default_counts(dataset, {"train": syn["max_train"], "val": syn["max_val"], "test": syn["max_test"]})
    arrays = synthetic.generate(dataset, st["size"], seed=syn["seed"], counts=counts, difficulty=syn["difficulty"],
                                imbalance=syn["imbalance"])
    io.write_npz(tmp_path / "d.npz", arrays)
    labels = {s: arrays[f"{s}_labels"].ravel() for s in medmnist.SPLITS}
    io.write_json(tmp_path / "p.json", P.build_partition(labels, setting["scheme"], setting["num_clients"], seed,
                                                         dict(setting["params"]),
                                                         num_classes=medmnist.dataset_info(dataset).n_classes))
    method = es["figure3_method"]
    spec = RunSpec(run_dir=str(tmp_path / "run"), study="earlystop", dataset=dataset, setting=es["figure3_setting"],
                   method=method, seed=seed, partition_path=str(tmp_path / "p.json"), sources={"base": str(tmp_path / "d.npz")},
                   image_size=st["size"], model=st["model"]["name"],
                   train={**st["train"], **setting.get("train", {}), **st["method_train"].get(method, {})},
                   clients_per_round=st["clients_per_round"], method_params=dict(st["method_params"].get(method, {})),
                   device="cpu", early_stopping={"mode": "none"})
    spec = fed.resolve_data_shapes(spec)
    state = fed.Federation(spec, log=lambda m: None).run(fed.InProcessTransport(spec))
    curves = pd.DataFrame(state.rows).assign(dataset=dataset, setting=es["figure3_setting"], method=method, seed=seed)
    pts = earlystop.stopping_points(curves, [es["tau"]], es["patience"], es["metric"], es["val_min_delta"],
                                    es["counting"], es["never_fired"])
    row = pts.iloc[0]
    assert row["fired_datafree"], "the data-free rule does not fire in the demo's Fig. 3 run"
    assert row["fired_val_loss"] or row["fired_val_acc"], "no validation rule fires in the demo's Fig. 3 run"
