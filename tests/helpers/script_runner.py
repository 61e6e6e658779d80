"""Many short runs of the project's scripts, each a fork of one interpreter that imported torch once.

``python script.py ARGS`` costs seconds before the script's first line (torch's import alone), and a test file
that checks a script's one-line refusals runs it dozens of times. :class:`ScriptRunner` starts one interpreter
that imports the third-party libraries that cost most (torch, numpy, pandas, yaml) and nothing of the project,
then runs each script in a fresh child process forked from it: the child gets the script's ``sys.argv``,
``sys.path`` (the script's folder, then the request's ``PYTHONPATH``), environment, working directory and standard
streams as ``python script.py`` would, and exits as the interpreter would (``SystemExit``'s message on stderr, an
uncaught exception's traceback, atexit handlers). Whatever the interpreter itself prints goes to its stderr. The project's modules (``fedmedbench.compat`` sets environment switches at import) are imported by the
script itself, in the child, as in a process of its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

#: the server: reads one JSON request a line, forks a child per request, answers one JSON line
_SERVER = r"""
import atexit, json, os, runpy, shutil, signal, sys, tempfile, time, traceback

# the requests and answers keep their own copies of stdin and stdout: whatever this interpreter prints goes to stderr
proto_in, proto_out = os.fdopen(os.dup(0), "r"), os.fdopen(os.dup(1), "w")
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
os.dup2(2, 1)
import numpy, pandas, torch, yaml  # noqa: E401,F401  (shared by every child; nothing of the project is imported here)

#: the sys.path entries after the script's folder that this interpreter's PYTHONPATH put there
_own = len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
_site = sys.path[1 + _own:]


def child(req, out_path, err_path):
    os.setsid()
    for fd, path in ((1, out_path), (2, err_path)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(f, fd)
        os.close(f)
    os.environ.clear()
    os.environ.update(req["env"])
    os.chdir(req["cwd"])
    script = req["argv"][0]
    sys.argv = list(req["argv"])
    paths = [os.path.dirname(os.path.abspath(script)),
             *(os.path.abspath(p) for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p), *_site]
    sys.path[:] = list(dict.fromkeys(paths))  # as site.py leaves it: each folder once
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException as exc:
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != script:  # from the script's frame on, as python shows it
            tb = tb.tb_next
        traceback.print_exception(type(exc), exc, tb or exc.__traceback__)
        code = 1
    try:
        import threading

        threading._shutdown()  # as the interpreter does at exit: wait for the script's non-daemon threads
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code & 0xFF)


tmp = tempfile.mkdtemp(prefix="fmb-script-")  # no TemporaryDirectory: its finalizer would run in every child
out_path, err_path = os.path.join(tmp, "out"), os.path.join(tmp, "err")
for line in proto_in:
    req = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            child(req, out_path, err_path)
        finally:
            os._exit(70)  # never back into this loop
    deadline = time.monotonic() + req["timeout"]
    status = None
    while status is None:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
        elif time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            status = -1
        else:
            time.sleep(0.01)
    rc = "timeout" if status == -1 else os.waitstatus_to_exitcode(status)
    with open(out_path, errors="replace") as o, open(err_path, errors="replace") as e:
        answer = {"rc": rc, "stdout": o.read(), "stderr": e.read()}
    proto_out.write(json.dumps(answer) + "\n")
    proto_out.flush()
shutil.rmtree(tmp, ignore_errors=True)
"""


class ScriptRunner:
    """``run(script, *args)`` as ``subprocess.run([sys.executable, script, *args], capture_output=True, text=True)``
    would (a ``CompletedProcess``; ``subprocess.TimeoutExpired`` past ``timeout``), from one warm interpreter."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)

    def run(self, script: str | Path, *args: str, env: dict[str, str], cwd: str | Path | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess:
        argv = [str(script), *map(str, args)]
        request = {"argv": argv, "env": dict(env), "cwd": str(cwd or Path.cwd()), "timeout": timeout}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the script runner exited (status {self.proc.wait()})")
        answer = json.loads(line)
        cmd = [sys.executable, *argv]
        if answer["rc"] == "timeout":
            raise subprocess.TimeoutExpired(cmd, timeout, answer["stdout"], answer["stderr"])
        return subprocess.CompletedProcess(cmd, answer["rc"], answer["stdout"], answer["stderr"])

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
