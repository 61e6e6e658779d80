"""A run's deployment bundle: one folder per site and the server's spec, written all or nothing.

``<out>/site-XX/`` go to the sites (each gets only its own); ``<out>/server/spec.json`` is the
run spec the ServerApp reads (``server-spec-file``); its ``run_dir`` is where the server
writes checkpoints and results, and is made absolute so the ServerApp finds it from any
working directory.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from fedmedbench.deploy.site_data import PATH_FIELDS, export_sites, get_field, set_field
from fedmedbench.fl.spec import RunSpec
from fedmedbench.workflow import io


def server_spec(spec: RunSpec) -> dict:
    """The spec the ServerApp reads: every file it names made absolute, outputs under ``<run_dir>/deployed``."""
    d = spec.to_dict()
    for field in PATH_FIELDS:
        value = get_field(d, field)
        if isinstance(value, dict):
            set_field(d, field, {k: str(Path(v).resolve()) for k, v in value.items()})
        elif value:
            set_field(d, field, str(Path(value).resolve()))
    d["run_dir"] = str(Path(spec.run_dir).resolve() / "deployed")
    return d


def export_run(spec: RunSpec, out: str | Path) -> list[Path]:
    """Write the bundle for ``spec`` at ``out`` (replacing nothing: ``out`` must not exist)."""
    out = Path(out)
    if out.exists():
        raise FileExistsError(f"{out}: already exists; remove it to export again")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        describe = {"study": spec.study, "dataset": spec.dataset, "setting": spec.setting, "seed": spec.seed,
                    "data_origin": spec.data_origin, "image_size": spec.image_size}
        sites = export_sites(spec, tmp, describe)
        io.write_json(tmp / "server" / "spec.json", server_spec(spec))
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return [out / s.name for s in sites] + [out / "server" / "spec.json"]
