import asyncio
import os
import time

# LiteLLM reads this at import: its bundled model cost map, no network.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm  # noqa: E402
import pytest  # noqa: E402

from servers import FeedServer, Upstream  # noqa: E402

MODEL = "chat"
ROUTES = ["sim/r1/a", "sim/r2/b", "sim/r3/c"]


@pytest.fixture
def upstreams():
    ups = [Upstream(r) for r in ROUTES]
    yield ups
    for u in ups:
        u.close()


@pytest.fixture
def callbacks():
    """LiteLLM's callbacks are process-wide: each test installs its own and they go after."""
    installed = []

    def install(cb):
        installed.append(cb)
        litellm.callbacks = [cb]
        return cb

    yield install
    litellm.callbacks = []
    for cb in installed:
        cb.close()


def deployment(up: Upstream, route=None, weight=None) -> dict:
    params = {"model": "openai/sim-model", "api_base": up.base_url, "api_key": "sk-test"}
    if weight is not None:
        params["weight"] = weight
    info = {"id": up.name}
    if route is not None:
        info["probeok_route"] = route
    return {"model_name": MODEL, "litellm_params": params, "model_info": info}


def make_router(deployments):
    return litellm.Router(model_list=deployments, num_retries=0, routing_strategy="simple-shuffle")


async def calls(router, n: int, concurrency: int = 32, model: str = MODEL, tolerate: bool = False) -> int:
    """``n`` calls through the router; the number that failed (only when ``tolerate``)."""
    sem = asyncio.Semaphore(concurrency)
    failed = 0

    async def one():
        nonlocal failed
        async with sem:
            try:
                r = await router.acompletion(model=model, messages=[{"role": "user", "content": "hi"}])
            except Exception:
                if not tolerate:
                    raise
                failed += 1
                return
            assert r.choices[0].message.content == "PROBE_OK"

    await asyncio.gather(*(one() for _ in range(n)))
    return failed


def split(ups, router, n: int):
    """Calls each upstream answered out of ``n`` router calls."""
    for u in ups:
        u.take()
    asyncio.run(calls(router, n))
    return [u.take() for u in ups]


def within(counts, shares, tol=0.05):
    total = sum(counts)
    return total > 0 and all(abs(c / total - s) <= tol for c, s in zip(counts, shares))


def wait_for(what: str, deadline_s: float, f, every: float = 0.02):
    end = time.monotonic() + deadline_s
    while True:
        v = f()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"{what} within {deadline_s}s")
        time.sleep(every)


@pytest.fixture
def feed():
    servers = []

    def start(weights, **kw):
        s = FeedServer(MODEL, weights, **kw)
        servers.append(s)
        return s

    yield start
    for s in servers:
        if not s.closed:
            s.close()
