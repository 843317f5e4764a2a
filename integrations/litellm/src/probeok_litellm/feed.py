"""Following probeok's weights feed from a background thread.

The monitor serves the feed at ``/api/v1/weights`` (JSON, ``ETag: "<version>"``,
``If-None-Match`` + ``?wait=30s`` long-poll) and ``/api/v1/weights/stream`` (Server-Sent Events:
``event: weights`` / ``id: <version>`` / ``data: <json>``, a ``: heartbeat`` comment every 15 s,
``Last-Event-ID`` on reconnect). The follower prefers the stream; when the monitor refuses it
(404, 405, a non-SSE answer) it long-polls instead and tries the stream again now and then.

Everything read is bounded: a line, an event, a JSON body. Failures back off with full jitter
(250 ms doubling up to 30 s). The thread only ever replaces an immutable :class:`Snapshot`; the
router's hook reads it without waiting on the network.
"""

from __future__ import annotations

import http.client
import json
import logging
import random
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional

log = logging.getLogger("probeok_litellm")

#: Longest line accepted from the stream, and longest event (data lines together).
MAX_LINE = 1 << 20
MAX_EVENT = 8 << 20
#: Largest JSON body accepted from ``/api/v1/weights``.
MAX_BODY = 8 << 20
#: An open stream with no byte (event or heartbeat) for this long is dead: 3 missed heartbeats.
STREAM_SILENCE = 45.0
#: The long-poll's ``?wait=``; the socket waits a little longer than the monitor holds it.
LONG_POLL_WAIT = 30
CONNECT_TIMEOUT = 5.0
BACKOFF_MIN = 0.25
BACKOFF_MAX = 30.0
#: Least time between two long-polls that brought nothing new.
LONG_POLL_MIN_GAP = 1.0
#: How long the follower stays on long-poll before trying the stream again.
STREAM_RETRY_AFTER = 600.0


class FeedError(Exception):
    """The feed answered something unreadable or broke off."""


class StreamRefused(FeedError):
    """The monitor does not serve the stream here (the long-poll takes over)."""


@dataclass(frozen=True)
class Snapshot:
    """One version of the feed: route id → weight (0–100)."""

    version: int
    weights: Dict[str, int] = field(default_factory=dict)
    #: When the monitor built this version (RFC 3339), as the feed says.
    generated_at: Optional[str] = None


def parse(body: bytes) -> Snapshot:
    """A feed document (``{version, models: {serves: [{route, weight, …}]}}``) as a snapshot."""
    try:
        doc = json.loads(body)
        version = int(doc["version"])
        weights: Dict[str, int] = {}
        for routes in doc.get("models", {}).values():
            for r in routes:
                w = int(r["weight"])
                route = str(r["route"])
                # A route serving several models keeps its largest share.
                weights[route] = max(w, weights.get(route, 0))
        generated = doc.get("generated_at")
        return Snapshot(version=version, weights=weights,
                        generated_at=generated if isinstance(generated, str) else None)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise FeedError(f"unreadable weights document: {e}") from e


def endpoints(url: str) -> tuple[str, str]:
    """The JSON and stream URLs of a monitor's base URL (or of either feed URL)."""
    u = url.rstrip("/")
    for tail in ("/api/v1/weights/stream", "/api/v1/weights"):
        if u.endswith(tail):
            u = u[: -len(tail)]
            break
    return u + "/api/v1/weights", u + "/api/v1/weights/stream"


