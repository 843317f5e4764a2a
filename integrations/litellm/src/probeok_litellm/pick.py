"""Choosing among a model group's deployments by route weight (pure, no I/O).

Smooth weighted round-robin (nginx's): every pick adds each candidate's weight to its running
score, takes the highest, and subtracts the total from it. Over any window of ``sum(weights)``
picks each candidate gets exactly its weight, and picks are spread evenly rather than in runs,
so a split holds on small samples and a new set of weights shows at once.
"""

from __future__ import annotations

import threading
from typing import Dict, List, Mapping, Optional, Sequence, Tuple


def route_of(deployment: Mapping) -> Optional[str]:
    """The probeok route a deployment declares in ``model_info.probeok_route``."""
    info = deployment.get("model_info") or {}
    route = info.get("probeok_route") if isinstance(info, Mapping) else None
    return route if isinstance(route, str) and route else None


def deployment_id(deployment: Mapping, index: int) -> str:
    info = deployment.get("model_info") or {}
    did = info.get("id") if isinstance(info, Mapping) else None
    return str(did) if did is not None else f"#{index}"


class Picker:
    """Running scores per model group; safe to call from several threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # model group → (the weights the scores were built on, scores by deployment id)
        self._scores: Dict[str, Tuple[Tuple[Tuple[str, int], ...], Dict[str, int]]] = {}

    def choose(self, group: str, candidates: Sequence[Tuple[str, int]]) -> str:
        """One id among ``candidates`` (id, weight > 0)."""
        key = tuple(sorted(candidates))
        total = sum(w for _, w in candidates)
        with self._lock:
            built, scores = self._scores.get(group, ((), {}))
            if built != key:
                # New weights or a new set of deployments: start the rotation afresh.
                scores = {did: 0 for did, _ in candidates}
                self._scores[group] = (key, scores)
            best, best_score = None, None
            for did, w in candidates:
                s = scores[did] + w
                scores[did] = s
                if best_score is None or s > best_score:
                    best, best_score = did, s
            scores[best] -= total
            return best


def steer(
    picker: Picker,
    group: str,
    deployments: Sequence[Mapping],
    weights: Mapping[str, int],
) -> Optional[List[Mapping]]:
    """The deployments LiteLLM should choose among, or ``None`` to leave the list as it is.

    Mapped deployments (a ``probeok_route`` the feed knows) with weight 0 are dropped and the
    others narrowed to the one whose turn it is; deployments without a route, or with a route
    the feed does not name, stay for LiteLLM. When every mapped deployment is at weight 0 and
    nothing else is left, the list stays as it is: LiteLLM tries them rather than failing the
    call outright.
    """
    mapped: List[Tuple[str, int, Mapping]] = []
    others: List[Mapping] = []
    for i, d in enumerate(deployments):
        route = route_of(d)
        if route is None or route not in weights:
            others.append(d)
        else:
            mapped.append((deployment_id(d, i), weights[route], d))
    if not mapped:
        return None
    live = [(did, w, d) for did, w, d in mapped if w > 0]
    if not live:
        return list(others) if others else None
    chosen = picker.choose(group, [(did, w) for did, w, _ in live])
    return [d for did, _, d in live if did == chosen][:1] + list(others)
