"""Surgical data at the papers' frame counts, synthetic, for timing the fedst and ultraflwr grids without
the licensed videos.

Writes the datasets a study config reads (``surgical.sites`` for fedst, ``surgical.groups`` for
ultraflwr) in their release layouts, at the frame counts and sizes of ``bench/surgical_stand_in.yaml``
(FedST Table I, UltraFlwr Sec. III-A), then builds what the grid's jobs read with the pipeline's own
code: the frame indices, the re-curated client settings and the YOLO exports
(``<out>/yolo/<group>``), and the clip index (``<out>/clips``). ``grid_cost.py --surgical-dir <out>``
then times the study on it. Each video renders ``distinct_frames`` frames and repeats them as hard
links, so a release-sized set takes minutes (mostly the indexing, which decodes every frame as on
real data) and little disk; the content is synthetic and repeats: for cost, never a paper
reproduction.

``--fraction`` scales each video's frames; for fedst, ``--test-fraction`` scales the test videos'
instead (default: ``--fraction``). Timing a full-size ultraflwr round takes many minutes, so a
fraction of its frames is timed and ``grid_cost.py`` scales the measured work back up
(``stand_in.json`` records the fractions). A fedst site trains a fixed number of steps: with a
fraction of its clips, ``grid_cost.py`` scales the clip cache by the same fraction, so that it holds
the same share of the clips the steps draw from.

    python bench/surgical_stand_in.py --config config/studies/fedst.yaml --out /tmp/stand-in/fedst --fraction 0.25 --test-fraction 0.1
    python bench/surgical_stand_in.py --config config/studies/ultraflwr.yaml --out /tmp/stand-in/ultraflwr --fraction 0.05
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from fedmedbench.data.surgical import synthetic_layouts  # noqa: E402
from fedmedbench.data.surgical.export_clips import export_sites  # noqa: E402
from fedmedbench.data.surgical.export_yolo import export_group  # noqa: E402
from fedmedbench.data.surgical.group_io import write_group  # noqa: E402
from fedmedbench.data.surgical.index import build_index  # noqa: E402
from fedmedbench.data.surgical.recurate import build_group  # noqa: E402
from fedmedbench.data.surgical.schema import read_index  # noqa: E402
from fedmedbench.workflow import io  # noqa: E402

SPEC_FILE = ROOT / "bench" / "surgical_stand_in.yaml"
#: present while a stand-in is written (removed once stand_in.json is)
BUILDING = ".building"
#: keys of a stand-in entry that are not generator settings
NOTES = ("source", "fixed")


def study_of(config: dict) -> str:
    """The surgical study a config runs: fedst (sites) or ultraflwr (groups); one at a time."""
    fedst = bool(config.get("fedst", {}).get("enabled")) and bool(config["surgical"].get("sites"))
    ultraflwr = bool(config.get("ultraflwr", {}).get("groups"))
    if fedst == ultraflwr:
        raise SystemExit("the config must run exactly one of fedst (fedst.enabled) and ultraflwr (ultraflwr.groups)")
    return "fedst" if fedst else "ultraflwr"


def needed_datasets(config: dict, study: str) -> list[str]:
    surgical = config["surgical"]
    if study == "fedst":
        return sorted({s["dataset"] for s in surgical["sites"].values()})
    groups = config["ultraflwr"]["groups"]
    return sorted({d for g in groups for d in surgical["groups"][g]["datasets"]})


def scaled(count: int, fraction: float) -> int:
    return max(1, round(int(count) * float(fraction)))


def generator_spec(entry: dict, fraction: float, test_fraction: float, distinct: int) -> dict[str, Any]:
    """One ``surgical.synthetic.datasets`` block: every video at its scaled frame count (exact, not drawn)."""
    keep = 1.0 if entry.get("fixed") else fraction
    keep_test = 1.0 if entry.get("fixed") else test_fraction
    spec = {k: v for k, v in entry.items() if k not in NOTES}
    n = scaled(entry["frames"], keep)
    spec["frames"] = [n, n]
    if "test_frames" in entry:
        t = scaled(entry["test_frames"], keep_test)
        spec["test_frames"] = [t, t]
    spec["distinct_frames"] = int(distinct)
    return spec


def effective_fractions(entries: dict[str, dict], specs: dict[str, dict],
                        counts: dict[str, dict[str, int]]) -> tuple[float, float]:
    """The share of the papers' frames written, outside and inside the test splits: per-video counts are
    rounded, so each dataset keeps ``written / paper`` of its videos' frames; the shares are of the frames
    (datasets marked ``fixed``, which the grid's jobs do not read, left out)."""
    shares = []
    for want_test in (False, True):
        written = paper = 0.0
        for name, entry in entries.items():
            if name not in specs or entry.get("fixed"):
                continue
            key = "test_frames" if want_test and "test_frames" in entry else "frames"
            ratio = specs[name][key][0] / entry[key]
            n = sum(v for split, v in counts[name].items() if (split == "test") == want_test)
            written, paper = written + n, paper + n / ratio
        shares.append(written / paper if paper else 1.0)
    return shares[0], shares[1]


def _generate(args: tuple) -> tuple[str, float, float]:
    """Write one dataset and index it (seconds of each)."""
    name, dataset_cfg, spec, out = args
    start = time.perf_counter()
    raw = out / "raw" / dataset_cfg["folder"]
    synthetic_layouts.generate(name, dataset_cfg, spec, 0, spec["width"], spec["height"], raw)
    written = time.perf_counter()
    build_index(name, {**dataset_cfg, "bad_files": "fail"}, out / "raw", out / "index" / name, origin="synthetic",
                log=lambda m: None)
    return name, written - start, time.perf_counter() - written


def build(config: dict, out: Path, fraction: float = 1.0, test_fraction: float | None = None, jobs: int = 4,
          spec_file: Path = SPEC_FILE, log=print) -> dict[str, Any]:
    """Write the stand-in of the config's surgical study under ``out``; returns what ``stand_in.json`` holds."""
    test_fraction = fraction if test_fraction is None else test_fraction
    if not (0 < fraction <= 1 and 0 < test_fraction <= 1):
        raise SystemExit(f"fractions must be in (0, 1], got {fraction} and {test_fraction}")
    study = study_of(config)
    if study == "ultraflwr" and test_fraction != fraction:  # its test videos are chosen by the group's lists
        raise SystemExit("ultraflwr: one --fraction for every video (its test videos are picked by video_splits)")
    stand_in = yaml.safe_load(Path(spec_file).read_text())
    surgical = config["surgical"]
    names = needed_datasets(config, study)
    missing = [n for n in names if n not in stand_in["datasets"]]
    if missing:
        raise SystemExit(f"{spec_file}: no stand-in for dataset(s) {missing} of {study}")
    _claim(out)
    specs = {n: generator_spec(stand_in["datasets"][n], fraction, test_fraction, stand_in["distinct_frames"])
             for n in names}
    start = time.perf_counter()
    work = [(n, surgical["datasets"][n], specs[n], out) for n in names]
    with ProcessPoolExecutor(max_workers=max(1, min(jobs, len(work)))) as pool:  # one dataset per process
        for done in as_completed([pool.submit(_generate, w) for w in work]):
            name, written, indexed = done.result()
            log(f"{name}: written in {written:.1f} s, indexed in {indexed:.1f} s")
    indices = {n: read_index(out / "index" / n) for n in names}
    exported = time.perf_counter()
    counts = {n: {split: int(df[df["labelled"] & (df["split"] == split)].shape[0]) for split in ("train", "val", "test")}
              for n, (df, _) in indices.items()}
    kept, kept_test = effective_fractions(stand_in["datasets"], specs, counts)
    if study == "fedst":
        export_sites(indices, surgical["sites"], surgical["clips"], out / "clips", "synthetic")
    else:
        for g in config["ultraflwr"]["groups"]:
            gcfg = surgical["groups"][g]
            group = build_group(g, {d: indices[d][0] for d in gcfg["datasets"]},
                                {d: indices[d][1] for d in gcfg["datasets"]}, gcfg, surgical["tool_groups"])
            write_group(group, out / "groups" / g, "synthetic")
            export_group(out / "groups" / g, out / "yolo" / g)
    log(f"{study}: exported in {time.perf_counter() - exported:.1f} s")
    record = {"origin": "synthetic", "note": "SYNTHETIC stand-in at the papers' frame counts, for cost only; "
              "never a paper reproduction", "study": study, "fraction": kept, "test_fraction": kept_test,
              "requested": {"fraction": fraction, "test_fraction": test_fraction},
              "distinct_frames": int(stand_in["distinct_frames"]), "labelled_frames": counts,
              "datasets": {n: {**specs[n], "source": stand_in["datasets"][n].get("source")} for n in names},
              "build_s": round(time.perf_counter() - start, 1), "export_s": round(time.perf_counter() - exported, 1)}
    io.write_json(out / "stand_in.json", record)
    (out / BUILDING).unlink()
    return record


def _claim(out: Path) -> None:
    """Empty ``out`` for a new stand-in, marked unfinished until ``stand_in.json`` is written (the indices
    and exports name their files by absolute path, so the set is built in place, not renamed into it).
    Only an empty folder or an earlier stand-in is replaced."""
    if out.exists():
        if not out.is_dir():
            raise SystemExit(f"--out {out}: a file, not a folder: choose another --out")
        if any(out.iterdir()) and not (out / "stand_in.json").exists() and not (out / BUILDING).exists():
            raise SystemExit(f"{out} exists and holds no stand-in (no stand_in.json): choose another --out")
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / BUILDING).write_text("a stand-in is being built here; an interrupted build leaves this file\n")


def main() -> None:
    from grid_cost import load_config

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, required=True, help="config/studies/fedst.yaml or ultraflwr.yaml")
    ap.add_argument("--out", type=Path, required=True, help="folder to (re)write")
    ap.add_argument("--fraction", type=float, default=1.0, help="share of each video's frames (0, 1]")
    ap.add_argument("--test-fraction", type=float, help="share of each test video's frames (default: --fraction)")
    ap.add_argument("--jobs", type=int, default=4, help="datasets generated at once")
    args = ap.parse_args()
    record = build(load_config(args.config), args.out, args.fraction, args.test_fraction, args.jobs)
    print(f"{record['study']} stand-in in {args.out} ({record['build_s']} s): labelled frames {record['labelled_frames']}")


if __name__ == "__main__":
    main()
