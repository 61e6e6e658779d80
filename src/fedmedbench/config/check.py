"""Strict reading of config files, before the schema check.

Snakemake reads config files with YAML 1.1 rules and a permissive loader: a
duplicate key silently keeps the last value, ``lr: 5e-2`` becomes the string
"5e-2", and a syntax error is reported without file or line. The workflow re-reads
every config file it was given with :func:`check_file` (duplicates rejected,
errors as ``file:line:column``, merge keys ``<<: *anchor`` accepted), refuses a file whose
aliases expand past :data:`MAX_EXPANDED_NODES` ("billion laughs": every later walk of the
config, such as the schema check's error message, would take the expanded size in time and
memory), and :func:`coerce_numbers` turns numeric strings such as "5e-2" into numbers where the
schema asks for a number. :func:`refuse_non_finite` refuses ``.nan`` and ``.inf``, which pass
every range check of the schema (a comparison with NaN is false).
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

#: YAML 1.2 floats: PyYAML (YAML 1.1) needs a dot, so 5e-2 or 1E3 would stay strings
FLOAT_RE = re.compile(r"^[-+]?(?:\d[\d_]*)?(?:\.\d*)?[eE][-+]?\d+$")


#: the longest key YAML reads without a '?' (a "simple key": PyYAML's limit)
YAML_KEY_LIMIT = 1024
#: Snakemake refuses a wildcard value that ends in a piece repeated this many times (PeriodicWildcardError)
PERIODIC_REPEATS = 20

#: the most nodes (mappings, lists, scalars) a config file may hold once its aliases are expanded (the
#: largest config of the project, config/config.yaml, holds about 1,000)
MAX_EXPANDED_NODES = 200_000
MERGE_TAG = "tag:yaml.org,2002:merge"


class ConfigFileError(ValueError):
    """A config file that does not parse, or has a duplicate key (the message names file and line)."""


class ConfigError(ValueError):
    """A bad config value; ``key`` is its dotted path (the workflow prints it with the file that sets it)."""

    def __init__(self, key: str, detail: str) -> None:
        super().__init__(f"config error at '{key}': {detail}")
        self.key, self.detail = key, detail


def config_error(key: str, message: str) -> None:
    """Raise the workflow's one error for a bad config value: it names the key."""
    raise ConfigError(key, message)


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys and reads YAML 1.2 exponent floats.

    A key written twice in one mapping is an error; a key a merge (``<<: *anchor``) brings in may be
    overridden by the mapping's own, as YAML's merge keys define.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                first = seen[key]
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first defined at line {first.line + 1})", key_node.start_mark)
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", FLOAT_RE, list("-+0123456789."))


def expanded_size(node: yaml.Node, limit: int) -> int:
    """Nodes in ``node`` with every alias expanded, counted up to just past ``limit`` (each distinct node
    is visited once: the count of an aliased node is reused, so a nested alias bomb costs its text size)."""
    sizes: dict[int, int] = {}

    def size(n: yaml.Node) -> int:
        if id(n) in sizes:
            return sizes[id(n)]
        sizes[id(n)] = 1  # a node that (through an alias) contains itself counts once
        total = 1
        if isinstance(n, yaml.SequenceNode):
            children = n.value
        elif isinstance(n, yaml.MappingNode):
            children = [c for pair in n.value for c in pair]
        else:
            children = []
        for child in children:
            total += size(child)
            if total > limit:
                break
        sizes[id(n)] = min(total, limit + 1)
        return sizes[id(n)]

    return size(node)


def _load_bounded(text: str, path: Path) -> Any:
    """Compose the document, refuse it when its aliases expand past :data:`MAX_EXPANDED_NODES`, then build it."""
    loader = StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if expanded_size(node, MAX_EXPANDED_NODES) > MAX_EXPANDED_NODES:
            raise ConfigFileError(f"{path}: its anchors and aliases (&name, *name) expand to more than "
                                  f"{MAX_EXPANDED_NODES:,} values; a config of this workflow holds a few thousand at "
                                  "most (refused: expanding it would take the memory and time of its expanded size)")
        return loader.construct_document(node)
    finally:
        loader.dispose()


def target_hint(path: Path) -> str:
    """Snakemake's ``--configfile`` takes every following word: a target written after it is read as a config."""
    if path.suffix in (".yaml", ".yml"):
        return ""
    return (f"; if '{path}' is a target, put targets before --configfile (snakemake {path} --configfile FILE) "
            f"or end the config files with -- (snakemake --configfile FILE -- {path}): --configfile reads every "
            "following word as a config file")


