"""Make ``src/`` importable for the entry scripts in any environment (venv or conda).

Snakemake puts this folder on ``sys.path`` when it runs a ``script:``; importing this
module adds the package folder beside it, so an environment that has only the
dependencies (e.g. ``--software-deployment-method conda``) still finds fedmedbench.
"""

import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parent.parent / "src")
if SRC not in sys.path:
    sys.path.insert(0, SRC)
