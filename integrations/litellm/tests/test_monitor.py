"""Against a real probeok monitor (``PROBEOK_BIN``): its feed, its versions, its probes."""

import asyncio
import json
import queue
import threading
import time
import urllib.request

import pytest

from conftest import calls, deployment, make_router, split, wait_for, within
from monitor import Monitor, binary
from probeok_litellm import ProbeokRouting

pytestmark = pytest.mark.skipif(binary() is None, reason="PROBEOK_BIN names no probeok binary")


@pytest.fixture
def monitor(tmp_path, upstreams):
    monitors = []

    def start(weights):
        m = Monitor(tmp_path, upstreams, weights)
        monitors.append(m)
        return m

    yield start
    for m in monitors:
        m.stop()


def test_the_monitors_70_30_0_over_2000_calls(upstreams, monitor, callbacks):
    m = monitor([70, 30, 0])
    version = m.wait_weights([70, 30, 0])
    cb = callbacks(ProbeokRouting(url=m.url))
    wait_for("the monitor's weights", 5, lambda: cb.current() is not None)
    assert cb.follower.mode == "stream"
    router = make_router([deployment(u, r) for u, r in zip(upstreams, m.routes)])
    counts = split(upstreams, router, 2000)
    assert counts[2] == 0, counts
    assert within(counts, [0.7, 0.3, 0.0]), counts
    assert cb.current().version >= version


def watch_feed(url: str, seen: "queue.Queue", stop: threading.Event) -> threading.Thread:
    """Long-polls the monitor's feed (If-None-Match, ?wait=) and queues (time seen, document)."""

    def run():
        etag = None
        while not stop.is_set():
            req = urllib.request.Request(f"{url}/api/v1/weights?wait=5s")
            if etag:
                req.add_header("If-None-Match", etag)
            try:
                with urllib.request.urlopen(req, timeout=15) as r:
                    doc = json.load(r)
                    etag = r.headers["ETag"]
            except urllib.error.HTTPError as e:
                if e.code == 304:
                    continue
                raise
            except OSError:
                return
            seen.put((time.monotonic(), doc))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_route_failing_its_probes_each_new_version_is_followed_within_two_seconds(
    upstreams, monitor, callbacks
):
    m = monitor([70, 30, 0])
    m.wait_weights([70, 30, 0])
    cb = callbacks(ProbeokRouting(url=m.url))
    wait_for("the monitor's weights", 5, lambda: cb.current() is not None)
    router = make_router([deployment(u, r) for u, r in zip(upstreams, m.routes)])
    assert split(upstreams, router, 200)[2] == 0

    seen, stop = queue.Queue(), threading.Event()
    watch_feed(m.url, seen, stop)
    seen.get(timeout=10)  # the version in force now
    # r1 starts failing: the monitor's probes see it and cut its weight.
    upstreams[0].failing = True
    followed, drained = [], False
    try:
        # Cut (WARNING, DEGRADED), then drained once its error rate is judged: each version
        # followed, and once drained the route stays at 0 (no swing back on the next probe).
        while len(followed) < 3 or not drained:
            at, doc = seen.get(timeout=60)
            wait_for("the router on the monitor's version", max(0.0, at + 2.0 - time.monotonic()),
                     lambda: cb.current().version >= doc["version"], every=0.001)
            followed.append(time.monotonic() - at)
            weights = {r["route"]: r["weight"] for r in doc["models"]["chat"]}
            assert weights[m.routes[0]] < 70, weights
            assert not drained or weights[m.routes[0]] == 0, (followed, weights)
            drained = weights[m.routes[0]] == 0
        # A few more probes of the failing route: no new version gives it traffic back.
        deadline = time.monotonic() + 3.0
        while (left := deadline - time.monotonic()) > 0:
            try:
                _, doc = seen.get(timeout=left)
            except queue.Empty:
                break
            weights = {r["route"]: r["weight"] for r in doc["models"]["chat"]}
            assert weights[m.routes[0]] == 0, weights
    finally:
        stop.set()
    assert max(followed) < 2.0, followed

    # The calls follow: the weight-0 route gets none, the failing one at most its cut share.
    for u in upstreams:
        u.take()
    asyncio.run(calls(router, 300, tolerate=True))
    counts = [u.take() for u in upstreams]
    assert counts[2] == 0, counts
    assert counts[1] >= 300 * 0.75, counts
