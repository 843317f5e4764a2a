"""A real probeok monitor (``probeok serve``) for the tests, from ``PROBEOK_BIN``.

Three routes of provider ``sim`` in regions r1–r3, each region's ``base_url`` one of the test's
upstreams, all serving one model; the configured weights give the feed's split, and an upstream
that starts failing its probes takes its route's weight to 0.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import List, Optional

MODEL = "chat"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def binary() -> Optional[str]:
    b = os.environ.get("PROBEOK_BIN")
    return b if b and os.access(b, os.X_OK) else None


class Monitor:
    def __init__(self, workdir: Path, upstreams, weights: List[int]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.routes = [f"sim/r{i + 1}/sim-model" for i in range(len(upstreams))]
        (workdir / "no-sets").mkdir(exist_ok=True)
        regions = "".join(
            f'\n  [[provider.region]]\n  id = "r{i + 1}"\n  base_url = "{u.base_url}"\n'
            for i, u in enumerate(upstreams)
        )
        routes = "".join(
            f'\n[[route]]\nprovider = "sim"\nregion = "r{i + 1}"\nmodel = "sim-model"\n'
            f'serves = "{MODEL}"\nweight = {w}\n'
            for i, w in enumerate(weights)
        )
        config = workdir / "probeok.toml"
        config.write_text(
            f"""
[server]
listen = "127.0.0.1:{self.port}"

[storage]
path = "{workdir / 'probeok.db'}"

[probe]
interval = "500ms"
timeout = "450ms"
first_byte_timeout = "400ms"
throughput_every = "1h"
jitter = 0.0

[detection]
min_samples = 3
degraded_after = 2
recover_after = "1s"
error_window = "10s"

[drift]
sets = "{workdir / 'no-sets'}"

[[provider]]
id = "sim"
kind = "openai"
{regions}
{routes}"""
        )
        self.log = workdir / "probeok.log"
        env = {k: v for k, v in os.environ.items() if k != "PROBEOK_CONFIG"}
        env["RUST_LOG"] = "info"
        self.proc = subprocess.Popen(
            [binary(), "serve", "--config", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(self.log, "wb"),
            env=env,
        )

    def weights(self) -> Optional[dict]:
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/weights", timeout=2) as r:
                doc = json.load(r)
        except OSError:
            return None
        return {r["route"]: r["weight"] for r in doc["models"].get(MODEL, [])} | {"version": doc["version"]}

    def wait_weights(self, expected: List[int], deadline_s: float = 60) -> int:
        """Polls the feed until it gives the routes these weights; its version."""
        end = time.monotonic() + deadline_s
        while True:
            w = self.weights()
            if w is not None and [w.get(r) for r in self.routes] == expected:
                return w["version"]
            if self.proc.poll() is not None:
                raise AssertionError(f"probeok exited: {self.log.read_text()[-2000:]}")
            if time.monotonic() > end:
                raise AssertionError(f"feed weights {expected} within {deadline_s}s, last {w}")
            time.sleep(0.1)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
