"""LiteLLM's Router with three deployments of one model group, following a feed."""

import asyncio
import logging
import time

from conftest import ROUTES, calls, deployment, make_router, split, wait_for, within
from probeok_litellm import ProbeokRouting

# The 2,000-call split against the real monitor is in test_monitor.py.
N = 600


def following(cb, version):
    return lambda: cb.current() is not None and cb.current().version == version


def test_weight_zero_gets_no_calls_and_the_rest_split_by_weight(upstreams, feed, callbacks):
    f = feed(dict(zip(ROUTES, [70, 30, 0])))
    cb = callbacks(ProbeokRouting(url=f.url))
    wait_for("the first weights", 5, following(cb, 1))
    router = make_router([deployment(u, r) for u, r in zip(upstreams, ROUTES)])
    counts = split(upstreams, router, N)
    assert counts[2] == 0, counts
    assert within(counts, [0.7, 0.3, 0.0]), counts
    # It came over the stream.
    assert f.stream_requests and cb.follower.mode == "stream"


def test_a_new_version_changes_the_split_within_two_seconds(upstreams, feed, callbacks):
    f = feed(dict(zip(ROUTES, [70, 30, 0])))
    cb = callbacks(ProbeokRouting(url=f.url))
    wait_for("the first weights", 5, following(cb, 1))
    router = make_router([deployment(u, r) for u, r in zip(upstreams, ROUTES)])
    assert split(upstreams, router, 200)[2] == 0

    v = f.publish(dict(zip(ROUTES, [0, 50, 50])))
    published = time.monotonic()
    # The hook reads the weights on every call: once it holds version v, every call follows it.
    wait_for("the router on the new version", 2.0, following(cb, v), every=0.001)
    assert time.monotonic() - published < 2.0
    # The very next calls take turns between the two routes now at 50.
    assert split(upstreams, router, 100) == [0, 50, 50]
    counts = split(upstreams, router, 400)
    assert counts[0] == 0 and within(counts, [0.0, 0.5, 0.5]), counts
    # The new version came over the stream already open.
    assert len(f.stream_requests) == 1


def test_reconnect_sends_last_event_id(upstreams, feed, callbacks):
    f = feed(dict(zip(ROUTES, [70, 30, 0])))
    cb = callbacks(ProbeokRouting(url=f.url))
    wait_for("the first weights", 5, following(cb, 1))
    # Break the open stream: the follower reconnects saying which version it holds.
    conn = cb.follower._conn
    conn.sock.shutdown(2)
    wait_for("a second stream request", 10, lambda: len(f.stream_requests) >= 2)
    assert f.stream_requests[0] is None
    assert f.stream_requests[1] == "1"
    f.publish(dict(zip(ROUTES, [0, 50, 50])))
    wait_for("version 2 after the reconnect", 5, following(cb, 2))


