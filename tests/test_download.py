"""Download against a real HTTP server on 127.0.0.1: good file, corrupt file, 404, dropped stream."""

from __future__ import annotations

import hashlib
import http.server
import threading
from pathlib import Path

import pytest

from fedmedbench.data import medmnist
from fedmedbench.data.medmnist import DataError

PAYLOAD = b"NPZ-FIXTURE" * 50_000  # ~550 kB
GOOD_MD5 = hashlib.md5(PAYLOAD).hexdigest()


class Handler(http.server.BaseHTTPRequestHandler):
    hits: dict[str, int] = {}

    def log_message(self, *args):  # keep test output quiet
        pass

    def do_GET(self):  # noqa: N802
        Handler.hits[self.path] = Handler.hits.get(self.path, 0) + 1
        if self.path == "/good.npz":
            self._send(PAYLOAD)
        elif self.path == "/corrupt.npz":
            self._send(PAYLOAD[:-10] + b"0123456789")
        elif self.path == "/drop.npz":  # promise everything, send half, hang up
            self.send_response(200)
            self.send_header("Content-Length", str(len(PAYLOAD)))
            self.end_headers()
            self.wfile.write(PAYLOAD[: len(PAYLOAD) // 2])
            self.wfile.flush()
            self.connection.close()
        elif self.path == "/flaky.npz":  # drops the first time, then serves
            if Handler.hits[self.path] == 1:
                self.send_response(200)
                self.send_header("Content-Length", str(len(PAYLOAD)))
                self.end_headers()
                self.wfile.write(PAYLOAD[:1000])
                self.connection.close()
            else:
                self._send(PAYLOAD)
        else:
            self.send_error(404)

    def _send(self, body: bytes):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_good_download(server, tmp_path):
    target = tmp_path / "x.npz"
    medmnist.download(f"{server}/good.npz", GOOD_MD5, target, retries=1, backoff=0)
    assert target.read_bytes() == PAYLOAD
    assert _leftovers(tmp_path) == ["x.npz"]


def test_checksum_mismatch_fails_and_leaves_nothing(server, tmp_path):
    with pytest.raises(DataError, match=r"x\.npz.*MD5 mismatch"):
        medmnist.download(f"{server}/corrupt.npz", GOOD_MD5, tmp_path / "x.npz", retries=2, backoff=0, log=lambda m: None)
    assert _leftovers(tmp_path) == []


def test_404_is_final(server, tmp_path):
    before = Handler.hits.get("/missing.npz", 0)
    with pytest.raises(DataError, match="HTTP 404"):
        medmnist.download(f"{server}/missing.npz", GOOD_MD5, tmp_path / "x.npz", retries=3, backoff=0)
    assert Handler.hits["/missing.npz"] - before == 1  # no retries on a client error
    assert _leftovers(tmp_path) == []


def test_dropped_stream_fails_cleanly(server, tmp_path):
    with pytest.raises(DataError, match="x.npz"):
        medmnist.download(f"{server}/drop.npz", GOOD_MD5, tmp_path / "x.npz", retries=2, backoff=0, log=lambda m: None)
    assert _leftovers(tmp_path) == []


def test_retry_recovers_from_a_drop(server, tmp_path):
    medmnist.download(f"{server}/flaky.npz", GOOD_MD5, tmp_path / "x.npz", retries=3, backoff=0, log=lambda m: None)
    assert (tmp_path / "x.npz").read_bytes() == PAYLOAD


def test_local_root_is_verified(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "breastmnist.npz").write_bytes(PAYLOAD)
    out = tmp_path / "out" / "b.npz"
    medmnist.copy_verified(root / "breastmnist.npz", GOOD_MD5, out)
    assert out.read_bytes() == PAYLOAD
    (root / "breastmnist.npz").write_bytes(PAYLOAD[:100])
    with pytest.raises(DataError, match=r"breastmnist\.npz: MD5 mismatch"):
        medmnist.copy_verified(root / "breastmnist.npz", GOOD_MD5, tmp_path / "out" / "c.npz")
    assert not (tmp_path / "out" / "c.npz").exists()
    with pytest.raises(DataError, match="not found"):
        medmnist.fetch("breastmnist", 28, tmp_path / "d.npz", root=tmp_path / "nowhere")


def test_official_urls_and_names():
    url, md5 = medmnist.url_and_md5("breastmnist", 64)
    assert url.startswith("https://") and "breastmnist_64.npz" in url and len(md5) == 32
    assert medmnist.official_filename("pathmnist", 28) == "pathmnist.npz"
    with pytest.raises(DataError, match="size"):
        medmnist.url_and_md5("breastmnist", 32)
    with pytest.raises(DataError, match="unknown or unsupported"):
        medmnist.url_and_md5("chestmnist", 28)
