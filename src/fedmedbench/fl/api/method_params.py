"""Per-run method parameters: the study's, overridden by the setting's, with setting-dependent defaults;
and the planning-time check of every method name and ``method_params`` entry against the methods'
own declarations (``Method.params``), built-in or the user's (config ``methods``).

Kept free of torch so the workflow can resolve and check parameters while it is being planned: the
declarations are read from the method files' source (:mod:`fedmedbench.fl.api.method_source`).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from fedmedbench.config.check import config_error, load_schema
from fedmedbench.fl.api.method_source import MethodSource, builtin_sources, entry_point_sources, registered_in
from fedmedbench.fl.api.params import json_schema, problems

#: a value meaning "the setting's Dirichlet alpha" (GPAF's server samples labels from Dir(alpha) with
#: the alpha of the setting it runs in: the paper's Table 1 has one column per alpha)
PARTITION = "partition"


def resolve(method: str, study_params: dict[str, dict], setting: dict[str, Any]) -> dict[str, Any]:
    """``method_params[method]`` of the study, then of the setting; ``label_alpha: partition`` resolved.

    A setting without an alpha (e.g. the center split) gives 1.0, a flat Dirichlet.
    """
    params = {**study_params.get(method, {}), **(setting.get("method_params") or {}).get(method, {})}
    if method == "gpaf" and params.get("label_alpha", PARTITION) == PARTITION:
        params["label_alpha"] = float((setting.get("params") or {}).get("alpha", 1.0))
    return params


def sources(config: dict[str, Any]) -> dict[str, MethodSource]:
    """Every method a config may name: built-in, installed (entry points) and the config's own ``methods``
    (name -> file, relative to the working directory). A user file must exist and register its name, and
    no user method may take a built-in's name (the error names both); a file that does not parse or whose
    ``params`` is not a tuple of literal ``Param(...)`` fails naming its key."""
    known = {**builtin_sources(), **entry_point_sources()}
    for name, path in (config.get("methods") or {}).items():
        key = f"methods.{name}"
        if not isinstance(path, str) or not Path(path).is_file():
            config_error(key, f"{path!r} is not a file (a Python file that registers method '{name}')")
        if name in known:
            config_error(key, f"method '{name}' of {path} is already registered by {known[name].path} "
                         f"(class {known[name].class_name}); give yours another name")
        try:  # read now, so a file that does not parse or declares a bad Param fails here, naming the key
            found = registered_in(path)
            if name in found:
                found[name].params()
        except (SyntaxError, ValueError, TypeError) as err:
            config_error(key, f"{path} cannot be read for method '{name}': {err}")
        if name not in found:
            config_error(key, f"{path} registers no method '{name}' (a class decorated with @register_method({name!r}); "
                         f"it registers {sorted(found) or 'none'})")
        known[name] = found[name]
    return known


def run_fields(method: str, known: dict[str, MethodSource], config: dict[str, Any]) -> dict[str, Any]:
    """A run's fields naming its method's file: none for built-in and installed methods (their hashes stay
    as they were); the file and its content hash for a config's own method, so an edit reruns its jobs."""
    if method not in (config.get("methods") or {}):
        return {}
    src = known[method]
    return {"method_file": str(src.path), "method_sha256": src.sha256()}


def check(config: dict[str, Any], known: dict[str, MethodSource]) -> None:
    """Every study's method names and ``method_params`` entries against the methods' declarations; the
    first problem fails naming its key (e.g. ``studies.s.method_params.gpaf.lamda_adv``)."""
    for sname, study in (config.get("studies") or {}).items():
        if not isinstance(study, dict):
            continue
        key = f"studies.{sname}"
        for name in study.get("methods") or []:
            if name not in known:
                config_error(f"{key}.methods", f"unknown method '{name}'; registered: {', '.join(sorted(known))} "
                             "(your own: the config's methods mapping)")
        _check_blocks(f"{key}.method_params", study.get("method_params"), known)
        for setname, setting in (study.get("settings") or {}).items():
            if isinstance(setting, dict):
                _check_blocks(f"{key}.settings.{setname}.method_params", setting.get("method_params"), known)
    fedst = config.get("fedst") or {}
    if isinstance(fedst, dict):
        _check_blocks("fedst.method_params", fedst.get("method_params"), known)


def _check_blocks(key: str, blocks: Any, known: dict[str, MethodSource]) -> None:
    if not isinstance(blocks, dict):
        return  # absent, or a shape the schema reports
    for method, given in blocks.items():
        if method not in known:
            config_error(f"{key}.{method}", f"unknown method '{method}'; registered: {', '.join(sorted(known))}")
        if isinstance(given, dict):
            for path, message in problems(method, known[method].params(), given, f"{key}.{method}"):
                config_error(path, message)


def method_params_schema(names: list[str], known: dict[str, MethodSource]) -> dict[str, Any]:
    """The schema's ``method_params`` properties of ``names``, made from their declarations."""
    return {name: json_schema(known[name].params()) for name in names}


def schema_for(config: dict[str, Any], schema_path: str | Path, known: dict[str, MethodSource], out_dir: str | Path) -> str:
    """The schema a config is validated with: ``schema_path`` itself, or (when the config brings its own
    methods) a copy in ``out_dir`` whose method names and ``method_params`` blocks include them."""
    own = sorted(config.get("methods") or {})
    if not own:
        return str(schema_path)
    from fedmedbench.workflow import io

    schema = copy.deepcopy(load_schema(schema_path))
    defs = schema["definitions"]
    defs["method_name"]["enum"] = [*defs["method_name"]["enum"], *own]
    defs["study"]["properties"]["method_params"]["properties"].update(method_params_schema(own, known))
    out = Path(out_dir) / "schema.yaml"
    io.write_text(out, yaml.safe_dump(schema, sort_keys=False))
    return str(out.resolve())
