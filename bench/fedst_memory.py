"""Peak RSS of one FedST round on full-size synthetic sites A-D (the real sites' frame sizes).

Writes a clip export (``sites.json`` + ``<site>/clips.parquet``, the format ``export_clips``
produces) whose frames have the real datasets' sizes (A 1920x1080, B 1280x1024, C 1920x1080,
D 1280x720, E 1920x1080, simulator 960x540; synthetic content, smooth noise + a tool-like
bar in the mask), then runs one FedST round (RSC + channel selection + SERQ, the paper's
window/pools/fields) through the engine in a fresh subprocess, evaluation of every site's test
clips included, and reads the child's peak RSS from the OS (``ru_maxrss``). Frames are resized
to ``--input-size`` on load and kept in the byte-bounded cache (``--cache-mb``).

    python bench/fedst_memory.py --clips 60 --input-size 480 480 --cache-mb 512
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import emit  # noqa: E402

SIZES = {"A": (1080, 1920), "B": (1024, 1280), "C": (1080, 1920), "D": (720, 1280), "E": (1080, 1920), "sim": (540, 960)}
ROLES = {"A": "federated", "B": "federated", "C": "federated", "D": "federated", "E": "out_of_federation", "sim": "server"}
CLASSES = ["background", "shaft", "wrist", "clasper"]

CHILD = """
import json, sys
sys.path.insert(0, {src!r})
from fedmedbench.compat import limit_threads
from fedmedbench.studies.fedst.deploy import deploy_eval
from fedmedbench.fl.engine import flower as engine
from fedmedbench.fl.spec import RunSpec
limit_threads({threads})
fed = engine.run(RunSpec.from_dict(json.loads(sys.argv[1])), log=lambda m: None)
deploy_eval(fed.spec, fed.final_state, "E", "E", 2)
"""


def write_site(root: Path, site: str, n_clips: int, n_test: int, rng: np.random.Generator) -> None:
    """One video of ``n_clips + n_test + 3`` full-size frames; clip i = frames i .. i+3."""
    import cv2
    import pandas as pd

    h, w = SIZES[site]
    vdir = root / "raw" / site
    vdir.mkdir(parents=True, exist_ok=True)
    n_frames = n_clips + n_test + 3
    frames, masks = [], []
    for f in range(n_frames):
        low = rng.integers(0, 255, (9, 16, 3), dtype=np.uint8)
        img = cv2.resize(low, (w, h), interpolation=cv2.INTER_CUBIC)
        mask = np.zeros((h, w), np.uint8)
        x0 = int(w * (0.2 + 0.5 * f / n_frames))
        mask[h // 4: h // 2, x0: x0 + w // 10] = 1
        mask[h // 2: h // 2 + h // 10, x0: x0 + w // 10] = 2
        mask[h // 2 + h // 10: h // 2 + h // 5, x0: x0 + w // 10] = 3
        img[mask > 0] = 200
        fp, mp = vdir / f"f{f:04d}.png", vdir / f"m{f:04d}.png"
        cv2.imwrite(str(fp), img, [cv2.IMWRITE_PNG_COMPRESSION, 1])
        cv2.imwrite(str(mp), mask, [cv2.IMWRITE_PNG_COMPRESSION, 1])
        frames.append(str(fp))
        masks.append(str(mp))
    rows = []
    for i in range(n_clips + n_test):
        split = "train" if i < n_clips else "test"
        if ROLES[site] == "out_of_federation":
            split = "test"
        rows.append({"site": site, "dataset": site, "split": split, "video_id": "v1", "frame": i + 3, "timestamp_s": (i + 3) * 0.2,
                     "clip_paths": frames[i: i + 4], "clip_offsets_s": [-0.6, -0.4, -0.2, 0.0], "n_duplicated": 0,
                     "mask_path": masks[i + 3]})
    (root / site).mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(root / site / "clips.parquet")


def study_cfg(args) -> dict:
    import yaml
    from snakemake.utils import validate

    cfg = yaml.safe_load((ROOT / "config" / "studies" / "fedst.yaml").read_text())
    validate(cfg, str(ROOT / "config" / "schema.yaml"))  # fills the schema defaults
    f = copy.deepcopy(cfg["fedst"])
    f["indicator"] = {**f["indicator"], "kind": "onehot", "clip_weights": None}
    f["train"] = {**f["train"], "rounds": 1, "local_steps": args.local_steps}
    f["serq"] = {**f["serq"], "steps": args.serq_steps, "probe": 2}
    f["data"] = {"input_size": list(args.input_size) if args.input_size else None, "cache_mb": args.cache_mb}
    f["eval"] = {**f["eval"], "eval_every": 1, "cross_site_eval": False}
    return f


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clips", type=int, default=60, help="training clips per federated site")
    ap.add_argument("--test-clips", type=int, default=10)
    ap.add_argument("--input-size", type=int, nargs=2, default=[480, 480])
    ap.add_argument("--cache-mb", type=int, default=512)
    ap.add_argument("--local-steps", type=int, default=2, help="iterations per site (memory does not grow with them)")
    ap.add_argument("--serq-steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from fedmedbench.studies.fedst import runs as FS

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="fmb-fedst-mem-") as tmp:
        root = Path(tmp) / "clips"
        t0 = time.monotonic()
        for s in SIZES:
            write_site(root, s, args.clips, args.test_clips, rng)
        meta = {"sites": {s: {"site": s, "role": r, "prompt": f"This is the Local site {s} model and the surgery type is x",
                              "label_set": "parts", "classes": CLASSES} for s, r in ROLES.items()}}
        (root / "sites.json").write_text(json.dumps(meta))
        print(f"wrote the full-size clip export in {time.monotonic() - t0:.0f} s", flush=True)
        cfg = study_cfg(args)
        spec = FS.run_spec(cfg, "main", "fedst", 0, str(root), str(Path(tmp) / "run"), None, "cpu", args.threads, "synthetic")
        src = str(ROOT / "src")
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-c", CHILD.format(src=src, threads=args.threads), json.dumps(spec)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(proc.stdout[-3000:] + proc.stderr[-3000:])
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # KiB -> GiB
        row = {"bench": "fedst_memory", "sites": "ABCD", "frame_sizes": {s: list(v) for s, v in SIZES.items()},
               "train_clips_per_site": args.clips, "test_clips_per_site": args.test_clips,
               "input_size": args.input_size, "cache_mb": args.cache_mb, "local_steps": args.local_steps,
               "serq_steps": args.serq_steps, "wall_s": round(time.monotonic() - t0, 1), "peak_rss_gib": round(peak, 2)}
        emit([row], args.out)


if __name__ == "__main__":
    main()
