"""Real HTTP servers on 127.0.0.1:0 for the tests.

- :class:`Upstream`: an OpenAI-compatible provider (``POST /v1/chat/completions``, the
  chat-completion object and, with ``stream: true``, ``chat.completion.chunk`` events ending in
  ``data: [DONE]``, as in OpenAI's API reference) that counts the calls it answers (apart from probeok's probes). It answers
  ``PROBE_OK``, which is also what probeok's probe asks for, and ``1 2 … 40`` to the throughput
  probe's "count from 1 to 40" (as probeok's own simulator, ``src/sim/openai.rs``, does). While
  ``failing`` it answers 503 with OpenAI's error body.
- :class:`FeedServer`: probeok's weights feed with the monitor's exact wire format, copied from
  ``src/web/feed.rs`` (and ``docs/http-api.md``, "The weights feed"): ``GET /api/v1/weights``
  with ``ETag: "<version>"`` and ``Cache-Control: no-cache``, ``If-None-Match`` naming the
  current version → 304, ``?wait=`` holding that request until a newer version (200) or the wait
  ends (304), at most 60 s; ``GET /api/v1/weights/stream`` as Server-Sent Events, one
  ``event: weights`` / ``id: <version>`` / ``data: <json>`` per version (the current one on
  connect unless ``Last-Event-ID`` names it), ``: heartbeat`` comments (axum's ``KeepAlive``
  text), and 404 ``{"error":{"code":"not_found",…}}`` for unknown paths, as the monitor answers.
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, List, Optional
from urllib.parse import parse_qs, urlsplit


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        # A client going away mid-answer (a monitor stopped between probes) is no error here.
        import sys

        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


class Upstream:
    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = 0
        self.probes = 0
        self.failing = False
        self._lock = threading.Lock()
        up = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out as separate writes: without this, Nagle and delayed ACKs
            # add 40 ms to every answer.
            disable_nagle_algorithm = True

            def log_message(self, *a):  # quiet
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                if not self.path.endswith("/chat/completions"):
                    return self._json(404, {"error": {"message": "not found", "type": "invalid_request_error"}})
                if up.failing:
                    return self._json(503, {"error": {"message": "overloaded", "type": "server_error", "code": None}})
                asked = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
                answer = "PROBE_OK"
                if "count from 1 to 40" in asked.lower():
                    answer = " ".join(str(i) for i in range(1, 41))
                # probeok's own probes are not the calls a router sent.
                probe = "PROBE_OK" in asked or answer != "PROBE_OK"
                with up._lock:
                    if probe:
                        up.probes += 1
                    else:
                        up.calls += 1
                model = body.get("model", "m")
                created = int(time.time())
                if body.get("stream"):
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for delta, finish in (({"role": "assistant", "content": answer}, None), ({}, "stop")):
                        chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": created,
                                 "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
                        self._chunk(f"data: {json.dumps(chunk)}\n\n".encode())
                    usage = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": created,
                             "model": model, "choices": [],
                             "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}
                    self._chunk(f"data: {json.dumps(usage)}\n\n".encode())
                    self._chunk(b"data: [DONE]\n\n")
                    self._chunk(b"")
                    return
                self._json(200, {
                    "id": "chatcmpl-1", "object": "chat.completion", "created": created, "model": model,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": answer},
                                 "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
                })

            def _chunk(self, b: bytes):
                self.wfile.write(f"{len(b):x}\r\n".encode() + b + b"\r\n")
                self.wfile.flush()

            def _json(self, status, doc):
                b = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(b)))
                self.end_headers()
                self.wfile.write(b)

        self.server = _Server(("127.0.0.1", 0), H)
        self.port = self.server.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def take(self) -> int:
        with self._lock:
            n, self.calls = self.calls, 0
            return n

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def feed_document(version: int, model: str, weights: Dict[str, int]) -> dict:
    """A feed document as the monitor writes it (docs/http-api.md, "The weights feed")."""
    routes = []
    for route, w in weights.items():
        provider, region, m = route.split("/", 2)
        routes.append({"route": route, "provider": provider, "region": region, "model": m,
                       "tier": "primary", "weight": w, "state": "NORMAL" if w else "CRITICAL",
                       "reason": "healthy" if w else "success_ratio_low"})
    return {"version": version, "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "models": {model: routes},
            "serving": {model: {"tier": "primary", "all_unhealthy": not any(weights.values())}}}


class FeedServer:
    def __init__(self, model: str, weights: Dict[str, int], stream: bool = True, version: int = 1,
                 token: Optional[str] = None) -> None:
        self.model = model
        # The monitor's feed is open; a reverse proxy in front of it may ask for a bearer token.
        self.token = token
        self.refused = 0
        self.stream_enabled = stream
        self._cond = threading.Condition()
        self._set(version, weights)
        self.stream_requests: List[Optional[str]] = []  # Last-Event-ID of each stream request
        self.poll_requests: List[Optional[str]] = []  # If-None-Match of each JSON request
        self.heartbeat = 15.0
        feed = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out as separate writes: without this, Nagle and delayed ACKs
            # add 40 ms to every answer.
            disable_nagle_algorithm = True

            def log_message(self, *a):
                pass

            def do_GET(self):
                u = urlsplit(self.path)
                if feed.token is not None and self.headers.get("Authorization") != f"Bearer {feed.token}":
                    feed.refused += 1
                    return self._send(401, b'{"error":{"code":"unauthorized","message":"bearer token required"}}',
                                      {"Content-Type": "application/json"})
                if u.path == "/api/v1/weights":
                    return self._weights(parse_qs(u.query))
                if u.path == "/api/v1/weights/stream" and feed.stream_enabled:
                    return self._stream()
                self._send(404, b'{"error":{"code":"not_found","message":"no such path"}}',
                           {"Content-Type": "application/json"})

            def _send(self, status, body: bytes, headers: dict):
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _hits(self, version: int) -> bool:
                tags = [t.strip() for t in (self.headers.get("If-None-Match") or "").split(",")]
                return any(t == "*" or t.removeprefix("W/") == f'"{version}"' for t in tags if t)

            def _weights(self, q):
                feed.poll_requests.append(self.headers.get("If-None-Match"))
                wait = 0.0
                if "wait" in q:
                    m = re.fullmatch(r"(\d+)s?", q["wait"][0].strip())
                    wait = min(float(m.group(1)), 60.0) if m else 0.0
                with feed._cond:
                    version, body = feed.version, feed.body
                    if self._hits(version) and wait > 0:
                        feed._cond.wait_for(lambda: feed.version != version or feed.closed, timeout=wait)
                        if feed.version != version:
                            version, body = feed.version, feed.body
                            return self._full(version, body)
                        return self._not_modified(version)
                if self._hits(version):
                    return self._not_modified(version)
                self._full(version, body)

            def _full(self, version, body):
                self._send(200, body, {"Content-Type": "application/json", "ETag": f'"{version}"',
                                       "Cache-Control": "no-cache"})

            def _not_modified(self, version):
                self.send_response(304)
                self.send_header("ETag", f'"{version}"')
                self.send_header("Cache-Control", "no-cache")
                self.end_headers()

            def _stream(self):
                # The stream ends with the connection, as an axum SSE body does.
                self.close_connection = True
                last = (self.headers.get("Last-Event-ID") or "").strip()
                feed.stream_requests.append(last or None)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("x-accel-buffering", "no")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                seen = int(last) if last.isdigit() else None
                try:
                    while not feed.closed:
                        with feed._cond:
                            if seen == feed.version:
                                feed._cond.wait_for(lambda: feed.version != seen or feed.closed,
                                                    timeout=feed.heartbeat)
                            if feed.closed:
                                return
                            version, body = feed.version, feed.body
                        if version == seen:
                            self._chunk(b": heartbeat\n\n")
                            continue
                        self._chunk(b"event: weights\nid: %d\ndata: %s\n\n" % (version, body))
                        seen = version
                except OSError:
                    return

            def _chunk(self, b: bytes):
                self.wfile.write(f"{len(b):x}\r\n".encode() + b + b"\r\n")
                self.wfile.flush()

        self.closed = False
        self.server = _Server(("127.0.0.1", 0), H)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _set(self, version: int, weights: Dict[str, int]) -> None:
        self.version = version
        self.weights = dict(weights)
        self.body = json.dumps(feed_document(version, self.model, weights), separators=(",", ":")).encode()

    def publish(self, weights: Dict[str, int]) -> int:
        """A new version with these weights; returns it."""
        with self._cond:
            self._set(self.version + 1, weights)
            self._cond.notify_all()
            return self.version

    def close(self) -> None:
        """The monitor goes away: open streams and held polls end, the port stops listening."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()
        self.server.shutdown()
        self.server.server_close()
