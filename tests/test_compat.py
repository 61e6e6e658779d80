"""The torchvision NMS fallback agrees with a brute-force NMS; offline switches are set."""

import os

import torch

from fedmedbench import compat


def brute_force_nms(boxes, scores, thr):
    order = sorted(range(len(scores)), key=lambda i: -float(scores[i]))
    keep = []
    for i in order:
        ok = True
        for j in keep:
            x1, y1 = max(boxes[i][0], boxes[j][0]), max(boxes[i][1], boxes[j][1])
            x2, y2 = min(boxes[i][2], boxes[j][2]), min(boxes[i][3], boxes[j][3])
            inter = max(0.0, x2 - x1) * max(0.0, y2 - y1)
            a = (boxes[i][2] - boxes[i][0]) * (boxes[i][3] - boxes[i][1])
            b = (boxes[j][2] - boxes[j][0]) * (boxes[j][3] - boxes[j][1])
            if inter / (a + b - inter) > thr:
                ok = False
                break
        if ok:
            keep.append(i)
    return keep


def random_boxes(n, gen):
    xy = torch.rand(n, 2, generator=gen) * 100
    wh = torch.rand(n, 2, generator=gen) * 30 + 1
    return torch.cat([xy, xy + wh], 1), torch.rand(n, generator=gen)


def test_reference_nms_matches_brute_force():
    gen = torch.Generator().manual_seed(0)
    for n, thr in [(1, 0.5), (30, 0.3), (120, 0.5), (200, 0.7)]:
        boxes, scores = random_boxes(n, gen)
        got = compat.nms_reference(boxes, scores, thr).tolist()
        assert got == brute_force_nms(boxes.tolist(), scores.tolist(), thr)


def test_the_matrix_and_stepwise_paths_keep_the_same_boxes(monkeypatch):
    """Up to NMS_MATRIX_MAX candidates every IoU is taken at once; above it, one row per kept box.
    Both keep the same boxes, also with tied scores, duplicate and zero-width boxes."""
    gen = torch.Generator().manual_seed(2)
    cases = []
    for n, thr in [(2, 0.5), (84, 0.7), (300, 0.45), (1500, 0.6)]:
        boxes, scores = random_boxes(n, gen)
        scores[::7] = scores[0]  # ties: the stable sort decides
        boxes[::11, 2] = boxes[::11, 0]  # zero width
        boxes[1::13] = boxes[1].clone()  # duplicates
        cases.append((boxes, scores, thr))
    matrix = [compat.nms_reference(*c).tolist() for c in cases]
    monkeypatch.setattr(compat, "NMS_MATRIX_MAX", 0)
    stepwise = [compat.nms_reference(*c).tolist() for c in cases]
    assert matrix == stepwise
    assert all(0 < len(k) < len(c[1]) for k, c in zip(matrix[1:], cases[1:], strict=True))  # some kept, some not
    gen = torch.Generator().manual_seed(0)
    for n, thr in [(30, 0.3), (200, 0.7)]:  # the stepwise path against brute force too
        boxes, scores = random_boxes(n, gen)
        assert compat.nms_reference(boxes, scores, thr).tolist() == brute_force_nms(boxes.tolist(), scores.tolist(), thr)


def test_torchvision_ops_nms_works_and_agrees():
    import torchvision

    gen = torch.Generator().manual_seed(1)
    boxes, scores = random_boxes(80, gen)
    got = torchvision.ops.nms(boxes, scores, 0.45).tolist()
    assert got == brute_force_nms(boxes.tolist(), scores.tolist(), 0.45)
    # batched NMS (class offsets) goes through the same op
    idxs = torch.randint(0, 3, (80,), generator=gen)
    assert torchvision.ops.batched_nms(boxes, scores, idxs, 0.45).numel() >= len(got)


def test_empty_input():
    assert compat.nms_reference(torch.zeros(0, 4), torch.zeros(0), 0.5).numel() == 0


def test_offline_switches_set():
    for key in ("YOLO_OFFLINE", "HF_HUB_OFFLINE", "NO_ALBUMENTATIONS_UPDATE", "FLWR_TELEMETRY_ENABLED"):
        assert key in os.environ


def test_medmnistc_motion_blur_runs_with_numpy2():
    import numpy as np
    from PIL import Image

    compat.patch_medmnistc()
    from medmnistc.corruptions.registry import CORRUPTIONS_DS

    img = Image.fromarray((np.random.default_rng(0).random((224, 224, 3)) * 255).astype(np.uint8))
    out = CORRUPTIONS_DS["breastmnist"]["motion_blur"].apply(img, 2)
    assert out.shape == (224, 224, 3) and out.dtype == np.uint8


