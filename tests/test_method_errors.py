"""A method that raises names itself and its line: a user's file at import, in ``client_fit`` (through the real
ClientApp, whose error reply the server reads) and in ``aggregate`` give one console line with the exception's
last line, the method and its file:line; the traceback stays in the job's log (``fl/api/method_errors.py``)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from helpers import split_labels

from fedmedbench.data import synthetic
from fedmedbench.fl.api import method_errors
from fedmedbench.fl.api.registry import USER_MODULE_PREFIX, get_method
from fedmedbench.fl.engine import flower as engine
from fedmedbench.fl.spec import RunSpec
from fedmedbench.partition import schemes as P
from fedmedbench.workflow import io
from fedmedbench.workflow.diagnostics import job_error_line
from fedmedbench.workflow.runlog import log_to

pytestmark = pytest.mark.usefixtures("restore_registry")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("method_errors")
    arrays = synthetic.generate("breastmnist", 28, seed=0, counts={"train": 60, "val": 10, "test": 20})
    io.write_npz(d / "b.npz", arrays)
    io.write_json(d / "p.json", P.build_partition(split_labels(arrays), "iid", 2, 0, {}, num_classes=2))
    return d


def _method_file(folder: Path, name: str, body: str) -> Path:
    path = folder / f"{name}.py"
    path.write_text("from fedmedbench.fl.api import Method, register_method\n\n\n"
                    f"@register_method({name!r})\nclass M(Method):\n" + textwrap.indent(textwrap.dedent(body), "    "))
    return path


def _spec(d: Path, name: str, path: Path) -> RunSpec:
    return RunSpec(run_dir=str(d / name), study="t", dataset="breastmnist", setting="iid", method=name, seed=0,
                   partition_path=str(d / "p.json"), sources={"base": str(d / "b.npz")}, image_size=28,
                   train={"rounds": 2, "local_epochs": 1, "batch_size": 16, "lr": 0.05}, device="cpu", threads=1,
                   method_file=str(path))


def _line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def _console(spec: RunSpec, log: Path, capfd) -> str:
    """What the job's console shows: the entry script's log_to around the engine."""
    with pytest.raises(SystemExit):
        with log_to(log):
            engine.run(spec, log=lambda m: None)
    return capfd.readouterr().err.strip()


def test_a_method_file_raising_at_import_is_named_with_its_line(tmp_path):
    path = tmp_path / "boom.py"
    path.write_text("from fedmedbench.fl.api import Method, register_method\n\nraise RuntimeError('boom at import')\n\n\n"
                    "@register_method('boom_at_import')\nclass Boom(Method):\n    pass\n")
    with pytest.raises(RuntimeError, match="boom at import") as info:
        get_method("boom_at_import", {}, str(path))
    assert USER_MODULE_PREFIX + "boom_at_import" not in sys.modules  # a later import tries again
    line = job_error_line(info.value, "x.log")
    assert line.startswith(f"error: RuntimeError: boom at import [in method 'boom_at_import' at {path}:3 (<module>), "
                           "while its file was imported] (traceback in x.log"), line


def test_a_name_error_in_client_fit_names_the_error_and_the_line_on_the_console(data, capfd):
    path = _method_file(data, "fit_name_error", """
        def client_fit(self, ctx):
            return undefined_name
    """)
    log = data / "fit.log"
    err = _console(_spec(data, "fit_name_error", path), log, capfd)
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: round 1 training: 1 client(s) failed; first error: client 0: NameError: name "
                          f"'undefined_name' is not defined [in method 'fit_name_error' at {path}:"
                          f"{_line_of(path, 'undefined_name')} (client_fit), the client step of round 1]"), err
    assert "Traceback" in log.read_text() and "Traceback" not in err


def test_an_error_in_aggregate_names_the_round_and_the_line(data, capfd):
    path = _method_file(data, "agg_error", """
        def aggregate(self, ctx):
            scale = 1 / missing_count
            return {k: v * scale for k, v in ctx.global_arrays.items()}
    """)
    err = _console(_spec(data, "agg_error", path), data / "agg.log", capfd)
    assert err.startswith("error: NameError: name 'missing_count' is not defined [in method 'agg_error' at "
                          f"{path}:{_line_of(path, 'missing_count')} (aggregate), the server step (aggregate) of "
                          "round 1]"), err


def test_the_line_an_error_reply_shows_from_either_backend():
    """Inline: the ClientApp's exception as Flower's ``<class 'X'>:<'text'>``; Ray: wrapped once more."""
    line = "client 1: ZeroDivisionError: division by zero [in method 'm' at m.py:9 (client_fit), the client step of round 2]"
    inline = f"<class 'RuntimeError'>:<'{line}\nTraceback (most recent call last):\n  ...'>\nTraceback ..."
    ray = f"<class 'flwr.clientapp.client_app.ClientAppException'>:<'\nException ClientAppException occurred. Message: {line}\nTraceback ...'>"
    assert engine.first_error_line(inline) == engine.first_error_line(ray) == line
    assert engine.first_error_line("<class 'flwr.X.SiteRefusal'>:<'the site refuses'>") == "SiteRefusal: the site refuses"


def test_a_note_names_the_deepest_line_in_the_methods_files(tmp_path):
    def inner():
        raise ValueError("x")

    try:
        inner()
    except ValueError as exc:
        method_errors.add_note(exc, "m", [__file__], "a step")
        method_errors.add_note(exc, "m", [__file__], "a second step")  # one note per exception
        assert exc.__notes__ == [f"in method 'm' at {method_errors.shown(__file__)}:"
                                 f"{inner.__code__.co_firstlineno + 1} (inner), a step"]
    err = KeyError("k")
    method_errors.add_note(err, "m", [tmp_path / "other.py"], "a step")
    assert err.__notes__ == ["in method 'm', a step"]  # no frame in the method's files: no line


def test_a_server_step_returning_a_wrong_shape_is_named_with_method_round_and_key(data, monkeypatch):
    """Round 2's aggregate transposes a weight: the run stops naming the method, the round and the server step
    (it failed later, as a load error naming only the array), and keeps nothing of the round."""
    from fedmedbench.fl.engine.replies import ServerStepError
    from fedmedbench.fl.methods.fedavg import FedAvg

    honest = FedAvg.aggregate

    def transposed(self, ctx):
        out = honest(self, ctx)
        if ctx.rnd == 2:
            out["classifier.2.weight"] = out["classifier.2.weight"].T.contiguous()
        return out

    monkeypatch.setattr(FedAvg, "aggregate", transposed)
    spec = RunSpec(run_dir=str(data / "wrong_shape"), study="t", dataset="breastmnist", setting="iid", method="fedavg",
                   seed=0, partition_path=str(data / "p.json"), sources={"base": str(data / "b.npz")}, image_size=28,
                   train={"rounds": 2, "local_epochs": 1, "batch_size": 16, "lr": 0.05}, device="cpu", threads=1)
    with pytest.raises(ServerStepError) as info:
        engine.run(spec, log=lambda m: None)
    assert str(info.value).startswith("round 2: method 'fedavg''s server step (aggregate) returned 'classifier.2.weight' "
                                      "with shape (128, 2), the server's model has (2, 128)"), info.value
    assert not (data / "wrong_shape" / "model.pt").exists()


def test_a_server_step_dropping_a_shared_key_is_named():
    import torch

    from fedmedbench.fl.engine.replies import ServerStepError, check_aggregated

    model = {"w": ((2, 3), "float32"), "b": ((2,), "float32")}
    check_aggregated(4, {"w": torch.zeros(2, 3), "b": torch.zeros(2)}, model, ["w", "b"], "m")
    with pytest.raises(ServerStepError, match=r"^round 4: method 'm''s server step \(aggregate\) returned a model "
                                              r"without 'b'\. The run stops here"):
        check_aggregated(4, {"w": torch.zeros(2, 3)}, model, ["w", "b"], "m")
