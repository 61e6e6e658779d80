"""A real Flower deployment on 127.0.0.1: SuperLink (TLS, SuperNode authentication) + SuperNodes.

SuperLink and SuperNodes start as a site would start them (``python -m fedmedbench.deploy
superlink|supernode``, docs/deployment.md). Every process is started in its own session and killed by
PID at the end. Ports are picked free on the loopback interface; nothing else is contacted.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from fedmedbench.deploy import credentials
from fedmedbench.fl.spec import RunSpec
from fedmedbench.workflow import io

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
#: the project's launcher of Flower's SuperLink and SuperNode
DEPLOY = [sys.executable, "-m", "fedmedbench.deploy"]


def app_folder(dest: Path) -> Path:
    """The Flower App as ``flwr run`` packs it from a checkout (``pyproject.toml`` and the package), without the rest.

    ``flwr run <folder>`` walks every file under the folder before it filters them (Flower's ``collect_files``):
    from a checkout with its ``.venv`` that is some 60,000 files and 13 s of one core per run, for an app whose
    code the sites import from the installed package anyway."""
    dest.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, dest / name)
    shutil.copytree(REPO / "src" / "fedmedbench", dest / "src" / "fedmedbench",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Federation:
    """SuperLink + SuperNodes on 127.0.0.1 with TLS and SuperNode authentication."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: list[subprocess.Popen] = []
        self.env = {**os.environ, "FLWR_HOME": str(root / "flwr"), "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
                    "PYTHONUNBUFFERED": "1"}
        src = str(REPO / "src")
        self.env["PYTHONPATH"] = os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        self.tls = credentials.make_tls(root / "certs", ["127.0.0.1", "localhost"])
        self.port = free_port()
        self.app = app_folder(root / "app")
        (root / "flwr").mkdir(parents=True)
        (root / "flwr" / "config.toml").write_text(
            f'[superlink]\ndefault = "hospitals"\n\n[superlink.hospitals]\naddress = "127.0.0.1:{self.port}"\n'
            f'root-certificates = "{self.tls.ca_cert}"\n')

    def start(self, name: str, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log = (self.root / f"{name}.log").open("w")
        proc = subprocess.Popen(args, env={**self.env, **(env or {})}, cwd=self.root, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def superlink(self) -> None:
        self.start("superlink", [*DEPLOY, "superlink", "--ssl-ca-certfile", str(self.tls.ca_cert),
                                 "--ssl-certfile", str(self.tls.server_cert), "--ssl-keyfile", str(self.tls.server_key),
                                 "--enable-supernode-auth", "--disable-runtime-dependency-installation",
                                 "--host", "127.0.0.1", "--port", str(self.port),
                                 "--database", str(self.root / "superlink.db")])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"SuperLink did not start: {(self.root / 'superlink.log').read_text()[-2000:]}")

    def flwr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "flwr"), *args], env=self.env, cwd=self.root, capture_output=True, text=True,
                              timeout=timeout)

    def run_status(self, run_output: str) -> tuple[str, str]:
        """The status and status details of the run that ``flwr run`` output names ("?" when it names none)."""
        found = re.search(r"Successfully started run (\d+)", run_output)
        if not found:
            return "?", "no run was started"
        listed = self.flwr("ls", "hospitals", "--run-id", found.group(1), "--format", "json")
        try:
            row = json.loads(listed.stdout)["runs"][0]
        except (ValueError, KeyError, IndexError):
            return "?", listed.stdout[-500:] + listed.stderr[-500:]
        return str(row.get("status", "?")), str(row.get("status-details", ""))

    def log_tails(self, chars: int = 1500) -> str:
        """The last ``chars`` of every process log under the federation's root."""
        return "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-chars:]}"
                         for log in sorted(self.root.glob("*.log")))

    def register(self, name: str) -> Path:
        private, public = credentials.make_node_key(self.root / "keys", name)
        out = self.flwr("supernode", "register", str(public), "hospitals")
        assert "registered successfully" in out.stdout, out.stdout + out.stderr
        return private

    def supernode(self, name: str, key: Path, node_config: str, *extra: str,
                  env: dict[str, str] | None = None) -> subprocess.Popen:
        return self.start(name, [*DEPLOY, "supernode", "--root-certificates", str(self.tls.ca_cert),
                                 "--superlink", f"127.0.0.1:{self.port}", "--auth-supernode-private-key", str(key),
                                 "--node-config", node_config, "--port", str(free_port()), *extra], env)

    def hostile_env(self, mode_file: Path) -> dict[str, str]:
        """The environment of a SuperNode whose site edits its replies as ``mode_file`` says (helpers/hostile_site)."""
        here = Path(__file__).resolve().parent / "hostile_site"
        return {"PYTHONPATH": os.pathsep.join([str(here), self.env["PYTHONPATH"]]),
                "FEDMEDBENCH_TEST_HOSTILE": str(mode_file)}

    def rejoin(self, name: str, key: Path, node_config: str, within_s: float = 240) -> subprocess.Popen:
        """Restart a site whose SuperNode died: the SuperLink refuses its key until two heartbeats
        (about a minute) have passed without one, so retry until the node is activated."""
        deadline = time.monotonic() + within_s
        attempt = 0
        while time.monotonic() < deadline:
            attempt += 1
            proc = self.supernode(f"{name}-{attempt}", key, node_config)
            log = self.root / f"{name}-{attempt}.log"
            while proc.poll() is None and "SuperNode ID" not in log.read_text() and time.monotonic() < deadline:
                time.sleep(0.5)
            if proc.poll() is None:
                return proc
            time.sleep(5)
        raise RuntimeError(f"{name} was not re-activated within {within_s:.0f}s")

    def stop(self) -> None:
        ours = {str(proc.pid) for proc in self.procs}
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        for pid in _detached_children(ours):  # Flower's SuperExec runs in a session of its own
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _detached_children(parents: set[str]) -> list[int]:
    """Processes started with ``--parent-pid <one of ours>`` (they outlive a killed process group)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        for i, arg in enumerate(args[:-1]):
            if arg == b"--parent-pid" and args[i + 1].decode(errors="replace") in parents:
                found.append(int(entry.name))
    return found


def same_model(a_dir: str | Path, b_dir: str | Path) -> None:
    """The ``model.pt`` of two run folders hold the same arrays, bit for bit."""
    import torch

    a = torch.load(f"{a_dir}/model.pt", weights_only=True)
    b = torch.load(f"{b_dir}/model.pt", weights_only=True)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def kept_state(run_dir: str | Path, pid: int) -> dict:
    """A client's persistent state after the run (its own model or personal parameters)."""
    from fedmedbench.fl.state import checkpoint
    from fedmedbench.fl.state.client_state import ClientStateStore

    return ClientStateStore(checkpoint.checkpoint_dir(run_dir) / "clients").load(pid, before_round=10**6)


