"""Ultralytics YOLO as a federated client: build, train E epochs, capture weights, validate.

Measured pitfalls this wrapper avoids (Ultralytics 8.4):

* ``YOLO("x.yaml").train()`` rebuilds the model inside the trainer, so a state_dict
  loaded into the wrapper beforehand is ignored on the first call. Here the trainer is
  handed our already-loaded ``DetectionModel`` (``setup_model`` keeps a module as is).
* After ``train()`` the wrapper holds ``best.pt``'s EMA weights in fp16, chosen by
  Ultralytics' fitness. Here checkpoints are not written at all (``save_model`` is off);
  a callback (:class:`EpochSelector`) copies the EMA weights that were just validated,
  in fp32, at the epoch chosen by *our* rule: the best Ultralytics 8.3 fitness (UltraFlwr's
  ``best.pt``, the default), the best validation mAP50 (the paper's text), or the last epoch.
* Every ``train()`` makes a new trainer (optimizer, LR warm-up and EMA start afresh):
  that is UltraFlwr's behaviour per round and is kept.
* ``optimizer=auto`` picks MuSGD in Ultralytics 8.4 where 8.3 (UltraFlwr pins 8.3.48) picked
  SGD (more than 10,000 iterations, e.g. the 400-epoch centralized baseline); the trainer
  applies 8.3's rule unless ``auto_optimizer: installed`` (:func:`auto_optimizer_83`).
* Ultralytics 8.4 warms the learning rate (and the gradient accumulation) up over ``min(warmup_epochs,
  epochs - 1)`` epochs' batches; 8.3.48 over ``max(warmup_epochs x batches, 100)`` iterations. At 4 or more
  epochs the two differ for clients of fewer than 34 batches; for a 2-epoch training of up to 4 batches an epoch
  8.4's single optimizer step falls at the warm-up's first iteration, where the learning rate is 0, and no
  weight moves. The trainer follows 8.3.48 unless ``warmup="installed"`` (:func:`warmup_iterations_83`).
* Ultralytics 8.4's loss lets an anchor take a ground-truth box narrower or shorter than 16 px (the middle
  stride) when its centre lies inside the box widened to 16 px; 8.3.48 only when it lies inside the box itself.
  The trainer's loss follows 8.3.48 unless ``assigner="installed"`` (:func:`anchors_in_boxes_83`).
* Ultralytics 8.4's HSV augmentation shifts the hue by up to ``hsv_h`` x 180; 8.3.48's scales it by a factor in
  [1 - hsv_h, 1 + hsv_h] (a red hue near 0 hardly moves, one near 179 by up to 2.7). The training set's HSV step
  follows 8.3.48 unless ``hsv="installed"`` (:class:`~fedmedbench.fl.tasks.detection.hsv.RandomHSV83`); both draw the same random numbers.
* Ultralytics 8.4's trainer fitness is mAP50-95 alone and its early stopping needs a strict improvement;
  8.3.48's is 0.1 mAP50 + 0.9 mAP50-95 and an equal fitness resets the patience count. Early stopping
  (patience 100, the 400-epoch centralized baseline) follows 8.3.48 unless ``fitness="installed"``
  (:class:`EarlyStopping83`).
* Ultralytics 8.4's AP ends the precision envelope at the last recall the detections reach; 8.3.48's extends it
  linearly to precision 0 at recall 1. Every validation (the epoch a client sends, each reported mAP) follows
  8.3.48 unless ``ap="installed"`` (:mod:`.ap`).
* Ultralytics 8.4 counts a detection whose best box an earlier one took as a true positive where another free box
  overlaps it enough; 8.3.48 as a false positive. Every validation matches as 8.3.48 unless ``match="installed"``
  (:mod:`.matching`).
* Ultralytics 8.4's training samples draw other augmentations than 8.3.48's (a draw while a data set is built,
  CutMix's and Albumentations' steps, the loader's shuffle seed) and its warp with the mosaic closed is half a
  pixel off; the samples are 8.3.48's unless ``pipeline="installed"`` (:mod:`.pipeline`).
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fedmedbench.fl.tasks.detection import label_cache
from fedmedbench.fl.tasks.detection.anchors import anchors_kept
from fedmedbench.fl.tasks.detection.ap import ap_rule
from fedmedbench.fl.tasks.detection.hsv import with_83_hue
from fedmedbench.fl.tasks.detection.matching import match_rule
from fedmedbench.fl.tasks.detection.pipeline import (
    PIPELINES,
    keeps_python_stream,
    shuffle_as_83,
    use_83_steps,
)
from fedmedbench.fl.tasks.detection.sized_frames import read_sized_frames
from fedmedbench.weights.safeload import LoadReport


def _log(message: str) -> None:
    """Said through Ultralytics' logger, as its own messages about the data."""
    from ultralytics.utils import LOGGER

    LOGGER.info(message)

