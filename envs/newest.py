"""envs/requirements.txt with each direct dependency pinned at its newest release, for `make test-latest`.

Left unpinned, pip's resolver may hold a direct dependency back to let an indirect one take its newest release
(snakemake 9.16.3 instead of 9.27.1, for docutils 0.23). Pinned at its newest, each direct dependency is tested
as released; where two newest releases cannot be installed together (medmnistc 0.1.0 needs medmnist==3.0.1, not
3.0.2), the one the other depends on is held back to what that needs, and the script says so on stderr.
Usage: python envs/newest.py [--keep NAME ...] < envs/requirements.txt > newest.txt (--keep: pins kept as written).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable

REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?")
#: "<package> <version> depends on <name>..." in pip's account of a conflict
DEPENDS = re.compile(r"^\s+(\S+) (\S+) depends on ([A-Za-z0-9._-]+)", re.M)
REQUESTED = re.compile(r"^\s+The user requested ([A-Za-z0-9._-]+)", re.M)
TRIES = 10


def canonical(name: str) -> str:
    """A distribution name as pip compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def newest(name: str) -> str:
    """The newest release of ``name`` on the configured package index (pip's own view of it)."""
    out = subprocess.run([sys.executable, "-m", "pip", "index", "versions", name], capture_output=True, text=True)
    found = re.search(rf"^{re.escape(name)} \(([^)]+)\)", out.stdout, re.M | re.I)
    if not found:
        raise SystemExit(f"envs/newest.py: no release of {name} found ({out.stderr.strip()[-300:]})")
    return found.group(1)


def conflict(lines: list[str]) -> str | None:
    """pip's account of why ``lines`` cannot be installed together, or None where they can."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
        f.write("\n".join(lines) + "\n")
        f.flush()
        out = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "-r", f.name],
                             capture_output=True, text=True)
    return None if out.returncode == 0 else out.stdout + out.stderr


def held_back(report: str, pinned: set[str]) -> dict[str, str]:
    """The pins to loosen after a conflict: each pinned package another depends on (why), else every pin pip named."""
    needed = {canonical(dep): f"{pkg} {ver} depends on it" for pkg, ver, dep in DEPENDS.findall(report)
              if canonical(dep) in pinned}
    return needed or {canonical(n): "in the conflict" for n in REQUESTED.findall(report) if canonical(n) in pinned}


def at_newest(requirements: list[str], keep: set[str],
              release: Callable[[str], str]) -> tuple[dict[str, str], dict[str, str]]:
    """Each requirement line pinned at ``release(name)`` (``keep``: as written), by canonical name; and each
    unpinned form (name and extras), for a pin that has to be held back."""
    lines: dict[str, str] = {}
    bare: dict[str, str] = {}
    for line in requirements:
        text = line.split("#", 1)[0].strip()
        m = REQUIREMENT.match(text)
        if m:
            name, extras = m.group(1), m.group(2) or ""
            lines[canonical(name)] = text if canonical(name) in keep else f"{name}{extras}=={release(name)}"
            bare[canonical(name)] = f"{name}{extras}"
    return lines, bare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", nargs="*", default=[], help="names whose pins stay as written")
    keep = {canonical(k) for k in parser.parse_args().keep}
    lines, bare = at_newest(sys.stdin.readlines(), keep, newest)
    for _ in range(TRIES):
        report = conflict(list(lines.values()))
        if report is None:
            break
        loosen = held_back(report, {n for n, v in lines.items() if "==" in v and n not in keep})
        if not loosen:
            raise SystemExit(f"envs/newest.py: the newest releases cannot be installed together:\n{report[-2000:]}")
        for name, why in loosen.items():
            print(f"envs/newest.py: {lines[name]} held back ({why})", file=sys.stderr)
            lines[name] = bare[name]
    else:
        raise SystemExit(f"envs/newest.py: still in conflict after {TRIES} pins held back")
    print("\n".join(lines.values()))


if __name__ == "__main__":
    main()