def test_import_is_light_and_the_hook_fixes_torchvision_in_a_fresh_process():
    import subprocess
    import sys

    code = ("import sys, fedmedbench; assert 'torch' not in sys.modules, 'package import pulled torch'; "
            "import torch, torchvision; from fedmedbench import compat; "
            "b = torch.tensor([[0., 0, 10, 10], [1, 1, 11, 11]]); "
            "print(torchvision.ops.nms(b, torch.tensor([0.9, 0.8]), 0.5).tolist(), compat.TORCHVISION_NMS_FALLBACK)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("[0]")


def test_a_find_spec_probe_does_not_use_up_the_hook():
    """Libraries probe importlib.util.find_spec('torchvision') without importing it (HF datasets does on
    import): the probe imports no torch, and the real import later still gets the fallback."""
    import subprocess
    import sys

    code = ("import importlib.util, sys, fedmedbench; assert importlib.util.find_spec('torchvision'); "
            "importlib.util.find_spec('torchvision'); import datasets; "
            "assert 'torch' not in sys.modules, 'a probe of torchvision imported torch'; import torch, torchvision; "
            "b = torch.tensor([[0., 0, 10, 10], [1, 1, 11, 11]]); "
            "print(torchvision.ops.nms(b, torch.tensor([0.9, 0.8]), 0.5).tolist())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("[0]")


def _http_error(code: int, path: str = "/v1/fleet/push-messages"):
    import httpx

    request = httpx.Request("POST", f"https://127.0.0.1:9093{path}")
    return httpx.HTTPStatusError(f"{code}", request=request, response=httpx.Response(code, request=request))


def test_a_supernode_takes_the_superlinks_500_again_a_bounded_number_of_times(capsys):
    """A SuperLink whose SQLite state was locked past its wait answered 500 and the SuperNode exited; now the
    request is taken again (waits 1, 2, 4, ... s), up to the budget, and other statuses are not retried."""
    import pytest

    calls, waits = [], []

    def flaky(failures: int, code: int = 500):
        def target(request):
            calls.append(request)
            if len(calls) <= failures:
                raise _http_error(code)
            return "pushed"
        return target

    invoke = compat.retrying_server_errors(lambda target, *a, **k: target(*a, **k), tries=3, wait=waits.append)
    assert invoke(flaky(2), "msg") == "pushed" and len(calls) == 3 and waits == [1.0, 2.0]
    assert "the SuperLink answered 500 to /v1/fleet/push-messages; trying again in 1 s (1 of 3)" in capsys.readouterr().err
    calls.clear(), waits.clear()
    with pytest.raises(Exception, match="500"):
        invoke(flaky(10), "msg")
    assert len(calls) == 4 and waits == [1.0, 2.0, 4.0]
    calls.clear(), waits.clear()
    with pytest.raises(Exception, match="401"):
        invoke(flaky(1, code=401), "msg")
    assert len(calls) == 1 and waits == []


def test_the_deployment_patch_lengthens_the_superlinks_lock_wait_and_wraps_the_supernodes_requests(tmp_path):
    """In a fresh process (the patch is for a SuperLink's or SuperNode's process): Flower's SQLite state (the
    SuperLink's --database) waits FLOWER_SQLITE_BUSY_MS for a lock, not 5 s; a SuperNode's requests retry 500s,
    and so do those of the SuperExec the SuperLink starts (through the project's launcher)."""
    import subprocess
    import sys

    probe = ("import sys\nfrom fedmedbench import compat\ncompat.patch_flower_deployment()\ncompat.patch_flower_deployment()\n"
             "from flwr.supercore.object_store.sql_object_store import SqlObjectStore\n"
             "from sqlalchemy import text\n"
             "store = SqlObjectStore(sys.argv[1])\nstore.initialize()\n"
             "with store._engine.connect() as c:\n    print(c.execute(text('PRAGMA busy_timeout')).scalar())\n"
             "from flwr.supernode import fleet_http_connection as f\n"
             "print(f.make_simple_http_retry_invoker().invoke.__qualname__)\n"
             "import importlib\n"
             "r = importlib.import_module('flwr.supercore.superexec.run_superexec')\n"
             "print(r.make_simple_http_retry_invoker().invoke.__qualname__)\n"
             "s = importlib.import_module('flwr.superlink.cli.flower_superlink')\n"
             "print(*s._get_superexec_command(runtime_address='127.0.0.1:9091', runtime_certificates=None,"
             " runtime_root_certificates_path=None, parent_pid=1, runtime_dependency_install=False))\n")
    out = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "superlink.db")], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": str(compat.__file__).rsplit("/fedmedbench/", 1)[0]})
    assert out.returncode == 0, out.stderr[-3000:]
    busy, supernode, superexec, *command = out.stdout.split()
    assert busy == str(compat.FLOWER_SQLITE_BUSY_MS) and supernode == superexec == "retrying_server_errors.<locals>.call"
    # the SuperLink's own SuperExec (it starts the ServerApps, asks the SuperLink for their tasks) starts patched too
    assert command == [sys.executable, "-m", "fedmedbench.deploy", "superexec", "--insecure",
                       "--runtime-api-address", "127.0.0.1:9091", "--parent-pid", "1"], out.stdout


