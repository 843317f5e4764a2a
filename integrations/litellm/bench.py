"""Measures probeok-litellm against LiteLLM's Router on this machine.

    python integrations/litellm/bench.py [--calls 2000] [--versions 100] [--rounds 5]

- split: a feed of 70/30/0 over ``--calls`` Router calls to three real local upstreams; the
  calls the weight-0 deployment got and the largest deviation of a share from its weight;
- follow: ``--versions`` feed versions published one after another (over SSE); the time from a
  version's publication to the router's hook holding it, p50/p99;
- overhead: the hook alone per routing call (µs), and the mean latency of a Router call with
  the plugin against without it, interleaved in ``--rounds`` rounds in the same run;
- with ``PROBEOK_BIN`` naming a probeok binary, the same follow time against a real monitor
  whose route r1 fails its probes (from each version's ``generated_at``).

The feed is the tests' feed server (the monitor's wire format); the upstreams answer the
OpenAI chat-completions format on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
sys.path.insert(0, str(Path(__file__).parent / "tests"))

import litellm  # noqa: E402

from conftest import ROUTES, calls, deployment, make_router, split  # noqa: E402
from monitor import Monitor, binary  # noqa: E402
from probeok_litellm import ProbeokRouting  # noqa: E402
from servers import FeedServer, Upstream  # noqa: E402


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def wait_version(cb, v, limit=5.0):
    end = time.monotonic() + limit
    while True:
        s = cb.current()
        if s is not None and s.version >= v:
            return
        if time.monotonic() > end:
            raise SystemExit(f"version {v} not followed within {limit}s")
        time.sleep(0.0002)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--versions", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()

    ups = [Upstream(r) for r in ROUTES]
    feed = FeedServer("chat", dict(zip(ROUTES, [70, 30, 0])))
    cb = ProbeokRouting(url=feed.url)
    wait_version(cb, 1)
    litellm.callbacks = [cb]
    router = make_router([deployment(u, r) for u, r in zip(ups, ROUTES)])
    split(ups, router, 50)  # warm-up: clients, imports

    counts = split(ups, router, a.calls)
    shares = [c / a.calls for c in counts]
    dev = max(abs(s - w) for s, w in zip(shares, [0.7, 0.3, 0.0]))
    print(f"split over {a.calls} calls at 70/30/0: {counts}; weight-0 got {counts[2]}; "
          f"largest deviation {dev * 100:.2f} points")

    lags = []
    for i in range(a.versions):
        w = [0, 50, 50] if i % 2 == 0 else [70, 30, 0]
        v = feed.publish(dict(zip(ROUTES, w)))
        t = time.monotonic()
        wait_version(cb, v)
        lags.append((time.monotonic() - t) * 1000)
    print(f"feed version → router following, {a.versions} versions: p50 {pct(lags, 50):.2f} ms, "
          f"p99 {pct(lags, 99):.2f} ms, max {max(lags):.2f} ms")

    deps = router.get_model_list()
    n = 100_000

    async def hook_loop():
        t = time.perf_counter()
        for _ in range(n):
            await cb.async_filter_deployments("chat", deps, None)
        return (time.perf_counter() - t) / n * 1e6

    print(f"hook alone: {asyncio.run(hook_loop()):.2f} µs per routing call ({n} calls)")

    async def timed(k):
        t = time.perf_counter()
        await calls(router, k, concurrency=1)
        return (time.perf_counter() - t) / k * 1e6

    per = max(50, a.calls // (2 * a.rounds))
    with_p, without_p = [], []
    for _ in range(a.rounds):
        litellm.callbacks = [cb]
        with_p.append(asyncio.run(timed(per)))
        litellm.callbacks = []
        without_p.append(asyncio.run(timed(per)))
    mw, mo = statistics.median(with_p), statistics.median(without_p)
    print(f"Router call latency, sequential, median of {a.rounds} rounds of {per}: with the plugin "
          f"{mw:.0f} µs, without {mo:.0f} µs, difference {mw - mo:+.0f} µs")

    cb.close()
    feed.close()
    if binary() is not None:
        monitor_follow(ups, a.versions)
    for u in ups:
        u.close()


def monitor_follow(ups, versions: int) -> None:
    """The real monitor's versions while r1 fails its probes: from the version's
    ``generated_at`` (the monitor's clock, this machine's) to the hook holding it."""
    with tempfile.TemporaryDirectory() as d:
        m = Monitor(Path(d), ups, [70, 30, 0])
        try:
            m.wait_weights([70, 30, 0])
            cb = ProbeokRouting(url=m.url)
            wait_version(cb, 1)
            ups[0].failing = True
            lags, last = [], cb.current().version
            end = time.monotonic() + 120
            while len(lags) < min(versions, 20) and time.monotonic() < end:
                s = cb.current()
                if s is not None and s.version != last:
                    now = datetime.now(timezone.utc)
                    gen = datetime.fromisoformat(s.generated_at.replace("Z", "+00:00"))
                    lags.append((now - gen).total_seconds() * 1000)
                    last = s.version
                time.sleep(0.0002)
            ups[0].failing = False
            cb.close()
        finally:
            m.stop()
    if lags:
        print(f"real monitor (PROBEOK_BIN), {len(lags)} versions while a route fails: generated_at → "
              f"router following p50 {pct(lags, 50):.1f} ms, p99 {pct(lags, 99):.1f} ms, max {max(lags):.1f} ms")


if __name__ == "__main__":
    main()
