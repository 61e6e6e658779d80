"""What the workflow prints when something is wrong: one line per error, naming the config file and key.

Snakemake prints an exception raised while it reads the workflow with its traceback, and a schema
error with the whole schema and config; a failed job's traceback reaches the console once from the
script and again from its log. Here a config error becomes one line (``config error in FILE at
'KEY': ...``, or ``in --config`` when the command line sets the key; an unknown key lists the allowed
ones) and a job's error one line on the console, its
traceback kept in the job's log. ``FEDMEDBENCH_DEBUG=1`` lets every traceback through as before.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from fedmedbench.config.check import ConfigError, ConfigFileError, load_schema

#: set to 1 to see Python tracebacks instead of the one-line errors
DEBUG_ENV = "FEDMEDBENCH_DEBUG"
#: the config files of the run, joined by os.pathsep (set by the workflow; its jobs inherit it)
CONFIGFILES_ENV = "FEDMEDBENCH_CONFIGFILES"
#: the command line's ``--config`` settings as JSON (set by the workflow; its jobs inherit it)
CONFIG_ARGS_ENV = "FEDMEDBENCH_CONFIG_ARGS"
#: how an error names a key the command line sets
COMMAND_LINE = "--config"
#: a ValueError raised by a module that formats config errors itself
_CONFIG_MESSAGE = re.compile(r"config error at '(?P<key>[^']+)': (?P<detail>.*)", re.S)


def debug() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def config_files() -> list[str]:
    """The run's config files as the workflow announced them (empty when unknown, e.g. on a cluster node)."""
    return [f for f in os.environ.get(CONFIGFILES_ENV, "").split(os.pathsep) if f]


