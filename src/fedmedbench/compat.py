"""The one place that configures or patches third-party libraries.

Imported first by ``fedmedbench/__init__.py`` so that every entry point (Snakemake
scripts, tests, Flower/Ray actors that unpickle our code) gets the same settings.

What it does, and why:

* Offline switches. Ultralytics, huggingface_hub and albumentations try the network
  at import or first use; there is no network on CI and often none on cluster compute
  nodes. We set their documented environment switches (only if the user did not set
  them), plus Flower's telemetry switch, and Ultralytics' safe-load switch (weight
  files are never unpickled with ``weights_only=False``; fedmedbench.weights also asks
  for the safe path explicitly).
* ``torchvision::nms``. The torchvision 0.28.0 wheel on PyPI is a CUDA build whose
  compiled ops do not load next to the CPU build of torch 2.13.0; torchvision then
  fails at import (``operator torchvision::nms does not exist``) and Ultralytics with
  it. When (and only when) the compiled library cannot be loaded we define the
  ``torchvision::nms``/``qnms`` operators with a pure-PyTorch kernel before
  torchvision is imported, and route ``torchvision.ops.nms`` to it. On a machine
  where the compiled ops load (e.g. a CUDA cluster node) nothing is patched. This is
  done by a one-shot import hook on the first ``import torchvision``, so importing
  fedmedbench itself does not import torch (light jobs stay light).
* medmnistc's motion blur calls ``np.fromstring`` on binary data, which NumPy >= 2.3
  rejects. We give that one module a NumPy whose ``fromstring`` is ``frombuffer``.
  (medmnistc also needs ImageMagick's MagickWand shared library: see docs/install.md.)
* Snakemake's rerun reason "Params have changed since last execution" prints every changed
  param value before and now in full (a run's spec: 1-2 kB). The Snakefile calls
  :func:`patch_snakemake_params_reason`, after which it names the changed keys, old -> new
  (``fedmedbench.workflow.rerun_reason``); which jobs rerun is unchanged.
* Ray binds its servers (GCS, raylet, object manager, workers) to the node's address and has no
  authentication. On Linux it replaces a loopback ``_node_ip_address`` with the machine's network
  address unless its cluster switch is off: :func:`keep_ray_on_loopback` turns it off before the
  ``ray`` engine backend starts Ray on 127.0.0.1.

* Flower's SuperLink and SuperNode under load (started by ``python -m fedmedbench.deploy
  superlink|supernode``, which call :func:`patch_flower_deployment`). With ``--database FILE`` the
  SuperLink keeps its state and every message's payload in one SQLite file; registering a YOLO model's
  payload (thousands of array chunks, one statement each) holds the write lock for seconds, longer on a
  loaded machine, while every other request waits at most 5 s and then fails with HTTP 500 "database is
  locked". A SuperNode, and the SuperLink's own SuperExec, take a 500 as fatal: an upload was lost, the
  run failed and the next stayed pending (the SuperExec had exited). Payloads now stay in memory (they
  live from a push to its pull; the file keeps runs and registered SuperNodes), the lock wait is
  :data:`FLOWER_SQLITE_BUSY_MS` (below the 30 s request time-out), and a 500 is taken again up to
  :data:`FLOWER_SERVER_ERROR_RETRIES` times (:func:`retrying_server_errors`) by a SuperNode, by the
  SuperExec a SuperLink starts (started through the project's launcher, so it is patched too) and by
  the ServerApp (its grid, built before this package is loaded: :func:`retry_grid_server_errors`).
  Each patch names the flwr 1.42 function or attribute it replaces; tests/test_compat.py checks them.

Two patches live beside what they serve, applied only while a detection job trains or validates:
Ultralytics' network calls (``fl/tasks/detection/yolo.py``, ``ultralytics_offline``) and its pickled
dataset caches (``fl/tasks/detection/label_cache.py``: written and read without pickle).
"""

from __future__ import annotations

import functools
import glob
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import time
import types
from collections.abc import Callable
from typing import Any

