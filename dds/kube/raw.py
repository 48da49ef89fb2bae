"""Requests whose answers DDS reads raw, or not at all: the watch cache's LISTs and WATCHes, and Event writes.

The kubernetes client's typed calls validate their arguments and build model objects for every request and answer:
about 2.7 ms of CPU per Event written, against 0.6 ms for the same POST sent as it is (measured on the 5,000-node
benchmark cluster). A burst of 500 pods placed in one IncreaseSize writes 667 Events, and the interpreter those
costs take is the one CA's next calls wait for. The request still goes through the client's REST layer, so its
authentication, TLS and DDS's request counter (dds/kube/requests.py) are the same as every other request's.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from kubernetes import client

CONNECT_TIMEOUT_SECONDS = 10.0


def send(api: client.ApiClient, method: str, path: str, *, query: Sequence[tuple[str, Any]] = (),
         body: Optional[dict] = None, read_timeout: float = 60.0) -> Any:
    """`method` on `path`, answered as the raw urllib3 response, its body not read yet (a WATCH reads it as it
    arrives): nothing decoded, and on kubernetes >= 35 nothing raised for an error status (the caller reads
    `status`)."""
    timeout = (CONNECT_TIMEOUT_SECONDS, read_timeout)
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    if hasattr(api, "param_serialize"):  # kubernetes >= 35: call_api never decodes, never raises
        method, url, headers, _, _ = api.param_serialize(method, path, query_params=list(query),
                                                         header_params=headers, auth_settings=["BearerToken"])
        return api.call_api(method, url, header_params=headers, body=body, _request_timeout=timeout).response
    return api.call_api(path, method, query_params=list(query), header_params=headers, body=body,
                        auth_settings=["BearerToken"], _preload_content=False, _return_http_data_only=True,
                        _request_timeout=timeout)
