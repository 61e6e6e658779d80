"""A loopback HTTP server (127.0.0.1 only) in the layouts weights are fetched from:
the Hugging Face hub's ``/<repo>/resolve/<revision>/<file>`` (with the headers the hub
client reads) and an Ultralytics release asset ``/<release>/<asset>``; plus faults."""

from __future__ import annotations

import hashlib
import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager

COMMIT = "0123456789abcdef0123456789abcdef01234567"
HTML = b"<!DOCTYPE html><html><body><h1>Service unavailable</h1></body></html>"


class WeightServer:
    """Files by URL path; ``faults[path]`` = 'html' | 'truncate' | '404'; ``hits[path]`` counts GETs."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.faults: dict[str, str] = {}
        self.hits: dict[str, int] = {}
        self.url = ""

    def serve(self, path: str, body: bytes, fault: str | None = None) -> str:
        self.files[path] = body
        if fault:
            self.faults[path] = fault
        return self.url + path


def _handler(server: WeightServer):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet tests
            pass

        def _answer(self, head_only: bool) -> None:
            path = self.path.split("?")[0]
            body = server.files.get(path)
            fault = server.faults.get(path)
            if not head_only:
                server.hits[path] = server.hits.get(path, 0) + 1
            if body is None or fault == "404":
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            ctype = "application/octet-stream"
            if fault == "html":
                body, ctype = HTML, "text/html; charset=utf-8"
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            if "/resolve/" in path:  # what the hub sends for a file
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("ETag", f'"{hashlib.sha256(body).hexdigest()}"')
            if fault == "truncate":
                self.send_header("Connection", "close")
            self.end_headers()
            if head_only:
                return
            self.wfile.write(body[: len(body) // 2] if fault == "truncate" else body)
            self.wfile.flush()
            if fault == "truncate":
                self.close_connection = True

        def do_HEAD(self):  # noqa: N802
            self._answer(True)

        def do_GET(self):  # noqa: N802
            self._answer(False)

    return Handler


@contextmanager
def weight_server() -> Iterator[WeightServer]:
    state = WeightServer()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
