"""Shared by the benchmark scripts: print result rows and append them to a JSON-lines file."""

from __future__ import annotations

import json
from pathlib import Path


def emit(rows: list[dict], out: Path | None) -> None:
    for row in rows:
        print(json.dumps(row), flush=True)
    if out:
        with out.open("a") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)