OFFLINE_ENV = {
    "YOLO_OFFLINE": "1",
    "HF_HUB_OFFLINE": "1",
    "NO_ALBUMENTATIONS_UPDATE": "1",
    "FLWR_TELEMETRY_ENABLED": "0",
    "YOLO_VERBOSE": "False",
    "RAY_DEDUP_LOGS": "0",
    # Ultralytics' opt-in safe loading: checkpoints are read with torch.load(weights_only=True) and
    # only known Ultralytics/torch classes are rebuilt, so a crafted .pt cannot run code
    "ULTRALYTICS_SAFE_LOAD": "1",
}

#: True when the pure-PyTorch NMS fallback is active in this process.
TORCHVISION_NMS_FALLBACK = False


def apply_offline_env() -> None:
    """Set the libraries' offline switches unless the user chose otherwise."""
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)


#: candidates up to which the fallback NMS takes every pairwise IoU at once: its float32 temporaries are
#: N x N (about 150 MB of peak memory at 2048, 450 MB at 4096), and above about 2000 candidates the
#: stepwise loop is as fast
NMS_MATRIX_MAX = 2048


def nms_reference(boxes, scores, iou_threshold: float):
    """Greedy NMS in plain PyTorch, same contract as ``torchvision.ops.nms``.

    Boxes are (x1, y1, x2, y2); returns int64 indices of kept boxes sorted by decreasing score.
    Up to ``NMS_MATRIX_MAX`` candidates the pairwise suppressions are one tensor expression and
    the greedy pass walks NumPy rows (a detector's validation calls this once per image); above
    it, memory stays O(N) per step (no N x N matrix) for the tens of thousands of candidates a
    detector can emit. Both paths evaluate the same float32 IoU expression, so they keep the
    same boxes.
    """
    import torch

    if boxes.numel() == 0:
        return torch.empty((0,), dtype=torch.int64, device=boxes.device)
    order = torch.argsort(scores, descending=True, stable=True)
    b = boxes[order].float()
    areas = (b[:, 2] - b[:, 0]).clamp(min=0) * (b[:, 3] - b[:, 1]).clamp(min=0)
    if b.shape[0] <= NMS_MATRIX_MAX:
        keep = _greedy_keep(_suppresses(b, areas, iou_threshold))
    else:
        keep = _greedy_keep_stepwise(b, areas, iou_threshold)
    return order[torch.tensor(keep, dtype=torch.int64, device=b.device)]


def _iou_over(b_i, rest, area_i, areas_rest, iou_threshold: float):
    """Whether each box of ``rest`` overlaps ``b_i`` above the threshold (``b_i`` may broadcast)."""
    import torch

    xx1 = torch.maximum(b_i[..., 0], rest[..., 0])
    yy1 = torch.maximum(b_i[..., 1], rest[..., 1])
    xx2 = torch.minimum(b_i[..., 2], rest[..., 2])
    yy2 = torch.minimum(b_i[..., 3], rest[..., 3])
    inter = (xx2 - xx1).clamp(min=0) * (yy2 - yy1).clamp(min=0)
    return inter / (area_i + areas_rest - inter) > iou_threshold


def _suppresses(b, areas, iou_threshold: float):
    """(N, N) NumPy booleans: row i marks the boxes box i suppresses when it is kept."""
    return _iou_over(b[:, None, :], b[None, :, :], areas[:, None], areas[None, :], iou_threshold).cpu().numpy()


def _greedy_keep(sup) -> list[int]:
    import numpy as np

    n = sup.shape[0]
    alive = np.ones(n, dtype=bool)
    keep = []
    for i in range(n):
        if alive[i]:
            keep.append(i)
            alive[i + 1 :] &= ~sup[i, i + 1 :]
    return keep


def _greedy_keep_stepwise(b, areas, iou_threshold: float) -> list[int]:
    import torch

    alive = torch.ones(b.shape[0], dtype=torch.bool, device=b.device)
    keep = []
    for i in range(b.shape[0]):
        if not bool(alive[i]):
            continue
        keep.append(i)
        alive[i + 1 :] &= ~_iou_over(b[i], b[i + 1 :], areas[i], areas[i + 1 :], iou_threshold)
    return keep


