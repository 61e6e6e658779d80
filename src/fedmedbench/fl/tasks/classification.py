"""The classification task: MedMNIST-format images, one partition JSON, accuracy/AUC metrics."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from fedmedbench.fl.api.method import TrainConfig
from fedmedbench.fl.tasks.base import Task, register_task

if TYPE_CHECKING:
    import torch

    from fedmedbench.fl.spec import RunSpec


@register_task("classification")
class ClassificationTask(Task):
    """MedMNIST-format npz sources + a partition JSON (``fedmedbench.partition.schemes``)."""

    primary_metric = "accuracy"

    def __init__(self, spec: RunSpec) -> None:
        from fedmedbench.fl.data import FederatedData
        from fedmedbench.metrics.classification import CLASSIFICATION_METRICS

        super().__init__(spec)
        self.metric_names = CLASSIFICATION_METRICS
        self.data = FederatedData(spec.partition_path, spec.sources, spec.client_augmentation)
        self._eval_cache: dict[str, Any] = {}
        self._eval_round = 0

    def set_eval_round(self, rnd: int) -> None:
        self._eval_round = int(rnd)

    @classmethod
    def resolve_spec(cls, spec: RunSpec) -> RunSpec:
        from fedmedbench.fl.data import FederatedData, load_pool

        data = FederatedData(spec.partition_path, spec.sources)
        first = next(iter(spec.sources.values()))
        x, _ = load_pool(first)
        if x.shape[-1] != spec.image_size:
            raise ValueError(f"{first}: images are {x.shape[-1]} px but the study's size is {spec.image_size}")
        return replace(spec, in_channels=int(x.shape[1]), num_classes=data.num_classes)

    @property
    def num_clients(self) -> int:
        return self.data.num_clients

    def client_sizes(self) -> list[int]:
        return [len(c["train"]) for c in self.data.partition["clients"]]

    def client_data(self, pid: int):
        return self.data.client(pid)

    def pooled_data(self):
        return self.data.pooled()

    def _bs(self) -> int:
        return TrainConfig.from_spec(self.spec).eval_batch_size

    def evaluate_global(self, model, device):
        """Global test and validation sets, and every client's test split.

        A client's test split is usually a subset of the global test set (same pool indices and
        source), so the global test set is predicted once and each client's metrics come from its
        rows: 100 clients cost no extra forward passes. A client whose split is not inside it (the
        domain scheme's official holdout: shifted client shares, a clean global set) is predicted
        on its own.
        """
        from fedmedbench.fl.training import evaluate, predict_samples
        from fedmedbench.metrics.classification import grouped_classification_metrics

        if not self._eval_cache:
            gx, gy = self.data.global_test()
            self._eval_cache["global"] = (gx, gy)
            self._eval_cache["val"] = self.data.global_val()
            self._eval_cache["val_reads"] = self.data.global_val_reads()
            self._eval_cache["rows"] = self._client_test_rows()
        bs = self._bs()
        gx, gy = self._eval_cache["global"]
        probs, losses = predict_samples(model, gx, gy, bs, device)
        client_rows = self._eval_cache["rows"]
        inside = [pid for pid, rows in enumerate(client_rows) if rows is not None]
        # the global test set and every client split inside it: one vectorised pass
        sets = grouped_classification_metrics(gy.numpy(), probs, [np.arange(len(gy))] + [client_rows[p] for p in inside],
                                              losses, device)
        row = {f"global_{k}": v for k, v in sets[0].items()}
        row.update({f"val_{k}": v for k, v in evaluate(model, *self._validation_images(), bs, device).items()})
        by_pid = dict(zip(inside, sets[1:], strict=True))
        per_client = []
        for pid, rows in enumerate(client_rows):
            if rows is None:  # not inside the global test set: predict it separately
                c = self.data.client(pid)
                metrics = evaluate(model, c.test_x, c.test_y, bs, device)
            else:
                metrics = by_pid[pid]
            per_client.append({f"local_{k}": v for k, v in metrics.items()})
        return row, per_client

    def _validation_images(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The pooled validation shares as this round's evaluation reads them: stored, or (``client_augmentation:
        reference``) one fresh read of each clean image as the authors' loader, seeded by (run seed, round)."""
        from fedmedbench.fl.augment import read_all, validation_generator

        vx, vy = self._eval_cache["val"]
        reads = self._eval_cache["val_reads"]
        if reads is None:
            return vx, vy
        return read_all(*reads, validation_generator(self.spec.seed, self._eval_round)), vy

    def _client_test_rows(self) -> list[np.ndarray | None]:
        """For each client, the rows of the global test set holding its test split (None if not all there)."""
        position: dict[tuple[str, int], int] = {}
        offset = 0
        for g in self.data.partition["global_test"]:
            for k, idx in enumerate(g["idx"]):
                position.setdefault((g["source"], int(idx)), offset + k)
            offset += len(g["idx"])
        out: list[np.ndarray | None] = []
        for c in self.data.partition["clients"]:
            rows = [position.get((c["source"], int(i))) for i in c["test"]]
            out.append(None if any(r is None for r in rows) else np.asarray(rows, dtype=np.int64))
        return out

    @classmethod
    def evaluate_validation(cls, model, data, device, batch_size, generator=None):
        """The stored validation split, or (``client_augmentation: reference``) one read of its clean images as
        the authors' validation loader, from ``generator`` (the client's)."""
        from fedmedbench.fl.augment import read_all
        from fedmedbench.fl.training import evaluate

        if getattr(data, "val_aug_x", None) is None:
            return evaluate(model, data.val_x, data.val_y, batch_size, device)
        if generator is None:
            raise ValueError("client validation of augmented reads needs the client's generator")
        return evaluate(model, read_all(data.val_aug_x, data.val_aug_device, generator), data.val_y, batch_size, device)

    def evaluate_client(self, model, data, device):
        from fedmedbench.fl.training import evaluate

        bs = self._bs()
        gx, gy = self.data.global_test()
        out = {f"local_{k}": v for k, v in evaluate(model, data.test_x, data.test_y, bs, device).items()}
        out.update({f"global_{k}": v for k, v in evaluate(model, gx, gy, bs, device).items()})
        return out