SELECT = ("best", "last")
SELECT_METRICS = ("map50", "fitness")
#: Ultralytics 8.3.x (UltraFlwr pins 8.3.48) fitness weights of (P, R, mAP50, mAP50-95); 8.4 uses mAP50-95 alone
FITNESS_83 = (0.0, 0.0, 0.1, 0.9)


def selection_score(metrics: dict, select_metric: str) -> float:
    """The number a validated epoch is ranked by: mAP50, or 0.1 mAP50 + 0.9 mAP50-95 (Ultralytics 8.3)."""
    m50 = float(metrics.get("metrics/mAP50(B)", math.nan))
    if select_metric == "map50":
        return m50
    if select_metric == "fitness":
        return FITNESS_83[2] * m50 + FITNESS_83[3] * float(metrics.get("metrics/mAP50-95(B)", math.nan))
    raise ValueError(f"select_metric must be one of {SELECT_METRICS}, got '{select_metric}'")


AUTO_OPTIMIZERS = ("ultralytics_8_3", "installed")
#: how many iterations the learning rate warms up over: as Ultralytics 8.3.48 (UltraFlwr's pin) or the installed one
WARMUPS = ("ultralytics_8_3", "installed")
#: which anchors may take a ground-truth box in the loss's target assignment: as Ultralytics 8.3.48 or the installed one
ASSIGNERS = ("ultralytics_8_3", "installed")
#: how the training set's HSV augmentation moves the hue: as Ultralytics 8.3.48 or the installed one
HSV_RULES = ("ultralytics_8_3", "installed")
#: the trainer's fitness (what early stopping reads): Ultralytics 8.3.48's or the installed Ultralytics'
FITNESS_RULES = ("ultralytics_8_3", "installed")


class EarlyStopping83:
    """Ultralytics 8.3.48's ``EarlyStopping``: an epoch whose fitness is at least the best so far (``>=``,
    8.4 needs ``>``) becomes the best epoch; training stops ``patience`` epochs after the best one."""

    def __init__(self, patience: int | None = 50) -> None:
        self.best_fitness, self.best_epoch = 0.0, 0
        self.patience = patience or float("inf")
        self.possible_stop = False

    def __call__(self, epoch: int, fitness: float | None) -> bool:
        if fitness is None:  # not validated this epoch
            return False
        if fitness >= self.best_fitness:
            self.best_epoch, self.best_fitness = epoch, fitness
        delta = epoch - self.best_epoch
        self.possible_stop = delta >= (self.patience - 1)
        return delta >= self.patience


def auto_optimizer_83(iterations: float, nc: int) -> tuple[str, float, float]:
    """Ultralytics 8.3's ``optimizer=auto`` (name, lr0, momentum): SGD at 0.01 above 10,000 iterations,
    else AdamW at 0.002 * 5 / (4 + nc); the choice UltraFlwr's runs made with ultralytics 8.3.48."""
    lr_fit = round(0.002 * 5 / (4 + nc), 6)
    return ("SGD", 0.01, 0.9) if iterations > 10000 else ("AdamW", lr_fit, 0.9)