class Follower:
    """Keeps :attr:`snapshot` current from the feed; :attr:`last_seen` is the monotonic time the
    monitor last answered (a byte of the stream, a 200 or a 304)."""

    def __init__(
        self,
        url: str,
        token: Optional[str] = None,
        on_snapshot: Optional[Callable[[Snapshot], None]] = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.json_url, self.stream_url = endpoints(url)
        self._token = token
        self._on_snapshot = on_snapshot
        self._clock = clock
        self.snapshot: Optional[Snapshot] = None
        self.last_seen: Optional[float] = None
        self.connected = False
        self.mode = "stream"
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._conn: Optional[http.client.HTTPConnection] = None
        self._streamed = False

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="probeok-weights", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        conn = self._conn
        if conn is not None:
            try:
                if conn.sock is not None:
                    conn.sock.shutdown(2)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)

    # --- the loop --------------------------------------------------------------------------

    def _run(self) -> None:
        failures = 0
        stream_refused_at: Optional[float] = None
        while not self._stop.is_set():
            if stream_refused_at is not None and self._clock() - stream_refused_at > STREAM_RETRY_AFTER:
                stream_refused_at = None
            self._streamed = False
            try:
                if stream_refused_at is None:
                    self.mode = "stream"
                    self._follow_stream()
                else:
                    self.mode = "long-poll"
                    began = self._clock()
                    if not self._long_poll():
                        # A monitor that answers at once without holding the request must
                        # not be asked in a tight loop.
                        self._stop.wait(max(0.0, LONG_POLL_MIN_GAP - (self._clock() - began)))
                    failures = 0
                    continue
            except StreamRefused as e:
                log.info("probeok weights stream unavailable (%s); long-polling %s", e, self.json_url)
                stream_refused_at = self._clock()
                continue
            except (OSError, http.client.HTTPException, FeedError) as e:
                if self._streamed:
                    # A stream that was answered and then broke starts the backoff afresh.
                    failures = 0
                # One line at the first failure; the staleness warning is the callback's.
                (log.info if failures == 0 else log.debug)(
                    "probeok weights feed unreachable (%s: %s); retrying", type(e).__name__, e
                )
            finally:
                if self.connected:
                    # Reachable until this moment: staleness counts from here.
                    self._seen()
                self.connected = False
                self._close()
            if self._stop.is_set():
                return
            failures += 1
            delay = random.uniform(0, min(BACKOFF_MAX, BACKOFF_MIN * 2 ** min(failures, 10)))
            self._stop.wait(delay)

    def _headers(self, extra: Dict[str, str]) -> Dict[str, str]:
        h = {"User-Agent": "probeok-litellm", **extra}
        if self._token:
            h["Authorization"] = f"Bearer {self._token}"
        return h

    def _open(self, url: str, headers: Dict[str, str], read_timeout: float) -> http.client.HTTPResponse:
        u = urllib.parse.urlsplit(url)
        cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
        conn = cls(u.hostname or "127.0.0.1", u.port, timeout=CONNECT_TIMEOUT)
        self._conn = conn
        path = u.path + (f"?{u.query}" if u.query else "")
        conn.connect()
        conn.sock.settimeout(read_timeout)
        # A held request on a live connection is the monitor being there (a long-poll's wait,
        # the stream between heartbeats); the read timeout bounds how long that can last.
        self.connected = True
        conn.request("GET", path, headers=self._headers(headers))
        return conn.getresponse()

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _seen(self) -> None:
        self.last_seen = self._clock()

    def _publish(self, snap: Snapshot) -> bool:
        current = self.snapshot
        if current is not None and current.version == snap.version and current.weights == snap.weights:
            return False
        self.snapshot = snap
        if self._on_snapshot is not None:
            self._on_snapshot(snap)
        return True

    def _follow_stream(self) -> None:
        headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
        if self.snapshot is not None:
            headers["Last-Event-ID"] = str(self.snapshot.version)
        resp = self._open(self.stream_url, headers, STREAM_SILENCE)
        ctype = resp.getheader("Content-Type", "")
        if resp.status in (404, 405, 501) or (
            resp.status == 200 and not ctype.startswith("text/event-stream")
        ):
            raise StreamRefused(f"HTTP {resp.status} {ctype}".strip())
        if resp.status != 200:
            raise FeedError(f"stream answered HTTP {resp.status}")
        self._streamed = True
        self._seen()
        event, data, size = "message", [], 0
        while not self._stop.is_set():
            line = resp.readline(MAX_LINE + 1)
            if not line:
                raise FeedError("stream ended")
            if len(line) > MAX_LINE:
                raise FeedError("stream line too long")
            self._seen()
            text = line.decode("utf-8", "replace").rstrip("\r\n")
            if text == "":
                if event == "weights" and data:
                    try:
                        self._publish(parse("\n".join(data).encode()))
                    except FeedError as e:
                        log.warning("probeok: %s; keeping the last weights", e)
                event, data, size = "message", [], 0
                continue
            if text.startswith(":"):
                continue
            name, _, value = text.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                event = value
            elif name == "data":
                size += len(value)
                if size > MAX_EVENT:
                    raise FeedError("stream event too large")
                data.append(value)
            # `id` is the version, which the document carries too.

    def _long_poll(self) -> bool:
        """One long-poll; whether it brought a new version."""
        headers = {"Accept": "application/json"}
        url = self.json_url
        if self.snapshot is not None:
            headers["If-None-Match"] = f'"{self.snapshot.version}"'
            url += f"?wait={LONG_POLL_WAIT}s"
        resp = self._open(url, headers, LONG_POLL_WAIT + 15)
        if resp.status == 304:
            self._seen()
            return False
        if resp.status != 200:
            raise FeedError(f"weights answered HTTP {resp.status}")
        length = resp.getheader("Content-Length")
        if length is not None and int(length) > MAX_BODY:
            raise FeedError("weights document too large")
        body = resp.read(MAX_BODY + 1)
        if len(body) > MAX_BODY:
            raise FeedError("weights document too large")
        self._seen()
        return self._publish(parse(body))
