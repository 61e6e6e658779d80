"""Shared by the benchmark scripts: print result rows and append them to a JSON-lines file, and
name the source tree's commit they measured."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path


def emit(rows: list[dict], out: Path | None) -> None:
    for row in rows:
        print(json.dumps(row), flush=True)
    if out:
        append_lines(out, [json.dumps(r) for r in rows])


def append_lines(path: Path, lines: list[str]) -> None:
    """Add ``lines`` to the end of ``path`` through a temp file and a rename: a run stopped while writing leaves the
    file as it was, never a half line that would break every later read of it."""
    from fedmedbench.workflow import io

    path = Path(path)
    if path.is_dir():  # emit has printed the rows: say where they did not go, not a traceback
        raise SystemExit(f"{path}: a folder, not a JSON-lines file (the rows are printed above)")
    before = path.read_text() if path.exists() else ""
    if before and not before.endswith("\n"):
        before += "\n"
    io.write_text(path, before + "".join(line + "\n" for line in lines))


def git_head() -> str:
    """The commit of the fedmedbench source tree in use (``?`` outside a git checkout or where git is
    not installed, unless ``FMB_TREE`` names it): a bench run with ``PYTHONPATH=<other tree>/src`` names that
    tree's commit. Called once a bench has measured: it never stops the run, whatever ``FMB_TREE`` holds."""
    import fedmedbench

    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=Path(fedmedbench.__file__).parent,
                             capture_output=True, text=True)
    except OSError:
        return given_tree(strict=False)["commit"]
    return out.stdout.strip() or given_tree(strict=False)["commit"]


#: a tree copied without its .git (rsync to a cluster, a GPU machine lent a copy): the sender's word for its commit,
#: "COMMIT" or "COMMIT:clean" (they checked that no tracked file differed); used only where git cannot read the tree
TREE_ENV = "FMB_TREE"
TREE_FORMAT = re.compile(r"([0-9a-fA-F]{4,40})(:clean)?")


def given_tree(strict: bool = True) -> dict:
    """The tree ``FMB_TREE`` names (commit ``?`` and cleanliness unknown without it); rows record ``tree_given``.
    A value not of the form COMMIT[:clean] stops the run in one line (``strict``; the benches check it before they
    time anything), else it names no commit."""
    unknown = {"commit": "?", "tree_clean": None, "changed": []}
    value = os.environ.get(TREE_ENV, "").strip()
    if not value:
        return unknown
    found = TREE_FORMAT.fullmatch(value)
    if not found:
        if strict:
            raise SystemExit(f"{TREE_ENV}={value}: give COMMIT or COMMIT:clean (COMMIT: 4-40 hex digits)")
        return unknown
    return {"commit": found[1], "tree_clean": True if found[2] else None, "changed": [], "tree_given": True}


def tree_state(root: Path | None = None) -> dict:
    """The source tree a row measured (``root``; default: the checkout of the fedmedbench in use): its commit (short
    hash, ``?`` without git) and whether its tracked files differ from that commit (``tree_clean``: None where git
    cannot say; a copy without .git: ``FMB_TREE``, :func:`given_tree`). Result records (``*.jsonl``) do not count:
    a session appends its rows to them as it goes."""
    if root is None:
        import fedmedbench

        root = Path(fedmedbench.__file__).parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "."],
                                cwd=root, capture_output=True, text=True)
    except OSError:
        return given_tree()
    if head.returncode or status.returncode:
        return {"commit": head.stdout.strip(), "tree_clean": None, "changed": []} if head.stdout.strip() else given_tree()
    changed = [line[3:] for line in status.stdout.splitlines() if not line.rstrip().endswith(".jsonl")]
    return {"commit": head.stdout.strip(), "tree_clean": not changed, "changed": changed}