def import_before_seeding() -> None:
    """Import, before a trainer seeds the random streams, what Ultralytics imports only after seeding them.

    A trainer seeds Python's ``random``, then loads its callbacks (events, platform; the third-party loggers are
    off, :func:`without_integrations`) and builds its training set (Albumentations, whose imports reach Rich:
    ``rich.style`` draws ``getrandbits(24)`` from that stream when first imported). Imported for the first time
    there, they shifted the stream of the process's first local training only: it drew other augmentations than
    any later training with the same inputs, so a job resumed in a new process trained its first client otherwise
    than the uninterrupted job. Imported here first, every training draws the same. ``NO_ALBUMENTATIONS_UPDATE``,
    as Ultralytics sets it: no version check over the network.
    """
    from importlib import import_module

    os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
    for name in ("albumentations", "ultralytics.utils.events", "ultralytics.utils.callbacks.platform"):
        try:
            import_module(name)
        except ImportError:  # Ultralytics then goes without it, in every training alike
            pass


#: Ultralytics' third-party loggers, each loaded by a trainer whose settings turn it on
INTEGRATIONS = ("clearml", "comet", "dvc", "mlflow", "raytune", "tensorboard", "wandb")


@contextmanager
def without_integrations() -> Iterator[None]:
    """A trainer built here loads none of Ultralytics' third-party loggers.

    Ultralytics' settings turn MLflow's logger on by default, and MLflow is installed (the job's own tracking,
    ``fl/tracking.py``, uses it): each local training then opened a run in MLflow's default store, which wrote
    ``mlflow.db`` and ``mlruns/`` into the working directory (the project's root under Snakemake), and called
    ``mlflow.autolog()``, which patches libraries for the whole process. The run's metrics are the job's to
    record. The settings are changed in memory only, for the training, and restored (the user's settings file
    is not written).
    """
    from ultralytics.utils import SETTINGS

    saved = {key: SETTINGS.get(key) for key in INTEGRATIONS}
    for key in INTEGRATIONS:
        dict.__setitem__(SETTINGS, key, False)  # not SETTINGS.update, which saves the file
    try:
        yield
    finally:
        for key, value in saved.items():
            dict.__setitem__(SETTINGS, key, value)


@contextmanager
def ultralytics_offline() -> Iterator[None]:
    """Offline (Ultralytics' ``is_online()``, which ``YOLO_OFFLINE`` turns off), Ultralytics touches no network:
    its downloads fail at once and its URL checks answer "not there" without a request.

    A trainer and a validator check the dataset, which looks for a plot font online (``requests.head``), and on a
    CUDA device the trainer's AMP check downloads ``yolo26n.pt``. On a compute node without network these can only
    fail, and where packets are dropped each waits out its timeout (3 s, 30 s, or the resolver's) for every local
    training and evaluation of every round. Ultralytics' own answers to the failures stay: no font (plots only),
    AMP on with a warning (its list of GPUs with broken AMP still applies).
    """
    from ultralytics.utils import downloads, is_online

    if is_online():
        yield
        return

    def no_download(*args: Any, url: str = "", **kwargs: Any) -> None:
        raise ConnectionError(f"offline (YOLO_OFFLINE or no network): not downloading {url or args[:1]}")

    url_format = downloads.is_url

    def no_url_check(url: Any, check: bool = False) -> bool:
        return False if check else url_format(url)

    saved = downloads.safe_download, downloads.is_url
    downloads.safe_download, downloads.is_url = no_download, no_url_check
    try:
        yield
    finally:
        downloads.safe_download, downloads.is_url = saved


def warmup_iterations_83(warmup_epochs: float, batches: int) -> int:
    """Warm-up iterations of Ultralytics 8.3.48 (``engine/trainer.py:325``): at least 100, whatever the number
    of epochs; -1 (none) when ``warmup_epochs`` is 0."""
    return max(round(warmup_epochs * batches), 100) if warmup_epochs > 0 else -1


