"""Start Flower's SuperLink and SuperNodes only in a secure setting, unless told loudly otherwise.

``flower-superlink --insecure`` (no TLS) or without ``--enable-supernode-auth`` accepts any SuperNode
that can reach it, keyless, and sends it the model; Flower only warns. The project's commands
``python -m fedmedbench.deploy superlink|supernode ARGS`` pass ARGS to Flower's programs unchanged
after checking them: a SuperLink needs TLS and SuperNode authentication, a SuperNode TLS and a key.
``--insecure-for-testing`` lets an insecure setting through (a test on one machine), with a warning
on every start. Flower's program runs in this process, after ``compat.patch_flower_deployment`` (the
SuperLink's SQLite state waits longer for a lock, a SuperNode retries the SuperLink's 500 answers).
``superexec`` is not started by hand: a SuperLink started here starts its SuperExec (which starts the
ServerApp processes) as ``python -m fedmedbench.deploy superexec ARGS``, so that one is patched too.
"""

from __future__ import annotations

import importlib
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

FLAG = "--insecure-for-testing"
PROGRAMS = {"superlink": "flower-superlink", "supernode": "flower-supernode"}
#: what a patched SuperLink starts itself (its arguments are Flower's, passed unchanged)
STARTED_BY_SUPERLINK = {"superexec": "flower-superexec"}
#: Flower's program -> its entry point (module, function), as its console script calls it
ENTRY_POINTS = {"flower-superlink": ("flwr.superlink.cli", "flower_superlink"),
                "flower-supernode": ("flwr.supernode.cli", "flower_supernode"),
                "flower-superexec": ("flwr.supercore.cli", "flower_superexec")}


class InsecureDeploymentError(ValueError):
    """A SuperLink or SuperNode asked to run without TLS or without node authentication."""


def _has(args: Sequence[str], name: str) -> bool:
    return any(a == name or a.startswith(name + "=") for a in args)


def problems(role: str, args: Sequence[str]) -> list[str]:
    """What makes ``flower-<role> ARGS`` insecure (empty: TLS and node authentication are on)."""
    found = []
    if _has(args, "--insecure"):
        found.append("--insecure turns TLS off: models and updates travel in clear text")
    if role == "superlink":
        if not _has(args, "--enable-supernode-auth"):
            found.append("no --enable-supernode-auth: any SuperNode that reaches the port joins, keyless, and "
                         "receives the model")
        if not _has(args, "--insecure") and not (_has(args, "--ssl-certfile") and _has(args, "--ssl-keyfile")):
            found.append("no --ssl-certfile/--ssl-keyfile: the SuperLink has no certificate to serve TLS with")
    elif role == "supernode" and not _has(args, "--auth-supernode-private-key"):
        found.append("no --auth-supernode-private-key: the SuperNode cannot prove which site it is")
    return found


def command(role: str, args: Sequence[str]) -> list[str]:
    """Flower's command line for ``role``; refused (naming every problem) when insecure without :data:`FLAG`."""
    if role not in PROGRAMS:
        raise ValueError(f"unknown role {role!r}: choose {', '.join(PROGRAMS)}")
    testing = FLAG in args
    args = [a for a in args if a != FLAG]
    found = problems(role, args)
    if found and not testing:
        listed = "\n".join(f"  - {p}" for p in found)
        raise InsecureDeploymentError(
            f"refusing to start {PROGRAMS[role]} insecurely:\n{listed}\nUse TLS and SuperNode authentication "
            f"(docs/deployment.md, step 3), or add {FLAG} for a test on a closed machine.")
    return [PROGRAMS[role], *args]


def warning(role: str, args: Sequence[str]) -> str | None:
    """The banner printed when an insecure setting was let through with :data:`FLAG`."""
    found = problems(role, [a for a in args if a != FLAG])
    if not found:
        return None
    line = "!" * 78
    listed = "\n".join(f"!!  {p}" for p in found)
    return f"{line}\n!!  INSECURE {PROGRAMS[role]} ({FLAG}): for tests only, never with patient data\n{listed}\n{line}"


def in_process(program: str, cmd: list[str]) -> None:
    """Flower's program ``cmd`` in this process, as its console script runs it, after the deployment patches."""
    from fedmedbench.compat import patch_flower_deployment

    patch_flower_deployment()
    module, function = ENTRY_POINTS[cmd[0]]
    sys.argv = [program, *cmd[1:]]
    getattr(importlib.import_module(module), function)()


def run_started_by_superlink(role: str, args: Sequence[str],
                             execute: Callable[[str, list[str]], None] = in_process) -> None:
    """Flower's program a patched SuperLink starts (:data:`STARTED_BY_SUPERLINK`), after the patches."""
    program = STARTED_BY_SUPERLINK[role]
    execute(shutil.which(program) or str(Path(sys.executable).parent / program), [program, *args])


def run(role: str, args: Sequence[str], execute: Callable[[str, list[str]], None] = in_process) -> None:
    """Check, warn, then run Flower's program (``execute``: :func:`in_process`)."""
    cmd = command(role, args)
    banner = warning(role, args)
    if banner:
        print(banner, file=sys.stderr, flush=True)
    program = shutil.which(cmd[0]) or str(Path(sys.executable).parent / cmd[0])
    execute(program, cmd)