def check_file(path: str | Path, hint: Callable[[Path], str] = target_hint) -> Any:
    """Parse ``path`` strictly; a problem raises :class:`ConfigFileError` as ``path:line:column: problem``
    (``hint``: what a file that is no config may be, e.g. a target written where config files go)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot read the config file ({exc.strerror}){hint(path)}") from None
    except UnicodeDecodeError as exc:  # a binary file: a figure or a model written after --configfile
        raise ConfigFileError(f"{path}: not a text file (byte {exc.start} is not UTF-8){hint(path)}") from None
    if path.suffix == ".json":  # JSON has no duplicate-key or float ambiguity worth a second parser here
        try:
            data = json.loads(text)
        except ValueError:  # not JSON: Snakemake then reads it as YAML and says what it finds
            return None
        except RecursionError:
            raise ConfigFileError(_too_deep(path)) from None
        _check_top_level(data, path, hint)
        return None
    try:
        data = _load_bounded(text, path)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        if (key := _long_key(text, exc)) is not None:
            raise ConfigFileError(f"{where}: a key of {len(key):,} characters ('{key[:24]}…'): YAML reads keys of at most "
                                  f"{YAML_KEY_LIMIT:,} characters, and a study or setting name is at most 64") from None
        raise ConfigFileError(f"{where}: {exc.problem or exc.context}{hint(path)}").with_traceback(None) from None
    except yaml.YAMLError as exc:
        raise ConfigFileError(f"{path}: not valid YAML ({exc}){hint(path)}") from None
    except RecursionError:
        raise ConfigFileError(_too_deep(path)) from None
    _check_top_level(data, path, hint)
    return data


def _long_key(text: str, exc: yaml.MarkedYAMLError) -> str | None:
    """The key past YAML's length limit on a line the error points at (PyYAML's message does not say so)."""
    lines = text.splitlines()
    for mark in (exc.context_mark, exc.problem_mark):
        if mark is not None and mark.line < len(lines) and ":" in lines[mark.line]:
            key = lines[mark.line].split(":", 1)[0].strip().lstrip("?-").strip().strip("'\"")
            if len(key) > YAML_KEY_LIMIT:
                return key
    return None


def periodic_name(name: str) -> str | None:
    """The piece ``name`` ends in, repeated :data:`PERIODIC_REPEATS` times or more: Snakemake takes such a wildcard
    value for a rule applied to its own output and stops planning (``PeriodicWildcardError``). None otherwise."""
    from snakemake.io import PeriodicityDetector

    return PeriodicityDetector(min_repeat=PERIODIC_REPEATS).is_periodic(name)


def _too_deep(path: Path) -> str:
    return f"{path}: its lists or mappings nest too deeply to read (a config of this workflow nests a few levels)"


def _check_top_level(data: Any, path: Path, hint: Callable[[Path], str] = target_hint) -> None:
    """Snakemake merges a config file's top-level mapping; anything else is refused naming the file."""
    if data is not None and not isinstance(data, dict):
        raise ConfigFileError(f"{path}: a config file holds settings (key: value) at its top level, "
                              f"not a {type(data).__name__}{hint(path)}")


def check_files(paths: Iterable[str | Path]) -> None:
    for p in paths:
        check_file(p)


@functools.lru_cache(maxsize=8)
def _schema(path: Path, mtime_ns: int, size: int) -> dict:
    return yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def load_schema(schema_path: str | Path) -> dict:
    """The schema file (config/schema.yaml, or a config's copy with its own methods), read once a process.

    Every workflow start reads it for :func:`coerce_numbers` and the schema check: PyYAML's own reader takes
    ~0.7 s for the project's schema, libyaml's (used where PyYAML has it) ~0.1 s, to the same mapping. Callers
    do not change the mapping they get.
    """
    path = Path(schema_path).resolve()
    stat = path.stat()
    return _schema(path, stat.st_mtime_ns, stat.st_size)


def coerce_numbers(config: dict, schema_path: str | Path) -> list[str]:
    """Replace numeric strings (YAML 1.1 reads ``5e-2`` as text) by floats where the schema wants a number.

    Returns the dotted keys that were converted. Anything else is left for the schema check to report.
    """
    import jsonschema

    schema = load_schema(schema_path)
    validator = jsonschema.validators.validator_for(schema)(schema)
    done: list[str] = []

    def visit(errors) -> None:
        for err in errors:
            if err.context:
                visit(err.context)
            wanted = err.validator_value if isinstance(err.validator_value, list) else [err.validator_value]
            if (err.validator == "type" and "number" in wanted and isinstance(err.instance, str)
                    and FLOAT_RE.match(err.instance.strip())):
                path = list(err.absolute_path)
                node = config
                for key in path[:-1]:
                    node = node[key]
                if isinstance(node[path[-1]], str):
                    node[path[-1]] = float(err.instance.strip().replace("_", ""))
                    done.append(".".join(str(k) for k in path))

    visit(validator.iter_errors(config))
    return done


def non_finite_keys(node: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose value is a NaN or infinite number (YAML's ``.nan``, ``.inf``, or ``1e999``)."""
    if isinstance(node, float):
        return [] if math.isfinite(node) else [prefix]
    if isinstance(node, dict):
        return [k for key, value in node.items() for k in non_finite_keys(value, f"{prefix}.{key}" if prefix else str(key))]
    if isinstance(node, list):
        return [k for i, value in enumerate(node) for k in non_finite_keys(value, f"{prefix}[{i}]")]
    return []


def refuse_non_finite(config: dict) -> None:
    """No setting of the workflow takes NaN or infinity, and both pass the schema's range checks: refuse them."""
    bad = non_finite_keys(config)
    if bad:
        config_error(bad[0], "must be a finite number (.nan and .inf are not allowed)")


def ignored_settings(config: dict) -> list[str]:
    """Settings that have no effect under the rest of the config (a warning each, so nobody relies on them)."""
    data = config.get("data") or {}
    out = []
    if data.get("origin", "synthetic") == "synthetic" and data.get("medmnist_root"):
        out.append(f"data.medmnist_root = {data['medmnist_root']!r} is ignored: data.origin is synthetic "
                   "(set data.origin: real to use the official files)")
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m fedmedbench.config.check FILE...``: check files before handing them to Snakemake."""
    import sys

    paths = sys.argv[1:] if argv is None else argv
    try:
        check_files(paths)
    except ConfigFileError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
