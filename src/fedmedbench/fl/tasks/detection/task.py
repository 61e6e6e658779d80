"""The ``detection`` task: clients are the YOLO exports of one surgical setting.

``RunSpec.partition_path`` is the setting's ``manifest.json`` (export_yolo). Evaluation
uses Ultralytics' own validator. A client's model is scored on the test split of EVERY
client, one by one (``test<j>_*``: row i of the ID/CD matrix, as UltraFlwr's
``scripts/central_train_and_test/run_local_eval.sh`` tests one model on each client's
partition); ``local_*`` (ID) is the client's own test split and ``cd_*`` the mean over
the other clients' test splits, each weighted equally whatever its size (pooling their
frames into one score would let the largest client decide CD). Metrics: ``map50``,
``map50_95``. Per-round validation (Figure 3) is measured during local training.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from fedmedbench.fl.state.scratch import scratch_dir
from fedmedbench.fl.tasks.base import Task, register_task
from fedmedbench.fl.tasks.detection.staging import POOLED_SPLITS, SPLITS, read_manifest, stage_export

EVAL_DEFAULTS = {"eval_batch": 16, "conf": 0.001, "iou": 0.7, "rect": True, "ap": "ultralytics_8_3",
                 "match": "ultralytics_8_3"}


def cd_from_pairs(row: dict[str, float], pid: int, num_clients: int, metrics=("map50", "map50_95")) -> dict[str, float]:
    """ID = the client's own test split; CD = the mean over the other clients' test splits (j != pid)."""
    out = {}
    for k in metrics:
        out[f"local_{k}"] = row[f"test{pid}_{k}"]
        others = [row[f"test{j}_{k}"] for j in range(num_clients) if j != pid]
        out[f"cd_{k}"] = sum(others) / len(others) if others else float("nan")
    return out


@dataclass
class DetectionClient:
    """What a detection client's ``ctx.data`` holds: its staged data yamls and training settings."""

    pid: int
    data_yaml: str  # train/val + own test (ID)
    data_cd_yaml: str  # test = other clients' test splits (CD)
    num_train: int
    imgsz: int
    seed: int  # Ultralytics seed of this client (seed set * clients + pid, as the paper's 012/345/678)
    workdir: str
    #: the local training's batches loaded in a thread while the model trains (engine.loader_workers >= 1;
    #: the same samples: read_ahead.py)
    read_ahead: bool = False
    #: each training sample's last pixel steps in one more thread (engine.pixel_thread; the same samples: pixel_thread.py)
    pixel_thread: bool = False


@register_task("detection")
class DetectionTask(Task):
    metric_names = ("map50", "map50_95")
    primary_metric = "map50"

    def __init__(self, spec) -> None:
        super().__init__(spec)
        unknown = set(spec.task_params) - set(EVAL_DEFAULTS)
        if unknown:
            raise ValueError(f"task_params: unknown key(s) {sorted(unknown)} for the detection task")
        self.params = {**EVAL_DEFAULTS, **spec.task_params}
        self.manifest = read_manifest(spec.partition_path)
        self.work = scratch_dir(spec.run_dir)  # removed when the run completes (engine.complete)
        self.stage = stage_export(spec.partition_path, self.work / "stage")
        if spec.image_cache:  # every frame the job reads (each training epoch, validation and evaluation), stored
            from fedmedbench.fl.tasks.detection.frame_cache import link_cached_frames  # at the training size

            folders = [self.stage / f"client_{c['client']}" / split / "images" for c in self.manifest["clients"]
                       for split in SPLITS]
            link_cached_frames(folders + [self.stage / "pooled" / split / "images" for split in POOLED_SPLITS],
                               spec.image_cache, workers=max(1, int(spec.threads)), imgsz=spec.image_size)

    @classmethod
    def resolve_spec(cls, spec):
        manifest = read_manifest(spec.partition_path)
        return replace(spec, in_channels=3, num_classes=len(manifest["classes"]))

    @property
    def num_clients(self) -> int:
        return len(self.manifest["clients"])

    def client_sizes(self) -> list[int]:
        return [int(c["counts"]["train"]["frames"]) for c in self.manifest["clients"]]

    def client_data(self, pid: int) -> DetectionClient:
        d = self.stage / f"client_{pid}"
        return DetectionClient(pid=pid, data_yaml=str(d / "data.yaml"), data_cd_yaml=str(d / "data_cd.yaml"),
                               num_train=self.client_sizes()[pid], imgsz=self.spec.image_size,
                               seed=self.spec.seed * self.num_clients + pid, workdir=str(self.work / f"client_{pid}"),
                               read_ahead=self.spec.loader_workers >= 1, pixel_thread=self.spec.pixel_thread)

    def pooled_data(self) -> DetectionClient:
        d = self.stage / "pooled"
        return DetectionClient(pid=0, data_yaml=str(d / "data.yaml"), data_cd_yaml=str(d / "data.yaml"),
                               num_train=int(self.manifest["pooled"]["train"]["frames"]), imgsz=self.spec.image_size,
                               seed=self.spec.seed, workdir=str(self.work / "pooled"), read_ahead=self.spec.loader_workers >= 1,
                               pixel_thread=self.spec.pixel_thread)

    def _val(self, model, data_yaml: str, split: str, device, workdir: str) -> dict[str, float]:
        from fedmedbench.fl.tasks.detection.yolo import validate_yolo

        p = self.params
        return validate_yolo(model, data_yaml, split, imgsz=self.spec.image_size, batch=p["eval_batch"], device=device,
                             workdir=workdir, conf=p["conf"], iou=p["iou"], rect=p["rect"],
                             workers=self.spec.loader_workers, ap=p["ap"], match=p["match"])

    def evaluate_client(self, model, data: DetectionClient, device) -> dict[str, float]:
        """Row ``data.pid`` of the ID/CD matrix (``test<j>_*``) with its ID (``local_*``) and CD (``cd_*``)."""
        return self._matrix_row(self._client_tests(model, device, data.workdir), data.pid)

    def _client_tests(self, model, device, workdir: str) -> dict[str, float]:
        """``model`` on every client's test split: ``test<j>_*``."""
        out = {}
        for j in range(self.num_clients):
            scores = self._val(model, self.client_data(j).data_yaml, "test", device, workdir)
            out.update({f"test{j}_{k}": v for k, v in scores.items()})
        return out

    def _matrix_row(self, tests: dict[str, float], pid: int) -> dict[str, float]:
        return {**tests, **cd_from_pairs(tests, pid, self.num_clients, self.metric_names)}

    def evaluate_global(self, model, device):
        """The pooled test and validation sets, and every client's row of the ID/CD matrix: one model, so each
        client's test split is scored once and its scores fill every row (N validations, not N x N)."""
        pooled = self.pooled_data()
        row = {f"global_{k}": v for k, v in self._val(model, pooled.data_yaml, "test", device, pooled.workdir).items()}
        row.update({f"val_{k}": v for k, v in self._val(model, pooled.data_yaml, "val", device, pooled.workdir).items()})
        tests = self._client_tests(model, device, self.client_data(0).workdir)
        return row, [self._matrix_row(tests, p) for p in range(self.num_clients)]
