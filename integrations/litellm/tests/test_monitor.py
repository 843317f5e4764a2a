"""Against a real probeok monitor (``PROBEOK_BIN``): its feed, its versions, its probes."""

import asyncio
import json
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


def watch_feed(url: str, until, found: dict) -> threading.Thread:
    """Long-polls the monitor's feed (If-None-Match, ?wait=) and notes when ``until`` holds."""

    def run():
        etag = None
        end = time.monotonic() + 60
        while time.monotonic() < end:
            req = urllib.request.Request(f"{url}/api/v1/weights?wait=30s")
            if etag:
                req.add_header("If-None-Match", etag)
            try:
                with urllib.request.urlopen(req, timeout=40) as r:
                    doc = json.load(r)
                    etag = r.headers["ETag"]
            except urllib.error.HTTPError as e:
                if e.code == 304:
                    continue
                raise
            if until(doc):
                found["at"] = time.monotonic()
                found["version"] = doc["version"]
                return

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_route_failing_its_probes_moves_the_split_within_two_seconds(upstreams, monitor, callbacks):
    m = monitor([70, 30, 0])
    m.wait_weights([70, 30, 0])
    cb = callbacks(ProbeokRouting(url=m.url))
    wait_for("the monitor's weights", 5, lambda: cb.current() is not None)
    router = make_router([deployment(u, r) for u, r in zip(upstreams, m.routes)])
    assert split(upstreams, router, 200)[2] == 0

    # r1 starts failing: the monitor's probes see it and its weight goes to 0.
    def moved(doc):
        w = {r["route"]: r["weight"] for r in doc["models"]["chat"]}
        return [w[r] for r in m.routes] == [0, 100, 0]

    found = {}
    upstreams[0].failing = True
    watch_feed(m.url, moved, found).join(timeout=60)
    assert "at" in found, "the monitor moved r1's weight to 0 within 60 s"

    def follows():
        for u in upstreams:
            u.take()
        asyncio.run(calls(router, 50, tolerate=True))
        c = [u.take() for u in upstreams]
        return c == [0, 50, 0]

    wait_for("LiteLLM follows 0/100/0", 2.0, follows, every=0)
    assert time.monotonic() - found["at"] < 2.0
    assert cb.current().version >= found["version"]
