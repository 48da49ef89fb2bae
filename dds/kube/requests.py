"""Count the requests one ApiClient sends to the apiserver, by verb (LIST, WATCH, GET, ...).

`dds_apiserver_requests_total{verb}` is what the scale benchmark reads to show that DDS sends no LIST in steady state,
and what an operator alerts on if it ever does again. Counted at the client (the apiserver's own
apiserver_request_total does not say which client sent a request).
"""

from __future__ import annotations

import threading
from collections import Counter as Tally
from typing import Any, Mapping, Optional, Sequence
from urllib.parse import parse_qs, urlsplit

from kubernetes import client

from dds.metrics import APISERVER_REQUESTS as REQUESTS

_INSTRUMENTED = "_dds_requests_instrumented"


def verb_of(method: str, url: str, query: Optional[Sequence[tuple[str, Any]]] = None) -> str:
    """The apiserver's verb for a request: a GET of a collection is LIST (or WATCH with watch=true)."""
    method = method.upper()
    if method != "GET":
        return {"POST": "CREATE", "PUT": "UPDATE", "PATCH": "PATCH", "DELETE": "DELETE"}.get(method, method)
    parts = urlsplit(url)
    params = {k: str(v) for k, v in (query or ())}
    params.update({k: v[-1] for k, v in parse_qs(parts.query).items()})
    if params.get("watch") in ("true", "1", "True"):
        return "WATCH"
    return "LIST" if _is_collection(parts.path) else "GET"


def _is_collection(path: str) -> bool:
    segments = [s for s in path.split("/") if s]
    if segments[:1] == ["api"] and len(segments) >= 2:
        rest = segments[2:]
    elif segments[:1] == ["apis"] and len(segments) >= 3:
        rest = segments[3:]
    else:
        return False  # /version, /healthz, discovery
    if not rest:
        return False  # discovery of a group version
    if rest[0] == "namespaces" and len(rest) >= 3:
        rest = rest[2:]
    return len(rest) == 1


class RequestCounts:
    """Per-verb counts for one client (the process-wide Prometheus counter sums every client)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Tally[str] = Tally()

    def add(self, verb: str) -> None:
        with self._lock:
            self._counts[verb] += 1

    def snapshot(self) -> Mapping[str, int]:
        with self._lock:
            return dict(self._counts)


def instrument(api: client.ApiClient, counts: Optional[RequestCounts] = None) -> RequestCounts:
    """Count every request `api` sends from now on (idempotent: a client is wrapped once)."""
    rest = api.rest_client
    existing = getattr(rest, _INSTRUMENTED, None)
    if existing is not None:
        return existing
    counts = counts or RequestCounts()
    send = rest.request

    def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        # kubernetes < 35 passes the query as query_params=..., newer clients put it in the URL
        verb = verb_of(method, url, kwargs.get("query_params"))
        REQUESTS.labels(verb).inc()
        counts.add(verb)
        return send(method, url, *args, **kwargs)

    rest.request = request
    setattr(rest, _INSTRUMENTED, counts)
    return counts