def _torchvision_compiled_ops_load() -> bool:
    """Try to load torchvision's compiled ops without importing torchvision."""
    import torch

    spec = importlib.machinery.PathFinder.find_spec("torchvision")  # not via sys.meta_path (our hook)
    if spec is None or not spec.submodule_search_locations:
        return True  # nothing to patch
    for location in spec.submodule_search_locations:
        for lib in glob.glob(os.path.join(location, "_C*.so")) + glob.glob(os.path.join(location, "_C*.pyd")):
            try:
                torch.ops.load_library(lib)
                return True
            except (OSError, RuntimeError, ImportError):
                return False
    return False


def _define_fallback_ops() -> None:
    """Define ``torchvision::nms``/``qnms`` with pure-PyTorch kernels (before torchvision is imported)."""
    import torch

    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.impl("nms", nms_reference, "CompositeExplicitAutograd")

    def _qnms(dets, scores, iou_threshold):
        raise NotImplementedError("quantized NMS needs torchvision's compiled ops")

    lib.impl("qnms", _qnms, "CompositeExplicitAutograd")
    _KEEP_ALIVE.append(lib)


def _route_ops_nms(torchvision_module) -> None:
    """Point ``torchvision.ops.nms`` (which refuses to run without compiled ops) at the registered op."""
    import torch

    def nms(boxes, scores, iou_threshold):  # same signature as torchvision.ops.nms
        return torch.ops.torchvision.nms(boxes, scores, float(iou_threshold))

    torchvision_module.ops.nms = nms
    torchvision_module.ops.boxes.nms = nms


class _TorchvisionImportHook(importlib.abc.MetaPathFinder):
    """Hook on ``import torchvision``: define the fallback ops first, patch nms right after.

    Keeps ``import fedmedbench`` light (no torch/torchvision import) for jobs that never
    touch torchvision, while every process that does import it gets the fallback. Libraries
    often only probe ``importlib.util.find_spec("torchvision")`` (HF ``datasets`` does on
    import): a probe costs one path lookup, and the hook stays in place; the compiled-ops
    check (which imports torch) runs when torchvision's module code actually runs.
    """

    def find_spec(self, name, path=None, target=None):
        if name != "torchvision":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        run_module = spec.loader.exec_module

        def exec_module(module):
            global TORCHVISION_NMS_FALLBACK
            _remove_hook()
            fallback = not _torchvision_compiled_ops_load()
            if fallback:
                _define_fallback_ops()
            run_module(module)
            if fallback:
                _route_ops_nms(module)
                TORCHVISION_NMS_FALLBACK = True

        spec.loader.exec_module = exec_module
        return spec


_HOOK = _TorchvisionImportHook()


def _remove_hook() -> None:
    if _HOOK in sys.meta_path:
        sys.meta_path.remove(_HOOK)


def install_import_hook() -> None:
    if "torchvision" not in sys.modules and _HOOK not in sys.meta_path:
        sys.meta_path.insert(0, _HOOK)


_KEEP_ALIVE: list = []


class _NumpyFromBuffer(types.ModuleType):
    """A view of numpy whose ``fromstring`` reads binary data (``frombuffer``)."""

    def __init__(self) -> None:
        super().__init__("numpy")
        import numpy

        self._np = numpy

    def __getattr__(self, name: str):
        return getattr(self._np, name)

    def fromstring(self, data, dtype=float, *args, **kwargs):  # noqa: D401
        if isinstance(data, bytes | bytearray | memoryview):
            return self._np.frombuffer(data, dtype=dtype).copy()
        return self._np.fromstring(data, dtype, *args, **kwargs)


