"""A real HTTP server on 127.0.0.1 that misbehaves on purpose, one behaviour per test case.

http.server (stdlib) because a hostile server must be able to do what no framework lets it: write
half a line, never end a body, trickle a byte at a time, send HTML where JSON belongs. Every other
endpoint answers like a small vLLM (docs/facts.md "Serving benchmarks": /v1/models, /tokenize, streamed
completions with usage and [DONE]) so each case breaks exactly one thing.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MODEL = "hostile/tiny"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "HostileServer"

    def log_message(self, *a) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()  # uvicorn and aiohttp set TCP_NODELAY; without it Nagle merges the tokens
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _json(self, obj, status: int = 200, ctype: str = "application/json") -> None:
        body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _body(self) -> dict:
        n = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(n) or b"{}")

    def do_GET(self) -> None:
        b = self.server.b
        if self.path == "/v1/models":
            if b.get("models") == "html":
                return self._json(
                    b"<!doctype html><html><body>Welcome to nginx!</body></html>", 200, "text/html"
                )
            if b.get("models") == "trickle":
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "1000")
                self.end_headers()
                for _ in range(1000):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(2)
                return
            return self._json({"object": "list", "data": [{"id": MODEL, "max_model_len": 8192}]})
        if self.path == "/metrics":
            if b.get("metrics") == "garbage":
                return self._json(
                    b'vllm:spec_decode_num_drafts_total{position="x" 12 garbage\n\x00{{{', 200, "text/plain"
                )
            return self._json(b"# nothing\n", 200, "text/plain")
        if self.path == "/health":
            return self._json(b"", {"absent": 404, "loading": 503}.get(b.get("health"), 200))
        self._json({"detail": "Not Found"}, 404)

    def do_POST(self) -> None:
        b = self.server.b
        req = self._body()
        if self.path == "/extras/tokenize" and b.get("tokenize") == "llama-cpp-python":
            # llama-cpp-python 0.3.36: {"input"} -> {"tokens": [BOS, ...]} (recorded answer in
            # tests/fixtures/bench/realworld/llama-cpp-python-0.3.36-tokenize.json)
            return self._json({"tokens": [1] + list(range(len(str(req.get("input", "")).split())))})
        if self.path == "/tokenize":
            tk = b.get("tokenize", "vllm")
            if tk == "llama-cpp-python":
                return self._json({"detail": "Not Found"}, 404)
            if tk == "absent":
                return self._json({"detail": "Not Found"}, 404)
            if tk == "many":
                return self._json({"count": "many", "max_model_len": 8192})
            if tk == "llama.cpp":  # llama-server: {"tokens": []} unless the text is under "content"
                return self._json({"tokens": list(range(len(req.get("content", "").split())))})
            return self._json({"count": len(req.get("prompt", "").split()), "max_model_len": 8192})
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            return self._json({"detail": "Not Found"}, 404)
        if b.get("extras") == "reject" and ("ignore_eos" in req or "min_tokens" in req):
            return self._json(
                {
                    "detail": [
                        {"type": "extra_forbidden", "loc": ["body", "ignore_eos"], "msg": "Unexpected fields"}
                    ]
                },
                422,
            )
        if not req.get("stream"):  # calibration probe
            n = len(str(req.get("prompt", "")).split())
            return self._json(
                {
                    "choices": [{"text": "x", "finish_reason": "length"}],
                    "usage": {"prompt_tokens": n, "completion_tokens": 1},
                }
            )
        self._stream(req, b)

    def _stream(self, req: dict, b: dict) -> None:
        asked = int(req["max_tokens"])
        bad = b.get("stream")
        if b.get("only_max_tokens") is not None and asked != b["only_max_tokens"]:
            bad = None  # misbehave on one measurement only
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        w = self.wfile
        n = b.get("short", asked) if bad == "short" else asked
        chat = "messages" in req

        def chunk(i: int) -> bytes:
            ch = {"index": 0, "delta": {"content": f" t{i}"}} if chat else {"index": 0, "text": f" t{i}"}
            ch["finish_reason"] = "length" if i == n - 1 else None
            return b"data: " + json.dumps({"choices": [ch]}).encode() + b"\n\n"

        try:
            if b.get("replay"):  # a real server's recorded stream, event by event
                for ev in Path(b["replay"]).read_bytes().split(b"\n\n"):
                    if ev.strip():
                        w.write(ev + b"\n\n")
                        w.flush()
                        time.sleep(0.005)
                return
            if bad == "endless":
                while True:
                    w.write(chunk(0) * 64)
            if bad == "endless-line":
                w.write(b"data: ")
                while True:
                    w.write(b"x" * 65536)
            if bad == "endless-comments":
                while True:
                    w.write(b": keep-alive\n" * 4096)
            for i in range(n):
                if bad == "malformed" and i == 2:
                    w.write(b'data: {"choices": [{"text": "t", "finish_reason": nul\n\n')
                    w.flush()
                    return
                w.write(chunk(i))
                w.flush()
                time.sleep(0.005)  # a decode step: TPOT must be measurable on a busy machine
            if bad != "no-usage":
                w.write(
                    b"data: "
                    + json.dumps(
                        {
                            "choices": [],
                            "usage": {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n},
                        }
                    ).encode()
                    + b"\n\n"
                )
            if bad not in ("no-done", "no-usage"):
                w.write(b"data: [DONE]\n\n")
            w.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass


class HostileServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, behaviour: dict):
        super().__init__(("127.0.0.1", 0), Handler)
        self.b = behaviour

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@contextmanager
def hostile(**behaviour):
    srv = HostileServer(behaviour)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


if __name__ == "__main__":  # python -m tests.hostile.server PORT KEY=VALUE...: a launchable server
    import sys

    srv = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    srv.b = dict(a.split("=", 1) for a in sys.argv[2:])
    srv.serve_forever()
