"""Pretrained weight sets: fetched from a loopback hub / release server, verified, loaded safely and completely.

The served files are small but real: a timm convnextv2_atto as safetensors, a YOLO11n ``.pt``
saved by Ultralytics from its yaml, an open_clip state dict (a one-layer ViT config).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.weight_server import COMMIT, weight_server

from fedmedbench.weights import layout
from fedmedbench.weights.fetch import FetchError, fetch, pin, verify
from fedmedbench.weights.safeload import WeightsError, load_backbone, unwrap

TINY_CLIP = {"embed_dim": 32, "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 16, "head_width": 16},
             "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1}}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Bomb:
    """Unpickling this runs ``touch <marker>`` (what a crafted weight file would do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Real checkpoint bytes in the formats the weight sets use."""
    import open_clip
    import safetensors.torch
    import timm
    from ultralytics import YOLO

    d = tmp_path_factory.mktemp("weightfiles")
    torch.manual_seed(0)
    convnext = timm.create_model("convnextv2_atto", pretrained=False, num_classes=10)
    safetensors.torch.save_file(convnext.state_dict(), d / "model.safetensors")
    yolo = YOLO("yolo11n.yaml")
    yolo.save(d / "yolo11n.pt")
    (d / "clip").mkdir()
    (d / "clip" / "tiny-clip-test.json").write_text(json.dumps(TINY_CLIP))
    open_clip.add_model_config(d / "clip")
    clip = open_clip.create_model("tiny-clip-test", pretrained=None)
    torch.save(clip.state_dict(), d / "open_clip_pytorch_model.bin")
    bomb = d / "bomb.pt"
    torch.save({"weight": torch.zeros(1), "payload": Bomb(d / "never")}, bomb)
    return {"convnext": (d / "model.safetensors").read_bytes(), "yolo": (d / "yolo11n.pt").read_bytes(),
            "clip": (d / "open_clip_pytorch_model.bin").read_bytes(), "bomb": bomb.read_bytes(), "dir": d}


@pytest.fixture(scope="module")
def server(files):
    with weight_server() as s:
        s.serve("/timm/convnextv2_atto.test/resolve/main/model.safetensors", files["convnext"])
        s.serve("/v8.4.0/yolo11n.pt", files["yolo"])
        s.serve("/laion/tiny-clip/resolve/main/open_clip_pytorch_model.bin", files["clip"])
        s.serve("/timm/broken/resolve/main/model.safetensors", files["convnext"], "html")
        s.serve("/v8.4.0/html.pt", files["yolo"], "html")
        s.serve("/v8.4.0/cut.pt", files["yolo"], "truncate")
        s.serve("/v8.4.0/bomb.pt", files["bomb"])
        yield s


def hub_entry(server, repo="timm/convnextv2_atto.test", filename="model.safetensors", sha256=None):
    return {"source": "hf_hub", "repo_id": repo, "filename": filename, "revision": "main",
            "base_url": server.url, "sha256": sha256, "licence": "test"}


def asset_entry(server, asset="yolo11n.pt", sha256=None):
    return {"source": "ultralytics", "release": "v8.4.0", "asset": asset, "base_url": server.url, "sha256": sha256}


# ----------------------------------------------------------------------------- fetch


def test_hub_fetch_verifies_records_manifest_and_rerun_is_a_noop(server, files, tmp_path):
    out = tmp_path / "convnext"
    entry = hub_entry(server, sha256=sha(files["convnext"]))
    m = fetch("convnext", entry, out, log=lambda *_: None)
    assert (out / "model.safetensors").read_bytes() == files["convnext"]
    on_disk = json.loads((out / "manifest.json").read_text())
    assert on_disk == m
    assert m["sha256"] == sha(files["convnext"]) and m["size"] == len(files["convnext"])
    assert m["resolved_revision"] == COMMIT and m["licence"] == "test"
    assert m["url"] == f"{server.url}/timm/convnextv2_atto.test/resolve/main/model.safetensors"
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "model.safetensors"]  # no cache left
    hits = dict(server.hits)
    mtime = (out / "manifest.json").stat().st_mtime_ns
    fetch("convnext", entry, out, log=lambda *_: None)
    assert server.hits == hits and (out / "manifest.json").stat().st_mtime_ns == mtime
    assert verify(out / "model.safetensors") == m["sha256"]


def test_release_asset_fetch_without_pinned_hash_records_it_and_later_use_verifies(server, files, tmp_path):
    out = tmp_path / "yolo"
    m = fetch("yolo", asset_entry(server), out, log=lambda *_: None)
    assert m["sha256"] == sha(files["yolo"]) and not m["sha256_pinned"]
    assert m["url"] == f"{server.url}/v8.4.0/yolo11n.pt"
    data = bytearray(files["yolo"])
    data[-30] ^= 1
    (out / "yolo11n.pt").write_bytes(bytes(data))  # changed after the fetch
    with pytest.raises(FetchError, match="differs from the manifest"):
        verify(out / "yolo11n.pt")


def test_hub_mirror_from_hf_endpoint(server, files, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    m = fetch("c", {**hub_entry(server), "base_url": None}, tmp_path / "c", log=lambda *_: None)
    assert m["url"].startswith(server.url + "/timm/") and m["sha256"] == sha(files["convnext"])


def test_file_already_in_place_with_the_pinned_hash_is_adopted_without_download(server, files, tmp_path):
    out = tmp_path / "c"
    out.mkdir()
    (out / "model.safetensors").write_bytes(files["convnext"])
    entry = hub_entry(server, repo="timm/not-served", sha256=sha(files["convnext"]))
    assert fetch("c", entry, out, log=lambda *_: None)["sha256"] == sha(files["convnext"])
    assert "/timm/not-served/resolve/main/model.safetensors" not in server.hits


def test_checksum_mismatch_names_file_and_both_hashes_and_leaves_nothing(server, files, tmp_path):
    wrong = "0" * 64
    with pytest.raises(FetchError) as err:
        fetch("c", hub_entry(server, sha256=wrong), tmp_path / "c", log=lambda *_: None)
    msg = str(err.value)
    assert "model.safetensors" in msg and wrong in msg and sha(files["convnext"]) in msg
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("kind", ["hub", "release"])
def test_http_404_is_named_and_leaves_nothing(server, tmp_path, kind):
    entry = hub_entry(server, repo="timm/absent") if kind == "hub" else asset_entry(server, asset="absent.pt")
    with pytest.raises(FetchError, match="HTTP 404"):
        fetch("x", entry, tmp_path / "x", log=lambda *_: None)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("kind", ["hub", "release"])
def test_html_error_page_is_refused(server, tmp_path, kind):
    entry = hub_entry(server, repo="timm/broken") if kind == "hub" else asset_entry(server, asset="html.pt")
    with pytest.raises(FetchError, match="HTML"):
        fetch("x", entry, tmp_path / "x", log=lambda *_: None)
    assert not (tmp_path / "x").exists()


def test_truncated_download_is_refused(server, files, tmp_path):
    with pytest.raises(FetchError, match="truncated|failed"):
        fetch("x", asset_entry(server, asset="cut.pt"), tmp_path / "x", log=lambda *_: None)
    assert not (tmp_path / "x").exists()
    half = tmp_path / "half.safetensors"  # a cut-off file placed offline: the size in its header is not met
    half.write_bytes(files["convnext"][: len(files["convnext"]) // 2])
    with pytest.raises(FetchError, match="truncated"):
        fetch("y", {"source": "url", "url": "http://unused.invalid/half.safetensors", "path": str(half)},
              tmp_path / "y", log=lambda *_: None)


def test_offline_path_is_copied_and_checked_without_network(files, tmp_path):
    src = files["dir"] / "yolo11n.pt"
    entry = {"source": "ultralytics", "release": "v8.4.0", "asset": "yolo11n.pt", "base_url": "http://127.0.0.1:9",
             "path": str(src), "sha256": sha(files["yolo"])}
    m = fetch("yolo", entry, tmp_path / "y", log=lambda *_: None)
    assert (tmp_path / "y" / "yolo11n.pt").read_bytes() == files["yolo"] and m["path"] == str(src)
    with pytest.raises(FetchError, match="mismatch"):
        fetch("bad", {**entry, "sha256": "f" * 64}, tmp_path / "b", log=lambda *_: None)
    with pytest.raises(FetchError, match="not found"):
        fetch("gone", {**entry, "path": str(tmp_path / "none.pt")}, tmp_path / "g", log=lambda *_: None)


def test_catalogue_merge_and_urls():
    sets = layout.weight_sets({"yolo11n_coco": {"path": "/data/yolo11n.pt"}}, str(Path(__file__).parents[1] / layout.CATALOGUE))
    assert sets["yolo11n_coco"]["asset"] == "yolo11n.pt" and sets["yolo11n_coco"]["path"] == "/data/yolo11n.pt"
    assert layout.download_url(sets["yolo11n_coco"]) == "https://github.com/ultralytics/assets/releases/download/v8.4.0/yolo11n.pt"
    assert layout.download_url(sets["pvt_v2_b0_in1k"], "https://mirror.example") == \
        "https://mirror.example/timm/pvt_v2_b0.in1k/resolve/main/model.safetensors"
    assert layout.weight_path("clip_vit_b32_laion2b", sets["clip_vit_b32_laion2b"]) == \
        "resources/weights/clip_vit_b32_laion2b/open_clip_model.safetensors"
    with pytest.raises(ValueError, match="weights.mine.repo_id"):
        layout.weight_sets({"mine": {"source": "hf_hub", "filename": "x", "revision": "main"}}, None)


# ----------------------------------------------------------------------------- loading


def _fetched(server, tmp_path, name, entry):
    out = tmp_path / name
    m = fetch(name, entry, out, log=lambda *_: None)
    return out / m["file"], out / "manifest.json"


def test_timm_model_gets_the_served_weights_with_a_new_head(server, files, tmp_path):
    import safetensors.torch

    from fedmedbench.models import build_model

    path, _ = _fetched(server, tmp_path, "convnext", hub_entry(server))
    served = safetensors.torch.load(files["convnext"])
    model = build_model("timm:convnextv2_atto", 3, 7, 64, pretrained_path=str(path))
    own = model.state_dict()
    body = [k for k in own if not k.startswith("head.fc.")]
    assert len(body) == len(served) - 2 and all(torch.equal(own[k], served[k]) for k in body)
    assert own["head.fc.weight"].shape == (7, 320)  # re-initialised for the task's 7 classes


def test_yolo_gets_the_served_coco_weights_except_the_class_layers(server, files, tmp_path):
    from fedmedbench.fl.tasks.detection.yolo import build_yolo
    from fedmedbench.weights.models import read_yolo_checkpoint, yolo_head_prefixes

    path, _ = _fetched(server, tmp_path, "yolo", asset_entry(server))
    served = read_yolo_checkpoint(files["dir"] / "yolo11n.pt")
    model = build_yolo("yolo11n.yaml", 3, seed=0, weights=str(path))
    own = model.state_dict()
    head = yolo_head_prefixes(model)
    body = [k for k in own if not any(k.startswith(h + ".") for h in head)]
    assert head == ("model.23.cv3",)
    assert len(body) > 400 and all(torch.equal(own[k], served[k]) for k in body)
    assert own["model.23.cv3.0.2.weight"].shape[0] == 3 and served["model.23.cv3.0.2.weight"].shape[0] == 80


def test_open_clip_text_encoder_from_a_fetched_set(server, files, tmp_path):
    import open_clip

    from fedmedbench.fl.tasks.segmentation.indicators import _clip_indicators

    path, _ = _fetched(server, tmp_path, "clip", hub_entry(server, repo="laion/tiny-clip", filename="open_clip_pytorch_model.bin"))
    served = torch.load(files["dir"] / "open_clip_pytorch_model.bin", weights_only=True)
    model = open_clip.create_model("tiny-clip-test", pretrained=None)
    from fedmedbench.weights.models import load_open_clip

    assert len(load_open_clip(model, path).loaded) == len(served)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in served.items())
    sites = {"A": {"prompt": "site A nephrectomy"}, "B": {"prompt": "site B lobectomy"}}
    emb = _clip_indicators(sites, {"clip_weights": str(path), "clip_model": "tiny-clip-test"}, 32)
    tok = open_clip.get_tokenizer("tiny-clip-test")
    with torch.no_grad():
        ref = torch.nn.functional.normalize(model.eval().encode_text(tok(["site A nephrectomy"])).float(), dim=-1)[0]
    assert torch.allclose(emb["A"], ref, atol=1e-6)


def test_training_job_starts_round_0_from_the_fetched_weights(server, files, tmp_path):
    """Federation.initial_state is what the server broadcasts in round 1 (and theta_0 of early stopping)."""
    import safetensors.torch
    from helpers import split_labels

    from fedmedbench.data import synthetic
    from fedmedbench.fl.engine import federation as fed
    from fedmedbench.fl.spec import RunSpec
    from fedmedbench.partition import schemes as P
    from fedmedbench.workflow import io

    path, manifest = _fetched(server, tmp_path, "convnext", hub_entry(server))
    arrays = synthetic.generate("bloodmnist", 64, seed=0, counts={"train": 80, "val": 16, "test": 16})
    io.write_npz(tmp_path / "b.npz", arrays)
    io.write_json(tmp_path / "p.json", P.build_partition(split_labels(arrays), "iid", 2, 0, {}, num_classes=8))
    spec = RunSpec(run_dir=str(tmp_path / "run"), study="t", dataset="bloodmnist", setting="iid", method="fedavg", seed=0,
                   partition_path=str(tmp_path / "p.json"), sources={"base": str(tmp_path / "b.npz")}, image_size=64,
                   model="timm:convnextv2_atto", pretrained_path=str(path), device="cpu",
                   train={"rounds": 1, "local_epochs": 1, "batch_size": 16, "lr": 0.01})
    spec = pin(spec, [manifest])
    assert spec.weights_sha256 == {"convnext": sha(files["convnext"])}
    spec = fed.resolve_data_shapes(spec)
    state = fed.Federation(spec, lambda *_: None).initial_state()
    served = safetensors.torch.load(files["convnext"])
    assert state.round == 0
    assert set(state.arrays) - set(served) == set() and {"head.fc.weight", "head.fc.bias"} <= set(state.arrays)
    for k, v in served.items():
        if not k.startswith("head.fc."):
            assert np.array_equal(np.asarray(state.arrays[k]), v.numpy()), k
    assert np.asarray(state.arrays["head.fc.weight"]).shape == (8, 320)


# ----------------------------------------------------------------------------- safety and completeness


def _bomb_places():
    from fedmedbench.fl.tasks.detection.yolo import build_yolo
    from fedmedbench.fl.tasks.segmentation.indicators import _clip_indicators
    from fedmedbench.models import build_model
    from fedmedbench.models.fedst.encoder import PVTEncoder

    return {
        "model.pretrained_path": lambda p: build_model("cnn_small", 1, 2, 28, pretrained_path=str(p)),
        "timm model.weights": lambda p: build_model("timm:convnextv2_atto", 3, 2, 64, pretrained_path=str(p)),
        "ultraflwr.model.weights": lambda p: build_yolo("yolo11n.yaml", 2, seed=0, weights=str(p)),
        "fedst.model.encoder_weights": lambda p: PVTEncoder("pvt_v2_b0", str(p)),
        "fedst.indicator.clip_weights": lambda p: _clip_indicators({"A": {"prompt": "x"}}, {"clip_weights": str(p)}, 512),
    }


@pytest.mark.parametrize("place", ["model.pretrained_path", "timm model.weights", "ultraflwr.model.weights",
                                   "fedst.model.encoder_weights", "fedst.indicator.clip_weights", "fetched set"])
def test_pickle_bomb_is_refused_everywhere_and_runs_nothing(server, tmp_path, place):
    marker = tmp_path / "exploded"
    bomb = tmp_path / "bomb.pt"
    torch.save({"weight": torch.zeros(1), "payload": Bomb(marker)}, bomb)
    if place == "fetched set":  # fetching verifies bytes, never unpickles; loading the fetched file is refused
        server.serve("/v8.4.0/bomb2.pt", bomb.read_bytes())
        bomb, _ = _fetched(server, tmp_path, "bomb", asset_entry(server, asset="bomb2.pt"))
        assert not marker.exists()
        place = "model.pretrained_path"
    with pytest.raises(WeightsError, match="refused"):
        _bomb_places()[place](bomb)
    assert not marker.exists()


def test_the_bomb_is_live(tmp_path):
    """Guard for the test above: an unsafe load of the same file does run its payload."""
    marker = tmp_path / "exploded"
    torch.save({"payload": Bomb(marker)}, tmp_path / "b.pt")
    torch.load(tmp_path / "b.pt", weights_only=False)
    assert marker.exists()


def _small():
    from fedmedbench.models import build_model

    torch.manual_seed(1)
    return build_model("cnn_small", 1, 3, 28)


@pytest.mark.parametrize("wrap", ["plain", "module_prefix", "state_dict", "nested_model_state_dict"])
def test_pretrained_path_unwraps_common_containers_and_loads_everything(tmp_path, wrap):
    from fedmedbench.models import build_model

    ref = _small().state_dict()
    obj = {"plain": ref, "module_prefix": {f"module.{k}": v for k, v in ref.items()},
           "state_dict": {"state_dict": ref, "epoch": 3},
           "nested_model_state_dict": {"checkpoint": 1, "model_state_dict": {f"module.{k}": v for k, v in ref.items()}}}[wrap]
    torch.save(obj, tmp_path / "w.pt")
    torch.manual_seed(2)
    model = build_model("cnn_small", 1, 3, 28, pretrained_path=str(tmp_path / "w.pt"))
    assert all(torch.equal(model.state_dict()[k], v) for k, v in ref.items())


def test_pretrained_path_that_does_not_fit_names_missing_and_unexpected_keys(tmp_path):
    from fedmedbench.models import build_model

    ref = dict(_small().state_dict())
    gone = next(iter(ref))
    ref.pop(gone)
    ref["extra.weight"] = torch.zeros(2)
    torch.save(ref, tmp_path / "w.pt")
    with pytest.raises(WeightsError) as err:
        build_model("cnn_small", 1, 3, 28, pretrained_path=str(tmp_path / "w.pt"))
    assert gone in str(err.value) and "extra.weight" in str(err.value) and "w.pt" in str(err.value)


def test_head_of_another_class_count_is_reinitialised_and_listed(tmp_path):
    from fedmedbench.models import build_model

    ref = _small().state_dict()  # 3 classes
    torch.save(ref, tmp_path / "w.pt")
    torch.manual_seed(2)
    fresh = build_model("cnn_small", 1, 5, 28)
    report = load_backbone(fresh, unwrap(torch.load(tmp_path / "w.pt", weights_only=True)), "w.pt")
    assert report.head_reinitialised == ["classifier.2.weight", "classifier.2.bias"]
    assert all(torch.equal(fresh.state_dict()[k], ref[k]) for k in report.loaded) and len(report.loaded) == len(ref) - 2


def test_captions_say_how_models_started():
    import pandas as pd

    from fedmedbench.fl.engine.federation import init_note
    from fedmedbench.fl.spec import RunSpec
    from fedmedbench.report.tables import caption

    spec = RunSpec(run_dir="r", study="s", dataset="d", setting="x", method="fedavg", seed=0, partition_path="p",
                   sources={}, image_size=28)
    assert init_note(spec) == "random init"
    assert init_note(RunSpec(**{**spec.to_dict(), "weights_sha256": {"yolo11n_coco": "ab"}})) == "pretrained yolo11n_coco"
    runs = pd.DataFrame({"seed": [0, 1], "rounds": [3, 3], "init": ["random init", "random init"]})
    cap = caption("demo", runs, "synthetic")
    assert "SYNTHETIC" in cap and "models: random init" in cap