def patch_medmnistc() -> None:
    """Make medmnistc's motion blur work with NumPy >= 2.3 (``np.fromstring``)."""
    try:
        import medmnistc.corruptions.filter as filt
    except ImportError as exc:  # MagickWand missing: make the cause obvious
        raise ImportError(
            "medmnistc could not be imported. It needs ImageMagick's MagickWand library "
            "(Debian/Ubuntu: `apt-get install libmagickwand-6.q16-6`; see docs/install.md). "
            f"Original error: {exc}"
        ) from exc
    if not isinstance(filt.np, _NumpyFromBuffer):
        filt.np = _NumpyFromBuffer()


def _column_as_array(self, dtype=None, copy=None):
    import numpy as np

    return np.asarray(self[:], dtype=dtype)  # one batch read, not one Python row per element


def patch_datasets_column() -> None:
    """Make ``np.asarray(dataset["label"])`` a batch read under ``datasets`` >= 4.

    datasets 4 returns a lazy ``Column`` for ``dataset[name]``; NumPy converts it through
    the sequence protocol, one formatted row at a time. flwr-datasets' Dirichlet and
    pathological partitioners call ``np.array(self.dataset[partition_by])``, which then
    took ~10 s for 100k labels. ``Column[:]`` reads the whole column at once.
    """
    from datasets.arrow_dataset import Column

    if getattr(Column, "__array__", None) is not _column_as_array:
        Column.__array__ = _column_as_array


def limit_threads(n: int) -> None:
    """Cap torch/BLAS threads for this process (a Snakemake rule's ``threads``)."""
    import torch

    n = max(1, int(n))
    torch.set_num_threads(n)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(n)


apply_offline_env()
install_import_hook()


#: Ray's switch for clusters beyond one machine (read by ``ray._private.ray_constants`` at import)
RAY_CLUSTER_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def keep_ray_on_loopback() -> None:
    """Let Ray keep a loopback node address (its cluster switch off, in this process and the ones it starts), so
    every Ray process of a job listens on 127.0.0.1 only."""
    os.environ[RAY_CLUSTER_ENV] = "0"
    import ray._private.ray_constants as ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


def patch_snakemake_params_reason() -> None:
    """Snakemake's params-changed reason as the changed keys, old -> new (called by the Snakefile)."""
    from snakemake.persistence import ParamsChange

    from fedmedbench.workflow.rerun_reason import params_diff

    def __str__(self: ParamsChange) -> str:  # noqa: N807 - the method replaced
        return params_diff(self.only_old, self.only_new) if self else "No params change"

    ParamsChange.__str__ = __str__


#: how long the SuperLink's SQLite state waits for a lock (Flower's: 5 s); under the SuperNodes' 30 s request time-out
FLOWER_SQLITE_BUSY_MS = 20_000
#: HTTP 500 answers a SuperNode takes again per request (Flower's: none), waiting 1, 2, 4, ... s
FLOWER_SERVER_ERROR_RETRIES = 5


