"""The LiteLLM proxy process with ``litellm_settings.callbacks: probeok_litellm.probeok_callback``,
called with the official openai SDK."""

import os
import secrets
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

from conftest import MODEL, ROUTES, wait_for, within
from monitor import Monitor, binary, free_port


def config_yaml(upstreams, routes) -> str:
    lines = ["model_list:"]
    for u, r in zip(upstreams, routes):
        lines += [
            f"  - model_name: {MODEL}",
            "    litellm_params:",
            "      model: openai/sim-model",
            f"      api_base: {u.base_url}",
            "      api_key: sk-upstream",
            "    model_info:",
            f"      id: {u.name.replace('/', '-')}",
            f"      probeok_route: {r}",
        ]
    lines += [
        "litellm_settings:",
        "  callbacks: probeok_litellm.probeok_callback",
        "router_settings:",
        "  routing_strategy: simple-shuffle",
        "  num_retries: 0",
    ]
    return "\n".join(lines) + "\n"


@pytest.fixture
def feed_url(tmp_path, upstreams, feed):
    """The real monitor when there is one, else a feed server with its wire format."""
    if binary() is not None:
        m = Monitor(tmp_path, upstreams, [70, 30, 0])
        m.wait_weights([70, 30, 0])
        yield m.url, m.routes
        m.stop()
    else:
        f = feed(dict(zip(ROUTES, [70, 30, 0])))
        yield f.url, ROUTES


def test_the_proxy_follows_the_weights(tmp_path: Path, upstreams, feed_url):
    url, routes = feed_url
    config = tmp_path / "config.yaml"
    config.write_text(config_yaml(upstreams, routes))
    port = free_port()
    master_key = "sk-" + secrets.token_hex(32)
    env = dict(os.environ, PROBEOK_WEIGHTS_URL=url, LITELLM_LOCAL_MODEL_COST_MAP="True",
               LITELLM_MASTER_KEY=master_key)
    env.pop("PROBEOK_WEIGHTS_TOKEN", None)
    litellm_bin = Path(sys.executable).parent / "litellm"
    log = tmp_path / "litellm.log"
    proc = subprocess.Popen(
        [str(litellm_bin), "--config", str(config), "--port", str(port), "--host", "127.0.0.1"],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=master_key, max_retries=0,
                               timeout=10)

        def ready():
            if proc.poll() is not None:
                raise AssertionError(f"litellm exited: {log.read_text()[-3000:]}")
            try:
                client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
                return True
            except openai.APIConnectionError:
                return False

        wait_for("the LiteLLM proxy answers", 90, ready, every=0.5)

        def one(_):
            r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
            return r.choices[0].message.content

        def weights_in_force():
            for u in upstreams:
                u.take()
            with ThreadPoolExecutor(8) as pool:
                answers = list(pool.map(one, range(100)))
            assert answers == ["PROBE_OK"] * 100
            c = [u.take() for u in upstreams]
            return c[2] == 0 and c

        wait_for("the proxy routes by the weights", 20, weights_in_force, every=0.2)
        for u in upstreams:
            u.take()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(one, range(400)))
        counts = [u.take() for u in upstreams]
        assert counts[2] == 0, counts
        assert within(counts, [0.7, 0.3, 0.0]), counts
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
