"""The pure parts: reading a feed document, the feed's URLs, and the choice among deployments."""

import json

import pytest

from probeok_litellm.feed import FeedError, endpoints, parse
from probeok_litellm.pick import Picker, steer
from servers import feed_document


def dep(name, route=None):
    info = {"id": name}
    if route:
        info["probeok_route"] = route
    return {"model_name": "chat", "litellm_params": {"model": f"openai/{name}"}, "model_info": info}


def test_a_feed_document_reads_as_route_weights():
    doc = feed_document(7, "chat", {"p/r/a": 70, "p/r/b": 30, "p/r/c": 0})
    snap = parse(json.dumps(doc).encode())
    assert snap.version == 7
    assert snap.weights == {"p/r/a": 70, "p/r/b": 30, "p/r/c": 0}


@pytest.mark.parametrize("body", [b"", b"[]", b"{}", b'{"version":"x"}', b'{"version":1,"models":{"m":[{"route":"a"}]}}'])
def test_an_unreadable_document_is_an_error_not_a_crash(body):
    with pytest.raises(FeedError):
        parse(body)


def test_the_feed_urls_come_from_a_base_or_either_endpoint():
    want = ("http://m:9400/api/v1/weights", "http://m:9400/api/v1/weights/stream")
    for url in ["http://m:9400", "http://m:9400/", "http://m:9400/api/v1/weights",
                "http://m:9400/api/v1/weights/stream"]:
        assert endpoints(url) == want


def test_shares_are_exact_over_a_round_and_spread_out():
    deps = [dep("a", "r/a"), dep("b", "r/b"), dep("c", "r/c")]
    p = Picker()
    picks = [steer(p, "chat", deps, {"r/a": 70, "r/b": 30, "r/c": 0})[0]["model_info"]["id"] for _ in range(100)]
    assert picks.count("a") == 70 and picks.count("b") == 30 and "c" not in picks
    # Smooth: b never waits more than three picks in a row.
    assert "aaaa" not in "".join(picks)


def test_unmapped_and_unknown_routes_stay_for_litellm():
    p = Picker()
    only = [dep("x"), dep("y")]
    assert steer(p, "chat", only, {"r/a": 100}) is None
    mixed = [dep("a", "r/a"), dep("b", "r/b"), dep("x"), dep("u", "r/unknown")]
    out = steer(p, "chat", mixed, {"r/a": 100, "r/b": 0})
    assert [d["model_info"]["id"] for d in out] == ["a", "x", "u"]


def test_all_mapped_at_zero_leaves_the_list_whole():
    deps = [dep("a", "r/a"), dep("b", "r/b")]
    assert steer(Picker(), "chat", deps, {"r/a": 0, "r/b": 0}) is None
    # With an unmapped one left, that one is what remains.
    out = steer(Picker(), "chat", deps + [dep("x")], {"r/a": 0, "r/b": 0})
    assert [d["model_info"]["id"] for d in out] == ["x"]
