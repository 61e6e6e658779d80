"""Fetch one named weight set, verify it, and record what was fetched in a manifest.

Sources (``weights.<name>.source``):

* ``hf_hub``: ``huggingface_hub.hf_hub_download`` (timm and open_clip weights live on the
  hub), from ``base_url`` / ``HF_ENDPOINT`` / huggingface.co, at a pinned ``revision``.
* ``ultralytics``: an Ultralytics release asset, ``<base_url>/<release>/<asset>`` (the URL
  Ultralytics' own ``attempt_download_asset`` builds; its helper always goes to
  github.com, so the same URL is fetched here with a checksummed download that a mirror
  can serve).
* ``url``: any plain URL.
* ``path`` (any source): a file the user placed; copied in, nothing downloaded.

The file is checked before it is kept: not an HTML page, complete (safetensors header /
zip archive intact, Content-Length met), and its SHA-256 equal to ``sha256`` when one is
given. ``sha256: null`` records the hash of the first fetch in the manifest; later loads
verify the file against it (:func:`verify`). On any failure nothing is left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fedmedbench.weights import layout
from fedmedbench.workflow import io


class FetchError(RuntimeError):
    """A weight set could not be fetched or did not verify."""


def sha256sum(path: str | Path) -> str:
    return io.file_digest(path, "sha256")


def check_format(path: Path, origin: str) -> None:
    """Refuse what cannot be a weight file: an HTML page, a cut-off safetensors or zip file."""
    size = path.stat().st_size
    if size == 0:
        raise FetchError(f"{path.name}: empty file from {origin}")
    with open(path, "rb") as fh:
        head = fh.read(512)
    if head.lstrip().lower().startswith((b"<!doctype html", b"<html", b"<?xml", b"<head")):
        raise FetchError(f"{path.name}: {origin} returned an HTML/XML page, not a weight file")
    if path.suffix == ".safetensors":
        if size < 8:
            raise FetchError(f"{path.name}: truncated safetensors file from {origin} ({size} bytes)")
        (header_len,) = struct.unpack("<Q", head[:8])
        try:
            with open(path, "rb") as fh:
                fh.seek(8)
                header = json.loads(fh.read(header_len))
            end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        except (ValueError, KeyError, TypeError, MemoryError) as exc:
            raise FetchError(f"{path.name}: not a safetensors file ({origin}): {exc}") from exc
        if size != 8 + header_len + end:
            raise FetchError(f"{path.name}: truncated or padded safetensors file from {origin} "
                             f"({size} bytes, header says {8 + header_len + end})")
    elif path.suffix in (".pt", ".pth", ".bin", ".ckpt"):
        if not zipfile.is_zipfile(path):
            raise FetchError(f"{path.name}: not a PyTorch zip archive (truncated or not a checkpoint) from {origin}")
        with zipfile.ZipFile(path) as zf:
            bad = zf.testzip()
        if bad is not None:
            raise FetchError(f"{path.name}: corrupt member {bad} in the archive from {origin}")


def _check_hash(path: Path, expected: str | None, origin: str) -> str:
    actual = sha256sum(path)
    if expected and actual != expected.lower():
        raise FetchError(f"{path.name}: SHA-256 mismatch for {origin}: expected {expected.lower()}, got {actual}")
    return actual


@contextlib.contextmanager
def _hub_online() -> Iterator[None]:
    """huggingface_hub is switched offline for every job (fedmedbench.compat); a fetch is the
    one place that is meant to download, so it is switched on for the duration of the call."""
    from huggingface_hub import constants

    before = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = False
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = before


def _hub_reason(exc: BaseException) -> str:
    """The HTTP status behind a hub-client error (it wraps them), else its first line."""
    seen: BaseException | None = exc
    while seen is not None:
        status = getattr(getattr(seen, "response", None), "status_code", None)
        if status is not None:
            return f"the server answered HTTP {status} ({type(exc).__name__})"
        seen = seen.__cause__ or seen.__context__
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"


def _from_hub(entry: dict[str, Any], tmp: Path, target: Path) -> dict[str, Any]:
    from huggingface_hub import hf_hub_download

    endpoint = (entry.get("base_url") or os.environ.get("HF_ENDPOINT") or layout.DEFAULT_BASE["hf_hub"]).rstrip("/")
    origin = layout.download_url(entry, endpoint)
    try:
        with _hub_online():
            cached = Path(hf_hub_download(entry["repo_id"], entry["filename"], revision=entry["revision"],
                                          cache_dir=str(tmp / "cache"), endpoint=endpoint))
    except Exception as exc:  # the hub client raises many types (HTTP, offline, entry not found)
        raise FetchError(f"{target.name}: download from {origin} failed: {_hub_reason(exc)}") from exc
    shutil.copyfile(cached.resolve(), target)
    # the cache stores the file under snapshots/<commit>/: the commit the revision resolved to
    resolved = cached.parent.name if cached.parent.parent.name == "snapshots" else None
    return {"url": origin, "resolved_revision": resolved}


def _from_url(url: str, target: Path, timeout: float) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp, open(target, "wb") as out:
            expected = resp.headers.get("Content-Length")
            ctype = resp.headers.get("Content-Type", "")
            received = 0
            while block := resp.read(1 << 20):
                out.write(block)
                received += len(block)
    except urllib.error.HTTPError as exc:
        raise FetchError(f"{target.name}: download failed, {url} answered HTTP {exc.code}") from exc
    except (OSError, ValueError) as exc:  # URLError, timeouts, dropped connections (IncompleteRead)
        raise FetchError(f"{target.name}: download from {url} failed: {type(exc).__name__}: {exc}") from exc
    if expected is not None and received != int(expected):
        raise FetchError(f"{target.name}: truncated download from {url} ({received} of {expected} bytes)")
    if "text/html" in ctype.lower():
        raise FetchError(f"{target.name}: {url} returned an HTML page (Content-Type {ctype}), not a weight file")
    return {"url": url}


def describe(entry: dict[str, Any]) -> dict[str, Any]:
    """The source fields that define a weight set (compared on rerun, stored in the manifest)."""
    keys = ("source", "repo_id", "filename", "revision", "release", "asset", "url", "base_url", "path", "sha256")
    return {k: entry.get(k) for k in keys if entry.get(k) is not None}


def fetch(name: str, entry: dict[str, Any], out_dir: str | Path | None = None, timeout: float = 120.0,
          log: Callable[[str], Any] = print) -> dict[str, Any]:
    """Fetch weight set ``name`` into ``out_dir`` (default ``resources/weights/<name>``); its manifest.

    A folder whose manifest matches ``entry`` and whose file still has the recorded hash is
    kept as is (no download); a file already in the folder with the pinned ``sha256`` is adopted. Otherwise the file is fetched into a temporary folder,
    verified, moved into place, and the manifest written last.
    """
    out = Path(out_dir or layout.folder(name))
    target = out / layout.file_name(entry)
    manifest_file = out / "manifest.json"
    if manifest_file.is_file() and target.is_file():
        old = json.loads(manifest_file.read_text())
        if old.get("entry") == describe(entry) and sha256sum(target) == old.get("sha256"):
            log(f"{name}: {target} already fetched and verified")
            return old
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=out))
    try:
        staged = tmp / target.name
        if entry.get("sha256") and target.is_file() and sha256sum(target) == entry["sha256"].lower():
            shutil.copyfile(target, staged)  # a file already in place with the pinned hash: no download
            got = {"path": str(target)}
            origin = str(target)
        elif entry.get("path"):
            src = Path(entry["path"])
            if not src.is_file():
                raise FetchError(f"{src}: file not found (weights.{name}.path)")
            shutil.copyfile(src, staged)
            got = {"path": str(src)}
            origin = str(src)
        elif entry["source"] == "hf_hub":
            got = _from_hub(entry, tmp, staged)
            origin = got["url"]
        else:
            origin = layout.download_url(entry)
            got = _from_url(origin, staged, timeout)
        check_format(staged, origin)
        digest = _check_hash(staged, entry.get("sha256"), origin)
        manifest = {
            "name": name, "entry": describe(entry), **got,
            "files": [{"name": target.name, "sha256": digest, "size": staged.stat().st_size}],
            "file": target.name, "sha256": digest, "size": staged.stat().st_size,
            "sha256_pinned": bool(entry.get("sha256")), "licence": entry.get("licence"),
        }
        manifest_file.unlink(missing_ok=True)
        os.replace(staged, target)
        io.write_json(manifest_file, manifest)
    except BaseException:
        if not manifest_file.is_file():
            target.unlink(missing_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        with contextlib.suppress(OSError):
            out.rmdir()  # only if empty: a failed first fetch leaves no folder
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"{name}: {target} ({manifest['size']} bytes, sha256 {digest}) from {origin}")
    return manifest


def verify(weight_file: str | Path, manifest_file: str | Path | None = None) -> str:
    """The file's SHA-256, after checking it against its manifest (the hash recorded at fetch)."""
    weight_file = Path(weight_file)
    manifest_file = Path(manifest_file or weight_file.parent / "manifest.json")
    if not manifest_file.is_file():
        raise FetchError(f"{manifest_file}: manifest of {weight_file} not found (run the fetch_weights rule)")
    recorded = json.loads(manifest_file.read_text()).get("sha256")
    if not weight_file.is_file():
        raise FetchError(f"{weight_file}: weight file missing beside its manifest; fetch it again")
    actual = sha256sum(weight_file)
    if actual != recorded:
        raise FetchError(f"{weight_file}: SHA-256 {actual} differs from the manifest's {recorded}; "
                         "the file changed after it was fetched: delete the folder and fetch again")
    return actual


def verify_manifests(manifests: list[str | Path]) -> dict[str, str]:
    """Weight set name -> verified SHA-256 of its file, for every manifest a job depends on."""
    out = {}
    for m in manifests:
        m = Path(m)
        data = json.loads(m.read_text())
        out[data["name"]] = verify(m.parent / data["file"], m)
    return out


def pin(spec, manifests: list[str | Path]):
    """``spec`` with the verified hashes of its weight files in ``weights_sha256``."""
    from dataclasses import replace

    hashes = verify_manifests(list(manifests))
    return replace(spec, weights_sha256=hashes) if hashes else spec