def anchors_in_boxes_83(anchor_centres: torch.Tensor, boxes: torch.Tensor, eps: float = 1e-9) -> torch.Tensor:
    """Ultralytics 8.3.48's candidate anchors of the target assignment (``utils/tal.py``,
    ``TaskAlignedAssigner.select_candidates_in_gts``): an anchor may take a box when its centre lies inside the
    box by more than ``eps`` on all four sides, whatever the box's size. ``anchor_centres`` (n_anchors, 2) and
    ``boxes`` (batch, n_boxes, 4) in xyxy pixels; a bool mask (batch, n_boxes, n_anchors)."""
    top_left, bottom_right = boxes[..., None, :2], boxes[..., None, 2:]
    margins = torch.cat((anchor_centres - top_left, bottom_right - anchor_centres), dim=-1)
    return margins.amin(-1) > eps


def _use_83_assigner(model: torch.nn.Module) -> None:
    """Give ``model`` a fresh loss whose target assignment takes its candidate anchors by 8.3.48's rule."""
    from ultralytics.utils.tal import TaskAlignedAssigner

    class _Assigner83(TaskAlignedAssigner):
        def select_candidates_in_gts(self, xy_centers, gt_bboxes, mask_gt, eps=1e-9):
            return anchors_in_boxes_83(xy_centers, gt_bboxes, eps)

    model.criterion = model.init_criterion()
    a = model.criterion.assigner
    model.criterion.assigner = _Assigner83(topk=a.topk, num_classes=a.num_classes, alpha=a.alpha, beta=a.beta,
                                           stride=a.stride, eps=a.eps, topk2=a.topk2)


def one_of(key: str, value: Any, choices: tuple) -> Any:
    """``value`` if it is one of ``choices``; else a ValueError naming ``key`` (a config or parameter path)."""
    if value not in choices:
        raise ValueError(f"{key} must be one of {choices}, got '{value}'")
    return value


@dataclass
class _BuildWith83Hue:
    """A dataset's ``build_transforms`` whose lists take 8.3.48's hue rule (picklable, unlike a closure)."""

    build: Any

    def __call__(self, hyp):
        return with_83_hue(self.build(hyp))


def _use_83_hsv(dataset) -> None:
    """Make every transform list ``dataset`` builds (now, and again when Ultralytics closes the mosaic) take its
    HSV step by 8.3.48's hue rule."""
    dataset.build_transforms = _BuildWith83Hue(dataset.build_transforms)
    with_83_hue(dataset.transforms)


