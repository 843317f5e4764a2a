"""probeok-litellm: LiteLLM's router follows probeok's weights feed.

SDK::

    from probeok_litellm import ProbeokRouting
    litellm.callbacks = [ProbeokRouting(url="http://monitor:9400")]

Proxy (``config.yaml``)::

    litellm_settings:
      callbacks: probeok_litellm.probeok_callback

``probeok_callback`` is built on first access from ``PROBEOK_WEIGHTS_URL``,
``PROBEOK_WEIGHTS_TOKEN`` and ``PROBEOK_STALE_AFTER`` (seconds).
"""

from __future__ import annotations

import threading

from .callback import DEFAULT_STALE_AFTER, ProbeokRouting
from .feed import Snapshot

__all__ = ["ProbeokRouting", "Snapshot", "DEFAULT_STALE_AFTER", "probeok_callback"]

_instance = None
_instance_lock = threading.Lock()


def __getattr__(name: str):
    # Built lazily so importing the package starts no thread; the proxy's config loader reads
    # the attribute, which builds it once.
    global _instance
    if name == "probeok_callback":
        with _instance_lock:
            if _instance is None:
                _instance = ProbeokRouting()
            return _instance
    raise AttributeError(name)
