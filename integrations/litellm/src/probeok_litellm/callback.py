"""The LiteLLM callback: follows probeok's weights and steers LiteLLM's router.

LiteLLM's ``Router`` calls every ``CustomLogger``'s ``async_filter_deployments`` with a model
group's deployments after its own filters (cooldowns, health checks) and before its routing
strategy picks one. That is where the weights apply: see :func:`probeok_litellm.pick.steer`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable, List, Optional

from litellm.integrations.custom_logger import CustomLogger

from .feed import Follower, Snapshot
from .pick import Picker, steer

log = logging.getLogger("probeok_litellm")

DEFAULT_STALE_AFTER = 120.0


class ProbeokRouting(CustomLogger):
    """Steers LiteLLM's router by probeok's route weights.

    ``url`` is the monitor's base URL (``http://monitor:9400``) or its feed URL, default
    ``PROBEOK_WEIGHTS_URL``; ``token`` is sent as a bearer token when the feed needs one,
    default ``PROBEOK_WEIGHTS_TOKEN``. When the feed has not been heard for ``stale_after``
    seconds the last weights stop applying and LiteLLM routes on its own, with one warning.
    """

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        stale_after: Optional[float] = None,
        start: bool = True,
        clock: Callable[[], float] = time.monotonic,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.url = url or os.environ.get("PROBEOK_WEIGHTS_URL") or None
        token = token or os.environ.get("PROBEOK_WEIGHTS_TOKEN") or None
        if stale_after is None:
            env = os.environ.get("PROBEOK_STALE_AFTER")
            stale_after = float(env) if env else DEFAULT_STALE_AFTER
        self.stale_after = float(stale_after)
        self._clock = clock
        self._picker = Picker()
        self._lock = threading.Lock()
        self._stale_warned = False
        self._started_at = clock()
        self.follower: Optional[Follower] = None
        if self.url is None:
            log.warning("probeok: no PROBEOK_WEIGHTS_URL; LiteLLM routes on its own")
            return
        self.follower = Follower(self.url, token=token, on_snapshot=self._on_snapshot, clock=clock)
        if start:
            self.follower.start()

    def close(self) -> None:
        """Stops following the feed (the thread is a daemon; this is for tests and reloads)."""
        if self.follower is not None:
            self.follower.stop()

    # --- state -----------------------------------------------------------------------------

    def _on_snapshot(self, snap: Snapshot) -> None:
        log.debug("probeok weights version %s", snap.version)

    def current(self) -> Optional[Snapshot]:
        """The weights in force now, or ``None`` when LiteLLM routes on its own."""
        f = self.follower
        if f is None:
            return None
        now = self._clock()
        # Never heard: staleness counts from start, so a monitor that was never reachable
        # gets its warning too.
        seen = f.last_seen if f.last_seen is not None else self._started_at
        if f.connected or now - seen <= self.stale_after:
            if f.snapshot is None:
                return None
            if self._stale_warned:
                with self._lock:
                    if self._stale_warned:
                        self._stale_warned = False
                        log.info("probeok: weights feed back; following it again")
            return f.snapshot
        with self._lock:
            if not self._stale_warned:
                self._stale_warned = True
                log.warning(
                    "probeok: weights feed %s unreachable for %.0fs (stale_after %.0fs); "
                    "LiteLLM routes on its own until it is back",
                    f.json_url,
                    now - seen,
                    self.stale_after,
                )
        return None

    # --- LiteLLM's hook --------------------------------------------------------------------

    async def async_filter_deployments(
        self,
        model: str,
        healthy_deployments: list,
        messages=None,
        request_kwargs: Optional[dict] = None,
        parent_otel_span=None,
    ) -> List[dict]:
        snap = self.current()
        if snap is None or not healthy_deployments:
            return healthy_deployments
        steered = steer(self._picker, model, healthy_deployments, snap.weights)
        return healthy_deployments if steered is None else steered