def study_trainer(auto_optimizer: str = "ultralytics_8_3", fitness: str = "ultralytics_8_3",
                  warmup: str = "ultralytics_8_3", assigner: str = "ultralytics_8_3",
                  hsv: str = "ultralytics_8_3", read_ahead: bool = False, pixel_thread: bool = False,
                  pipeline: str = "ultralytics_8_3") -> type:
    """Ultralytics' DetectionTrainer as the study runs it: no checkpoints, no final re-validation, no CPU
    gc, validated epochs marked, ``optimizer=auto`` resolved by ``auto_optimizer``, and the fitness that
    early stopping reads (and ``best_fitness``) by ``fitness``: ``ultralytics_8_3`` = 0.1 mAP50 + 0.9
    mAP50-95 with 8.3.48's stopping rule (:class:`EarlyStopping83`), ``installed`` = the installed one's; the
    learning-rate warm-up's length by ``warmup`` (8.3.48's :func:`warmup_iterations_83` or the installed one's),
    the loss's candidate anchors by ``assigner`` (8.3.48's :func:`anchors_in_boxes_83` or the installed one's) and
    the training set's hue augmentation by ``hsv`` (8.3.48's :func:`~fedmedbench.fl.tasks.detection.hsv.hue_lut_83` or the installed one's), the
    training samples' draws and the warp with the mosaic closed by ``pipeline`` (:mod:`.pipeline`); with
    ``read_ahead`` the training batches are loaded in a thread while the model trains, the same samples
    (:mod:`~fedmedbench.fl.tasks.detection.read_ahead`); with ``pixel_thread`` (loading in this process) each training
    sample's last pixel steps run in a second thread, the same samples (:mod:`~fedmedbench.fl.tasks.detection.pixel_thread`;
    off by default: on a busy 2-core machine it was not faster, it needs a free core)."""
    from ultralytics.models.yolo.detect import DetectionTrainer

    for key, value, choices in (("auto_optimizer", auto_optimizer, AUTO_OPTIMIZERS), ("fitness", fitness, FITNESS_RULES),
                                ("warmup", warmup, WARMUPS), ("assigner", assigner, ASSIGNERS), ("hsv", hsv, HSV_RULES),
                                ("pipeline", pipeline, PIPELINES)):
        one_of(key, value, choices)

    as_83 = pipeline == "ultralytics_8_3"

    class _Trainer(DetectionTrainer):
        def save_model(self):  # weights are captured in fp32 by the callback, no fp16 checkpoints on disk
            return False

        def final_eval(self):  # nothing to re-validate: no best.pt
            return None

        def _clear_memory(self, threshold=None):  # a full gc.collect() frees no accelerator memory on a CPU
            if self.device.type != "cpu":  # and cost 0.5-0.65 s at the end of each client's training there
                super()._clear_memory(threshold)

        def get_dataloader(self, dataset_path, batch_size=16, rank=0, mode="train"):
            loader = super().get_dataloader(dataset_path, batch_size, rank, mode)
            if as_83 and mode == "train":
                shuffle_as_83(loader)
            if read_ahead and mode == "train":
                from fedmedbench.fl.tasks.detection.read_ahead import read_ahead as read_batches_ahead

                read_batches_ahead(loader, self.args.multi_scale)
            return loader

        def build_dataset(self, img_path, mode="train", batch=None):
            with keeps_python_stream() if as_83 else nullcontext():  # 8.3.48 draws nothing while it builds one
                dataset = super().build_dataset(img_path, mode, batch)
            read_sized_frames(dataset, log=_log)  # frames stored at training size, where the stage links them
            if hsv == "ultralytics_8_3" and mode == "train":
                _use_83_hsv(dataset)
            if as_83 and mode == "train":
                use_83_steps(dataset)
            if pixel_thread and mode == "train" and int(getattr(getattr(self, "args", None), "workers", 0)) == 0:
                from fedmedbench.fl.tasks.detection.pixel_thread import use_pixel_thread

                use_pixel_thread(dataset)  # the last pixel steps in a second thread (the same bits)
            return dataset

        def _get_warmup_iterations(self, num_batches):
            if warmup == "ultralytics_8_3":
                return warmup_iterations_83(self.args.warmup_epochs, num_batches)
            return super()._get_warmup_iterations(num_batches)

        def _setup_train(self, *args, **kwargs):
            super()._setup_train(*args, **kwargs)
            if fitness == "ultralytics_8_3":
                self.stopper = EarlyStopping83(patience=self.args.patience)
            if assigner == "ultralytics_8_3":  # the trained model's loss and its EMA copy's (validation loss)
                from ultralytics.utils.torch_utils import unwrap_model

                for m in (unwrap_model(self.model), self.ema.ema if self.ema else None):
                    if m is not None:
                        _use_83_assigner(m)

        def validate(self):  # marks the epochs really validated (with val=False only the last one is;
            best = self.best_fitness  # tr.metrics then still holds placeholder zeros, not a measurement)
            metrics, fit = super().validate()
            self.validated_epoch = self.epoch
            if fitness == "ultralytics_8_3" and metrics and "metrics/mAP50-95(B)" in metrics:
                fit = selection_score(metrics, "fitness")
                self.best_fitness = fit if not best or best < fit else best  # 8.3.48's trainer.validate
            return metrics, fit

        def build_optimizer(self, model, name="auto", lr=0.001, momentum=0.9, decay=1e-5, iterations=1e5):
            if auto_optimizer == "ultralytics_8_3" and str(name).lower() == "auto":
                name, lr, momentum = auto_optimizer_83(iterations, int(self.data.get("nc", 10)))
                self.args.optimizer, self.args.lr0 = name, lr
                self.args.warmup_bias_lr = 0.0  # as 8.3's auto branch
            return super().build_optimizer(model, name=name, lr=lr, momentum=momentum, decay=decay,
                                           iterations=iterations)

    return _Trainer