def run_deployed(fl: Federation, spec: RunSpec, name: str, timeout_s: int,
                 attempts: int = 2) -> tuple[RunSpec, subprocess.CompletedProcess]:
    """``flwr run`` of ``spec`` (its server copy under ``fl.root/name``); returns that spec and the command's output.

    A run that Flower itself ended (its ServerApp missed the SuperLink's heartbeat window on a
    loaded machine, say) is started again, once: the server resumes from its checkpoint, as a site
    operator would do. A run whose ServerApp raised is not retried. The returned output carries the
    run's final status and the tails of the SuperLink and SuperNode logs, so a failure explains itself.
    """
    server_spec = RunSpec.from_dict({**spec.to_dict(), "run_dir": str(fl.root / name)})
    io.write_json(fl.root / f"{name}.json", server_spec.to_dict())
    for attempt in range(1, attempts + 1):
        out = fl.flwr("run", str(fl.app), "hospitals", "--stream", "--run-config",
                      f"server-spec-file='{fl.root / f'{name}.json'}' round-timeout-s={timeout_s}",
                      timeout=max(600, 3 * timeout_s))
        status, details = fl.run_status(out.stdout)
        done = (Path(server_spec.run_dir) / "model.pt").is_file()
        if done or "ServerApp failed with exception" in details or attempt == attempts:
            break
    report = f"\n--- run status (attempt {attempt}): {status} {details}\n{fl.log_tails()}"
    return server_spec, subprocess.CompletedProcess(out.args, out.returncode, out.stdout + report, out.stderr)