def retrying_server_errors(invoke: Callable[..., Any], tries: int = FLOWER_SERVER_ERROR_RETRIES,
                           wait: Callable[[float], None] = time.sleep,
                           held_back: Callable[[], bool] = lambda: False) -> Callable[..., Any]:
    """``invoke`` (a Flower ``RetryInvoker.invoke``: transport errors and 502-504 it retries itself) that
    takes an HTTP 500 answer again, up to ``tries`` times: the SuperLink answers 500 for any error of its
    own, a lock wait past its limit included, and the caller would exit on the first. ``held_back()`` true:
    no retry (Flower's exit handlers ask their invoker for one try only). Giving up is one line, then the error."""

    def call(target: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        import httpx

        for attempt in range(tries + 1):
            try:
                return invoke(target, *args, **kwargs)
            except httpx.HTTPStatusError as exc:
                if exc.response.status_code != 500 or held_back():
                    raise
                if attempt == tries:
                    print(f"fedmedbench: the SuperLink answered 500 to {exc.request.url.path} {tries + 1} times; "
                          "giving up", file=sys.stderr, flush=True)
                    raise
                delay = min(2.0 ** attempt, 30.0)
                print(f"fedmedbench: the SuperLink answered 500 to {exc.request.url.path}; trying again in {delay:g} s "
                      f"({attempt + 1} of {tries})", file=sys.stderr, flush=True)
                wait(delay)
        raise AssertionError("unreachable")

    call.retries_server_errors = True
    return call


def _retrying_invoker(make: Callable[[], Any]) -> Callable[[], Any]:
    """Flower's ``make_simple_http_retry_invoker`` whose invokers retry 500 answers (once wrapped)."""
    if getattr(make, "retries_server_errors", False):
        return make

    @functools.wraps(make)
    def make_invoker():
        invoker = make()
        invoker.invoke = retrying_server_errors(invoker.invoke)
        return invoker

    make_invoker.retries_server_errors = True
    return make_invoker


def retry_grid_server_errors(grid: Any, wait: Callable[[float], None] = time.sleep) -> bool:
    """A deployed ServerApp's requests to the SuperLink take a 500 answer again, as a SuperNode's do; True when
    patched. In flwr 1.42 the ``flwr-serverapp`` process builds its ``HttpGrid`` before it loads this package, and
    every request of the grid (push, pull, heartbeat, final status) goes through the grid's one ``RetryInvoker``:
    that invoker is wrapped, unless its exit handler has set it to one try. Any other grid (a simulation's
    ``InMemoryGrid``, a Flower whose ``HttpGrid`` has no such invoker) is left as it is: False."""
    invoker = getattr(grid, "_retry_invoker", None) if type(grid).__name__ == "HttpGrid" else None
    if invoker is None or not hasattr(invoker, "max_tries") or not callable(getattr(invoker, "invoke", None)):
        return False
    if not getattr(invoker.invoke, "retries_server_errors", False):
        invoker.invoke = retrying_server_errors(invoker.invoke, wait=wait, held_back=lambda: invoker.max_tries == 1)
    return True


def patch_flower_deployment() -> None:
    """Flower's SuperLink keeps message payloads in memory and waits :data:`FLOWER_SQLITE_BUSY_MS` for a lock of its
    state, starts its SuperExec through the project's launcher; a SuperNode and a SuperExec retry 500 answers
    (:func:`retrying_server_errors`); for this process (a SuperLink's, SuperNode's or SuperExec's), before it starts."""
    from flwr.supercore import sql_mixin
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.superlink import config_loader
    from flwr.supernode import fleet_http_connection

    # the modules, not the functions their packages re-export under the same names
    run_superexec = importlib.import_module("flwr.supercore.superexec.run_superexec")
    flower_superlink = importlib.import_module("flwr.superlink.cli.flower_superlink")

    sql_mixin.SQLITE_PRAGMAS = tuple((k, str(FLOWER_SQLITE_BUSY_MS) if k == "busy_timeout" else v)
                                     for k, v in sql_mixin.SQLITE_PRAGMAS)
    config_loader.ObjectStoreFactory = lambda database=None: ObjectStoreFactory()  # payloads in memory
    fleet_http_connection.make_simple_http_retry_invoker = _retrying_invoker(
        fleet_http_connection.make_simple_http_retry_invoker)
    run_superexec.make_simple_http_retry_invoker = _retrying_invoker(run_superexec.make_simple_http_retry_invoker)
    flower_superlink._get_superexec_command = _superexec_through_launcher(flower_superlink._get_superexec_command)


def _superexec_through_launcher(command: Callable[..., list[str]]) -> Callable[..., list[str]]:
    """The SuperExec a SuperLink starts (``flower-superexec ARGS``: it starts the ServerApp processes and asks the
    SuperLink for their tasks) as ``python -m fedmedbench.deploy superexec ARGS``: Flower's program after
    :func:`patch_flower_deployment`, so its requests to the SuperLink retry 500 answers too."""
    if getattr(command, "retries_server_errors", False):
        return command

    @functools.wraps(command)
    def through_launcher(*args: Any, **kwargs: Any) -> list[str]:
        cmd = command(*args, **kwargs)
        if cmd[:1] != ["flower-superexec"]:
            return cmd
        return [sys.executable, "-m", "fedmedbench.deploy", "superexec", *cmd[1:]]

    through_launcher.retries_server_errors = True
    return through_launcher
