"""Where a named weight set lives: ``resources/weights/<name>/{<file>, manifest.json}``.

Light on purpose (no torch): the Snakefile uses it to name the inputs of training jobs.
"""

from __future__ import annotations

import posixpath
from typing import Any
from urllib.parse import unquote, urlparse

ROOT = "resources/weights"

#: where each source kind downloads from when no base_url is configured
DEFAULT_BASE = {
    "hf_hub": "https://huggingface.co",
    "ultralytics": "https://github.com/ultralytics/assets/releases/download",
}


def file_name(entry: dict[str, Any]) -> str:
    """The weight file's name inside its folder (as the source names it)."""
    if entry.get("path"):
        return posixpath.basename(str(entry["path"]))
    source = entry["source"]
    if source == "hf_hub":
        return posixpath.basename(entry["filename"])
    if source == "ultralytics":
        return entry["asset"]
    if source == "url":
        return posixpath.basename(unquote(urlparse(entry["url"]).path))
    raise ValueError(f"unknown weight source '{source}'")


def folder(name: str) -> str:
    return f"{ROOT}/{name}"


def manifest_path(name: str) -> str:
    return f"{folder(name)}/manifest.json"


def weight_path(name: str, entry: dict[str, Any]) -> str:
    return f"{folder(name)}/{file_name(entry)}"


def download_url(entry: dict[str, Any], endpoint: str | None = None) -> str:
    """The URL a set is fetched from (hf_hub: the hub's ``resolve/<revision>/<file>`` layout)."""
    source = entry["source"]
    if source == "url":
        return entry["url"]
    base = (entry.get("base_url") or endpoint or DEFAULT_BASE[source]).rstrip("/")
    if source == "ultralytics":
        return f"{base}/{entry['release']}/{entry['asset']}"
    return f"{base}/{entry['repo_id']}/resolve/{entry['revision']}/{entry['filename']}"


CATALOGUE = "config/weights.yaml"
#: fields each source kind needs
REQUIRED = {"hf_hub": ("repo_id", "filename", "revision"), "ultralytics": ("release", "asset"), "url": ("url",)}


def weight_sets(overrides: dict[str, dict[str, Any]] | None, catalogue: str | None = CATALOGUE) -> dict[str, dict[str, Any]]:
    """The built-in sets (``config/weights.yaml``) with the config's ``weights:`` merged in key by key.

    Raises ``ValueError`` naming ``weights.<name>.<key>`` when a merged set misses a field.
    """
    sets: dict[str, dict[str, Any]] = {}
    if catalogue:
        import yaml

        with open(catalogue) as fh:
            sets = {k: dict(v) for k, v in (yaml.safe_load(fh) or {}).get("weights", {}).items()}
    for name, entry in (overrides or {}).items():
        sets[name] = {**sets.get(name, {}), **entry}
    for name, entry in sets.items():
        source = entry.get("source")
        if source not in REQUIRED:
            raise ValueError(f"config error at 'weights.{name}.source': one of {sorted(REQUIRED)} is needed")
        for key in REQUIRED[source]:
            if not entry.get(key):
                raise ValueError(f"config error at 'weights.{name}.{key}': needed for source {source}")
        entry.setdefault("sha256", None)
        entry.setdefault("path", None)
        entry.setdefault("base_url", None)
    return sets