def test_feed_gone_beyond_stale_after_litellm_routes_on_its_own_with_one_warning(
    upstreams, feed, callbacks, caplog
):
    caplog.set_level(logging.INFO, logger="probeok_litellm")
    f = feed(dict(zip(ROUTES, [70, 30, 0])))
    cb = callbacks(ProbeokRouting(url=f.url, stale_after=2.0))
    wait_for("the first weights", 5, following(cb, 1))
    router = make_router([deployment(u, r) for u, r in zip(upstreams, ROUTES)])
    assert split(upstreams, router, 200)[2] == 0

    f.close()
    gone = time.monotonic()
    wait_for("the broken stream noticed", 5, lambda: not cb.follower.connected)
    # Until stale_after the last weights stay in force.
    c = split(upstreams, router, 50)
    if time.monotonic() - gone < 2.0:
        assert c[2] == 0, c

    # Then LiteLLM's own simple-shuffle spreads calls over all three again.
    wait_for("the feed counted stale", 10, lambda: cb.current() is None)
    counts = split(upstreams, router, 300)
    assert all(c > 50 for c in counts), counts
    warnings = [r for r in caplog.records if r.name == "probeok_litellm" and r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "unreachable" in warnings[0].getMessage()


def test_without_the_stream_the_long_poll_follows(upstreams, feed, callbacks):
    f = feed(dict(zip(ROUTES, [70, 30, 0])), stream=False)
    cb = callbacks(ProbeokRouting(url=f.url))
    wait_for("the first weights", 5, following(cb, 1))
    assert cb.follower.mode == "long-poll"
    router = make_router([deployment(u, r) for u, r in zip(upstreams, ROUTES)])
    counts = split(upstreams, router, 400)
    assert counts[2] == 0 and within(counts, [0.7, 0.3, 0.0]), counts

    f.publish(dict(zip(ROUTES, [0, 50, 50])))
    published = time.monotonic()
    wait_for("version 2 by long-poll", 2.0, following(cb, 2))
    assert time.monotonic() - published < 2.0
    counts = split(upstreams, router, 400)
    assert counts[0] == 0 and within(counts, [0.0, 0.5, 0.5]), counts
    # It asked with the version it held and was held until the new one.
    assert '"1"' in f.poll_requests


def test_deployments_without_a_route_are_left_to_litellm(upstreams, feed, callbacks):
    f = feed(dict(zip(ROUTES, [100, 0, 0])))
    cb = callbacks(ProbeokRouting(url=f.url))
    wait_for("the first weights", 5, following(cb, 1))
    # No deployment names a route: LiteLLM's weighted shuffle alone decides (its `weight`).
    router = make_router([deployment(u, None, weight=w) for u, w in zip(upstreams, [1, 1, 2])])
    counts = split(upstreams, router, 600)
    assert within(counts, [0.25, 0.25, 0.5], tol=0.08), counts

    # Mixed: the mapped weight-0 one gets nothing; the unmapped one still gets LiteLLM's share.
    router = make_router([deployment(upstreams[0], ROUTES[0]), deployment(upstreams[1], ROUTES[1]),
                          deployment(upstreams[2], None)])
    counts = split(upstreams, router, 600)
    assert counts[1] == 0, counts
    assert within(counts, [0.5, 0.0, 0.5], tol=0.08), counts


def test_without_a_url_litellm_routes_on_its_own(upstreams, callbacks, monkeypatch):
    monkeypatch.delenv("PROBEOK_WEIGHTS_URL", raising=False)
    cb = callbacks(ProbeokRouting())
    assert cb.follower is None
    router = make_router([deployment(u, r) for u, r in zip(upstreams, ROUTES)])
    counts = split(upstreams, router, 300)
    assert all(c > 30 for c in counts), counts
    asyncio.run(calls(router, 1))


class ManualClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_a_monitor_never_reached_gets_one_warning_after_stale_after(callbacks, caplog):
    caplog.set_level(logging.INFO, logger="probeok_litellm")
    clock = ManualClock()
    # Port 9 on loopback: nothing listens, every connection is refused.
    cb = callbacks(ProbeokRouting(url="http://127.0.0.1:9", stale_after=5.0, clock=clock))
    assert cb.current() is None
    clock.now += 4.9
    assert cb.current() is None
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    clock.now += 0.2
    for _ in range(3):
        assert cb.current() is None
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "unreachable" in warnings[0].getMessage()


def test_the_token_goes_as_a_bearer_and_is_never_logged(feed, callbacks, caplog, monkeypatch):
    caplog.set_level(logging.DEBUG, logger="probeok_litellm")
    secret = "feed-secret-7d1c"
    f = feed(dict(zip(ROUTES, [70, 30, 0])), token=secret)
    # Without it the feed refuses and nothing is followed.
    monkeypatch.delenv("PROBEOK_WEIGHTS_TOKEN", raising=False)
    cb = callbacks(ProbeokRouting(url=f.url))
    wait_for("a refusal", 5, lambda: f.refused > 0)
    assert cb.current() is None
    cb.close()
    # From the argument, and from PROBEOK_WEIGHTS_TOKEN.
    cb = callbacks(ProbeokRouting(url=f.url, token=secret))
    wait_for("the weights with the token", 5, following(cb, 1))
    monkeypatch.setenv("PROBEOK_WEIGHTS_TOKEN", secret)
    cb = callbacks(ProbeokRouting(url=f.url))
    wait_for("the weights with the token from the environment", 5, following(cb, 1))
    assert all(secret not in r.getMessage() for r in caplog.records)