def test_the_launcher_runs_flowers_program_in_its_own_process():
    """``python -m fedmedbench.deploy superlink ARGS`` runs Flower's SuperLink after the patch (it exec'd it)."""
    import subprocess
    import sys

    args = ["superlink", "--ssl-certfile", "s.pem", "--ssl-keyfile", "s.key", "--enable-supernode-auth", "--help"]
    out = subprocess.run([sys.executable, "-m", "fedmedbench.deploy", *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "--database" in out.stdout, out.stderr[-2000:]
    from fedmedbench.deploy import launch

    assert launch.run.__defaults__ == (launch.in_process,)


def _serverapp_grid(answers: list[int]):
    """Flower's ServerApp grid (flwr-serverapp's ``HttpGrid``) over a stand-in SuperLink: the statuses in
    ``answers`` first, then a GetNodes answer naming node 7; returns the grid and the paths requested."""
    import httpx
    from flwr.proto.node_pb2 import NodeInfo
    from flwr.proto.runtime_pb2 import GetNodesResponse
    from flwr.superlink.grid import HttpGrid

    paths: list[str] = []

    def superlink(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        if answers:
            return httpx.Response(answers.pop(0), text="database is locked")
        return httpx.Response(200, content=GetNodesResponse(nodes=[NodeInfo(node_id=7)]).SerializeToString())

    grid = HttpGrid(runtime_api_address="127.0.0.1:9", insecure=True, token="t")
    grid._runtime_client._client = httpx.Client(transport=httpx.MockTransport(superlink))
    return grid, paths


def test_a_serverapps_request_takes_the_superlinks_500_again(capsys):
    """A ServerApp's request answered 500 once (the SuperLink's database locked past its wait) failed the run;
    once its grid is wrapped (``apps.main`` does it first) the request is sent again and succeeds."""
    import httpx
    import pytest

    grid, paths = _serverapp_grid([500])
    with pytest.raises(httpx.HTTPStatusError, match="500"):  # Flower's own invoker: a 500 is fatal
        grid.get_node_ids()
    grid, paths = _serverapp_grid([500])
    waits: list[float] = []
    assert compat.retry_grid_server_errors(grid, wait=waits.append)
    assert compat.retry_grid_server_errors(grid, wait=waits.append)  # once wrapped, not twice
    assert list(grid.get_node_ids()) == [7] and paths == ["/v1/runtime/get-nodes"] * 2 and waits == [1.0]
    assert "the SuperLink answered 500 to /v1/runtime/get-nodes; trying again in 1 s (1 of 5)" in capsys.readouterr().err


def test_a_serverapp_gives_up_on_500_after_the_bound_with_one_line(capsys):
    """500 on every try: FLOWER_SERVER_ERROR_RETRIES more requests, then the error, with one line saying so; on
    Flower's exit path (its invoker set to one try) a 500 is not taken again."""
    import httpx
    import pytest

    tries = compat.FLOWER_SERVER_ERROR_RETRIES
    grid, paths = _serverapp_grid([500] * 50)
    waits: list[float] = []
    compat.retry_grid_server_errors(grid, wait=waits.append)
    with pytest.raises(httpx.HTTPStatusError, match="500"):
        grid.get_node_ids()
    assert len(paths) == tries + 1 and waits == [1.0, 2.0, 4.0, 8.0, 16.0][:tries]
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "giving up" in line] == [
        f"fedmedbench: the SuperLink answered 500 to /v1/runtime/get-nodes {tries + 1} times; giving up"]
    paths.clear(), waits.clear()
    grid._retry_invoker.max_tries = 1  # what flwr-serverapp's exit handler sets before its last request
    with pytest.raises(httpx.HTTPStatusError, match="500"):
        grid.get_node_ids()
    assert len(paths) == 1 and waits == []


def test_the_serverapp_wraps_its_grid_first_and_a_simulations_grid_is_left_alone():
    import pytest
    from flwr.app import Context, RecordDict

    from fedmedbench.deploy import apps

    grid, _ = _serverapp_grid([])
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={"server-spec-file": ""})
    with pytest.raises(ValueError, match="server-spec-file"):  # no spec file: the run stops, after the wrapping
        apps.main(grid, context)
    assert getattr(grid._retry_invoker.invoke, "retries_server_errors", False)
    assert not compat.retry_grid_server_errors(object())


def test_the_launcher_runs_the_superlinks_superexec_as_flower_does():
    """``python -m fedmedbench.deploy superexec ARGS``: Flower's ``flower-superexec`` with ARGS, after the patch."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "fedmedbench.deploy", "superexec", "--help"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0 and "--runtime-api-address" in out.stdout, out.stderr[-2000:]