#: Ultralytics arguments fixed by this wrapper (not overridable through config)
FIXED_ARGS = ("model", "data", "epochs", "batch", "imgsz", "seed", "device", "project", "name", "exist_ok",
              "plots", "save", "val", "workers", "resume", "pretrained")


#: where the tensors the start weights do not supply (the class branches for another ``nc``) start from:
#: ``client`` = each client's own Ultralytics seed (UltraFlwr: its trainer rebuilds the model under ``seed=cid``
#: before loading the weights), ``common`` = the run's one model, the same on every client
HEAD_INITS = ("client", "common")


@dataclass(frozen=True)
class YoloStart:
    """How a model was built: yaml, class count, seed, start weights and the loader's report of what they
    supplied (kept so that a client can later re-initialise exactly the tensors they did not supply)."""

    cfg: str
    nc: int
    seed: int
    weights: str | None = None
    report: LoadReport | None = None

    def unsupplied(self, keys: Iterable[str]) -> list[str]:
        """Those of ``keys`` the start weights left at the seeded init; none without start weights (the
        server's random model is then the start and every client receives all of it)."""
        if self.report is None:
            return []
        loaded = set(self.report.loaded)
        return [k for k in keys if k not in loaded]


def build_yolo(cfg: str, nc: int, seed: int, weights: str | None = None) -> torch.nn.Module:
    """A DetectionModel for ``nc`` classes from a yaml (random init, seeded: every process builds the
    same initial weights); ``weights``: a local ``.pt`` (e.g. COCO yolo11n.pt) read with
    ``weights_only=True``: every tensor but the class-count head layers must load. The build and the
    loader's report stay on the model as ``yolo_start`` (:class:`YoloStart`)."""
    from ultralytics.nn.tasks import DetectionModel

    from fedmedbench.weights.models import load_yolo

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = DetectionModel(cfg, nc=nc, verbose=False)
    report = load_yolo(model, weights) if weights else None
    model = model.float()
    model.yolo_start = YoloStart(cfg=cfg, nc=int(nc), seed=int(seed), weights=weights, report=report)
    return model


def yolo_start(model: torch.nn.Module) -> YoloStart:
    """The build record of a model from :func:`build_yolo` (which tensors its start weights supplied)."""
    start = getattr(model, "yolo_start", None)
    if not isinstance(start, YoloStart):
        raise ValueError("not a model from build_yolo: no record of its start weights (yolo_start)")
    return start


def reinit_unsupplied(model: torch.nn.Module, seed: int, keep: Iterable[str] = ()) -> list[str]:
    """Give the tensors the start weights did not supply (all but ``keep``) the values of a fresh build under
    ``seed``: what Ultralytics' trainer does when it rebuilds the model under its own seed and loads the start
    weights into it by shape (UltraFlwr's clients in round 1, ``seed=cid``). Returns the keys set."""
    start = yolo_start(model)
    kept = set(keep)
    keys = [k for k in start.unsupplied(model.state_dict()) if k not in kept]
    if keys:
        fresh = build_yolo(start.cfg, start.nc, seed=seed).state_dict()
        model.load_state_dict({k: fresh[k] for k in keys}, strict=False)
    return keys


