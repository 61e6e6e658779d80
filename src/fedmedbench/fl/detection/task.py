"""The ``detection`` task: clients are the YOLO exports of one surgical setting.

``RunSpec.partition_path`` is the setting's ``manifest.json`` (export_yolo). Evaluation
uses Ultralytics' own validator; per client it reports ``local_*`` (the client's own
test split: in-distribution, ID), ``cd_*`` (the other clients' test splits:
cross-distribution, CD) and ``cval_*`` (its own validation split, the per-round
curve of Figure 3). Metrics: ``map50`` and ``map50_95``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from fedmedbench.fl.detection.staging import read_manifest, stage_export
from fedmedbench.fl.tasks import Task, register_task

EVAL_DEFAULTS = {"eval_batch": 16, "conf": 0.001, "iou": 0.7}


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
        self.work = Path(spec.run_dir).resolve() / "work"
        self.stage = stage_export(spec.partition_path, self.work / "stage")

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
                               seed=self.spec.seed * self.num_clients + pid, workdir=str(self.work / f"client_{pid}"))

    def pooled_data(self) -> DetectionClient:
        d = self.stage / "pooled"
        return DetectionClient(pid=0, data_yaml=str(d / "data.yaml"), data_cd_yaml=str(d / "data.yaml"),
                               num_train=int(self.manifest["pooled"]["train"]["frames"]), imgsz=self.spec.image_size,
                               seed=self.spec.seed, workdir=str(self.work / "pooled"))

    def _val(self, model, data_yaml: str, split: str, device, workdir: str) -> dict[str, float]:
        from fedmedbench.fl.detection.yolo import validate_yolo

        p = self.params
        return validate_yolo(model, data_yaml, split, imgsz=self.spec.image_size, batch=p["eval_batch"], device=device,
                             workdir=workdir, conf=p["conf"], iou=p["iou"])

    def evaluate_client(self, model, data: DetectionClient, device) -> dict[str, float]:
        out = {}
        for prefix, yaml_path, split in (("local", data.data_yaml, "test"), ("cd", data.data_cd_yaml, "test"),
                                         ("cval", data.data_yaml, "val")):
            out.update({f"{prefix}_{k}": v for k, v in self._val(model, yaml_path, split, device, data.workdir).items()})
        return out

    def evaluate_global(self, model, device):
        pooled = self.pooled_data()
        row = {f"global_{k}": v for k, v in self._val(model, pooled.data_yaml, "test", device, pooled.workdir).items()}
        row.update({f"val_{k}": v for k, v in self._val(model, pooled.data_yaml, "val", device, pooled.workdir).items()})
        per_client = [self.evaluate_client(model, self.client_data(p), device) for p in range(self.num_clients)]
        return row, per_client