def command_line_config() -> dict:
    """The run's ``--config`` settings as the workflow announced them (empty when none or unknown)."""
    try:
        value = json.loads(os.environ.get(CONFIG_ARGS_ENV) or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def announce(files: Sequence[str | os.PathLike], overrides: Any) -> None:
    """Tell later errors (also the jobs', which inherit the environment) the run's config files and ``--config``."""
    os.environ[CONFIGFILES_ENV] = os.pathsep.join(str(f) for f in files)
    os.environ[CONFIG_ARGS_ENV] = json.dumps(dict(overrides or {}), default=str)


def _depth(node: Any, parts: list[str]) -> int:
    """How many of ``parts`` (a dotted key split at dots) lead through ``node``'s mappings; names may hold dots."""
    depth = 0
    while parts and isinstance(node, dict):
        for n in range(len(parts), 0, -1):  # longest name first: a setting may be called "dir0.5"
            name = ".".join(parts[:n])
            if name in node:
                node, parts, depth = node[name], parts[n:], depth + n
                break
        else:
            break
    return depth


def key_file(key: str, files: Sequence[str | os.PathLike], overrides: dict | None = None) -> str | None:
    """The config file that sets ``key`` (or most of its path), or ``--config`` when the command line's settings
    (``overrides``; default: as announced) do; the later one wins, as in the merge (``--config`` last)."""
    best, best_depth = None, 0
    for f in files:
        try:
            data = yaml.safe_load(Path(f).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            continue
        depth = _depth(data, key.split("."))
        if depth and depth >= best_depth:
            best, best_depth = _shown(f), depth
    depth = _depth(command_line_config() if overrides is None else overrides, key.split("."))
    if depth and depth >= best_depth:
        best = COMMAND_LINE
    return best


def _shown(path: str | os.PathLike) -> str:
    """A path as the user typed it: relative to the working directory when inside it."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def as_config_error(exc: BaseException) -> ConfigError | None:
    """``exc`` as a :class:`ConfigError` when it is one (also a schema error or a 'config error at' message)."""
    if isinstance(exc, ConfigError):
        return exc
    import jsonschema

    if isinstance(exc, jsonschema.ValidationError):
        return schema_error(exc)
    if isinstance(exc, ValueError) and (m := _CONFIG_MESSAGE.fullmatch(str(exc))):
        return ConfigError(m["key"], m["detail"])
    return None


#: how much of a long name a message shows
NAME_SHOWN = 24


def shown_name(name: str) -> str:
    """A name as a message shows it: a long one cut, so the line stays one line."""
    return name if len(name) <= NAME_SHOWN else f"{name[:NAME_SHOWN]}…"


def schema_error(err: Any) -> ConfigError:
    """A jsonschema ``ValidationError`` as the key it concerns and one line (no schema or config dump)."""
    path = [str(p) for p in err.absolute_path]
    if "propertyNames" in err.schema_path and isinstance(err.instance, str):  # a name the schema does not take
        name, key = err.instance, ".".join([*path, shown_name(err.instance)])
        if err.validator == "maxLength":
            return ConfigError(key, f"a name of {len(name):,} characters; at most {err.validator_value} (names "
                               "become folder and file names)")
        if err.validator == "pattern":
            return ConfigError(key, f"{shown_name(name)!r} does not match {err.validator_value!r}")
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        allowed = sorted(err.schema.get("properties") or {})
        patterns = list(err.schema.get("patternProperties") or {})
        unknown = sorted(k for k in err.instance if k not in allowed and not any(re.search(p, k) for p in patterns))
        if unknown:
            where = f" under '{'.'.join(path)}'" if path else ""
            names = ", ".join(repr(k) for k in unknown)
            return ConfigError(".".join([*path, unknown[0]]),
                               f"unknown key{'s' if len(unknown) > 1 else ''} {names}{where}; allowed: {', '.join(allowed)}")
    return ConfigError(".".join(path) or "(top level)", err.message)


def validate_config(config: dict, schema_path: str | os.PathLike) -> None:
    """The schema check, filling in each object's missing keys with their schema defaults (as
    ``snakemake.utils.validate`` does, without reading the schema file again: ``config.check.load_schema``);
    a failure raises the most relevant error as one :class:`ConfigError`."""
    import jsonschema

    schema = load_schema(schema_path)
    try:
        _default_filling(jsonschema.Draft202012Validator)(schema).validate(config)
    except Exception as exc:
        best = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(config))
        if best is None:
            raise
        raise schema_error(best) from exc


def _default_filling(base: Any) -> Any:
    """``base`` whose ``properties`` check first sets each missing property that has a schema default (a copy:
    the schema's own objects never enter the config)."""
    import copy

    import jsonschema

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if isinstance(sub, dict) and "default" in sub:
                    instance.setdefault(name, copy.deepcopy(sub["default"]))
        yield from base.VALIDATORS["properties"](validator, properties, instance, schema)

    return jsonschema.validators.extend(base, {"properties": set_defaults})


def config_error_line(err: ConfigError, files: Sequence[str | os.PathLike]) -> str:
    """``config error in FILE at 'KEY': ...``; without a file that sets the key, the files read are named."""
    where = key_file(err.key, files)
    if where:
        return f"config error in {where} at '{err.key}': {err.detail}"
    read = ", ".join(_shown(f) for f in files) or "no config file"
    return f"config error at '{err.key}' (not set in {read}: a default or --config): {err.detail}"


@contextlib.contextmanager
def exit_on_config_error(files: Sequence[str | os.PathLike]) -> Iterator[None]:
    """Turn a config error raised inside into one line on stderr and exit status 1 (no traceback)."""
    try:
        yield
    except ConfigFileError as exc:
        if debug():
            raise
        print(str(exc), file=sys.stderr)
        raise SystemExit(1) from None
    except Exception as exc:
        err = as_config_error(exc)
        if err is None or debug():
            raise
        print(config_error_line(err, files), file=sys.stderr)
        raise SystemExit(1) from None


def job_error_line(exc: BaseException, log: str | os.PathLike, config_key: str | None = None) -> str:
    """A failed job's one console line: the error's first line, where it was raised when a note says so (a
    method's file:line: ``fl/api/method_errors.py``), the config key and file it concerns, the log."""
    lines = str(exc).strip().splitlines() or [""]
    ours = type(exc).__module__.startswith("fedmedbench.") or isinstance(exc, (ValueError, OSError))
    text = lines[0] if ours else f"{type(exc).__name__}: {lines[0]}"  # a KeyError's message alone says little
    text += "".join(f" [{note}]" for note in getattr(exc, "__notes__", ()) if isinstance(note, str))
    if len(lines) > 1:
        text += f" (+{len(lines) - 1} lines in the log)"
    if config_key:
        where = key_file(config_key, config_files())
        text += f" [config key '{config_key}'{f' in {where}' if where else ''}]"
    if getattr(exc, "no_traceback", False):  # the line says all, and the log is another job's (workflow/runlock.py)
        return f"error: {text}"
    return f"error: {text} (traceback in {log}; {DEBUG_ENV}=1 prints it here)"