def device_arg(device: torch.device) -> str:
    return "cpu" if device.type == "cpu" else str(device.index or 0)


@dataclass
class TrainOutcome:
    """What one local training produced: the selected fp32 weights and what was measured."""

    state: dict[str, torch.Tensor]
    selected_epoch: int
    val_map50: list[float] = field(default_factory=list)  # per epoch (NaN where not validated)
    train_loss: float = math.nan

    @property
    def selected_val_map50(self) -> float:
        return self.val_map50[self.selected_epoch] if self.val_map50 else math.nan


def _fp32_copy(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: (v.detach().float() if v.is_floating_point() else v.detach()).cpu().clone() for k, v in state.items()}


def train_yolo(
    model: torch.nn.Module, data_yaml: str | Path, *, epochs: int, batch: int, imgsz: int, seed: int,
    device: torch.device, workdir: str | Path, select: str = "best", select_metric: str = "fitness",
    extra: dict[str, Any] | None = None, auto_optimizer: str = "ultralytics_8_3", fitness: str = "ultralytics_8_3",
    workers: int = 0, warmup: str = "ultralytics_8_3", assigner: str = "ultralytics_8_3", hsv: str = "ultralytics_8_3",
    read_ahead: bool = False, ap: str = "ultralytics_8_3", pixel_thread: bool = False, match: str = "ultralytics_8_3",
    pipeline: str = "ultralytics_8_3",
) -> TrainOutcome:
    """Train ``model`` (its current weights) for ``epochs`` with Ultralytics' detection trainer (``workers``
    dataloader processes; 0 = in this process, as UltraFlwr, where ``read_ahead`` loads the next batches in a
    thread while the model trains, and ``pixel_thread`` runs each sample's last pixel steps in another: the same
    samples)."""
    EpochSelector(select, select_metric)  # fail on a bad choice before Ultralytics starts
    trainer_cls = study_trainer(auto_optimizer, fitness, warmup, assigner, hsv, read_ahead, pixel_thread, pipeline)
    extra = dict(extra or {})
    fixed = sorted(set(extra) & set(FIXED_ARGS))
    if fixed:
        raise ValueError(f"ultralytics overrides {fixed} are set by the study itself (train.ultralytics)")

    args = dict(model=str(getattr(model, "yaml_file", "") or "yolo11n.yaml"), data=str(data_yaml), epochs=int(epochs),
                batch=int(batch), imgsz=int(imgsz), seed=int(seed), deterministic=True, device=device_arg(device),
                workers=int(workers), project=str(Path(workdir).resolve()), name="train", exist_ok=True, plots=False, save=False,
                val=select == "best", amp=device.type == "cuda", verbose=False, **extra)
    selector = EpochSelector(select, select_metric)
    label_cache.install()  # its dataset caches are never unpickled
    with without_integrations(), ultralytics_offline(), ap_rule(ap), match_rule(match), anchors_kept():
        import_before_seeding()
        trainer = trainer_cls(overrides=args)
        trainer.model = model  # used as is by setup_model (no rebuild, our weights)
        trainer.add_callback("on_fit_epoch_end", selector)
        trainer.train()
    return TrainOutcome(state=selector.state, selected_epoch=selector.epoch, val_map50=selector.curve,
                        train_loss=_total_loss(getattr(trainer, "tloss", None)))


