"""Only the leader answers cluster-autoscaler: a standby replica answers UNAVAILABLE to every CloudProvider RPC.

Why not read-only answers from a standby: docs/operations.md ("What a standby answers CA") — TargetSize and NodeGroupNodes
from a replica that does not own the in-flight work would make CA ask twice or shrink a group it should not.
The health service is left alone here: `ProviderServer.set_serving` reflects leadership for probes.
"""

from __future__ import annotations

from typing import Any, Callable

import grpc

from dds.provider.server import SERVICE_NAME

_PREFIX = f"/{SERVICE_NAME}/"


class LeaderGate(grpc.ServerInterceptor):
    def __init__(self, is_leader: Callable[[], bool], leader_name: Callable[[], str]) -> None:
        self._is_leader = is_leader
        self._leader_name = leader_name

        def refuse(_request: Any, context: grpc.ServicerContext) -> None:
            holder = self._leader_name() or "unknown (no lease holder observed yet)"
            context.abort(grpc.StatusCode.UNAVAILABLE, f"not the leader; the leader is {holder}")

        # No deserializer: the request is never read, so even a malformed one gets the same clear answer.
        self._refusal = grpc.unary_unary_rpc_method_handler(refuse)

    def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Any],
                          handler_call_details: grpc.HandlerCallDetails) -> Any:
        if handler_call_details.method.startswith(_PREFIX) and not self._is_leader():
            return self._refusal
        return continuation(handler_call_details)