class EpochSelector:
    """``on_fit_epoch_end`` callback: keeps the fp32 EMA weights of the chosen epoch and the mAP50 curve.

    ``best``: the validated epoch with the highest score (:func:`selection_score`; the last on ties,
    as Ultralytics rewrites ``best.pt`` whenever an epoch's fitness equals the best so far);
    ``last``: the final epoch. Epochs not really validated never count as best.
    """

    def __init__(self, select: str = "best", select_metric: str = "fitness") -> None:
        if select not in SELECT:
            raise ValueError(f"select must be one of {SELECT}, got '{select}'")
        if select_metric not in SELECT_METRICS:
            raise ValueError(f"select_metric must be one of {SELECT_METRICS}, got '{select_metric}'")
        self.select, self.select_metric = select, select_metric
        self.best, self.state, self.epoch, self.curve = -math.inf, None, -1, []

    def __call__(self, tr) -> None:
        metrics = tr.metrics or {}
        m50 = float(metrics.get("metrics/mAP50(B)", math.nan))
        validated = getattr(tr, "validated_epoch", None) == tr.epoch and not math.isnan(m50)
        self.curve.append(m50 if validated else math.nan)
        score = selection_score(metrics, self.select_metric) if validated else math.nan
        last = tr.epoch + 1 >= tr.epochs or tr.stop
        better = self.select == "best" and validated and score >= self.best
        if better or (self.select == "last" and last) or self.state is None:
            self.best = score if better else self.best
            self.state = _fp32_copy(tr.ema.ema.state_dict())
            self.epoch = int(tr.epoch)


def _total_loss(tloss) -> float:
    """The last epoch's mean training loss (box + cls + dfl), whatever container Ultralytics keeps it in."""
    if tloss is None:
        return math.nan
    values = tloss.values() if isinstance(tloss, dict) else [tloss]
    return float(sum(float(torch.as_tensor(v).float().sum()) for v in values))


def fused_copy(model: torch.nn.Module) -> torch.nn.Module:
    """An fp32 eval copy with conv+bn fused, as Ultralytics' backend would fuse it for validation.

    Fused here quietly: the backend then skips its own fusion, which also profiles the model's
    FLOPs with a deep copy and a forward pass on every validation (0.15-0.2 s a call on a CPU at 64 px).
    """
    copy_ = copy.deepcopy(model).float().eval()
    return copy_.fuse(verbose=False) if hasattr(copy_, "fuse") else copy_


def study_validator() -> type:
    """Ultralytics' DetectionValidator (as the module holds it when called) reading the frames stored at training
    size where the stage links them (:mod:`~fedmedbench.fl.tasks.detection.sized_frames`: the same arrays, so the
    same scores)."""
    from ultralytics.models.yolo.detect import DetectionValidator

    class _Validator(DetectionValidator):
        def build_dataset(self, img_path, mode="val", batch=None):
            dataset = super().build_dataset(img_path, mode, batch)
            read_sized_frames(dataset, log=_log)
            return dataset

    return _Validator


def validate_yolo(
    model: torch.nn.Module, data_yaml: str | Path, split: str, *, imgsz: int, batch: int, device: torch.device,
    workdir: str | Path, conf: float = 0.001, iou: float = 0.7, rect: bool = True, workers: int = 0,
    ap: str = "ultralytics_8_3", match: str = "ultralytics_8_3",
) -> dict[str, float]:
    """mAP50 and mAP50-95 of ``model`` on ``split`` of ``data_yaml`` with Ultralytics' DetectionValidator.

    ``rect``: rectangular batches (images padded to the batch's aspect ratio, not to a square), as
    Ultralytics' ``model.val()`` sets by default and UltraFlwr's test scripts therefore use; a bare
    validator would letterbox every image to ``imgsz`` x ``imgsz``. ``ap``: :data:`.ap.AP_RULES`; ``match``:
    :data:`.matching.MATCH_RULES`.
    """
    args = dict(data=str(data_yaml), split=split, imgsz=int(imgsz), batch=int(batch), device=device_arg(device),
                workers=int(workers), plots=False, save_json=False, verbose=False, conf=conf, iou=iou, rect=bool(rect),
                project=str(Path(workdir).resolve()), name="val", exist_ok=True)
    label_cache.install()
    with ultralytics_offline(), ap_rule(ap), match_rule(match):
        validator = study_validator()(args=args)
        stats = validator(model=fused_copy(model))
    return {"map50": float(stats["metrics/mAP50(B)"]), "map50_95": float(stats["metrics/mAP50-95(B)"])}
