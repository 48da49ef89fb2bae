"""What the e2e tests read off a running stack to judge "no double action": the simulated fabric's stored state, DDS's
Events (with the replica that wrote them), the MachineSet and its nodes, what one DDS replica answers cluster-autoscaler,
and the reliability invariants (harness/invariants.py) with the exact counts a scenario expects.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional

import grpc
from kubernetes import client

from dds import certs
from dds.kube.configmap import DATA_KEY
from dds.provider.gen.externalgrpc import externalgrpc_pb2 as pb
from dds.provider.gen.externalgrpc import externalgrpc_pb2_grpc as pb_grpc
from harness.provider_client import load_cloud_config, open_channel
from harness.invariants import ClusterHistory, check_invariants
from harness.stack import DDS_NAMESPACE, Stack, gpus_allocatable, is_ready, pod

GROUP = "MachineSet/default/gpu-workers"
FABRIC_STATE_CONFIGMAP = "dds-simulated-fabric"


# --- the simulated fabric, as stored (the truth every replica and restart shares) ---

@dataclass(frozen=True)
class FabricFacts:
    devices: list[dict[str, Any]]
    operations: list[dict[str, Any]]

    def attached(self) -> dict[str, list[str]]:
        """node -> devices attached to it (any state but free)."""
        out: dict[str, list[str]] = {}
        for device in self.devices:
            if device.get("node"):
                out.setdefault(device["node"], []).append(device["id"])
        return out

    def attached_count(self) -> int:
        return sum(len(ids) for ids in self.attached().values())

    def running(self, kind: str = "attach") -> list[dict[str, Any]]:
        return [op for op in self.operations if op["kind"] == kind and op["state"] == "running"]


def fabric_facts(stack: Stack) -> FabricFacts:
    config_map = stack.core.read_namespaced_config_map(FABRIC_STATE_CONFIGMAP, DDS_NAMESPACE)
    document = json.loads((config_map.data or {})[DATA_KEY])
    return FabricFacts(devices=document.get("devices", []), operations=document.get("operations", []))


# --- DDS's Events ---

@dataclass(frozen=True)
class DdsEvent:
    uid: str
    reason: str
    involved: str  # kind/name
    message: str
    instance: str  # reportingInstance: which replica wrote it

    def line(self) -> str:
        return f"[{self.instance}] {self.involved} {self.reason}: {self.message}"


def dds_events(stack: Stack) -> list[DdsEvent]:
    out = []
    for event in stack.core.list_event_for_all_namespaces().items:
        if not event.source or event.source.component != "dds":
            continue
        involved = event.involved_object
        out.append(DdsEvent(event.metadata.uid, event.reason or "", f"{involved.kind.lower()}/{involved.name}",
                            event.message or "", event.reporting_instance or ""))
    return out


# --- the MachineSet and its nodes ---

def machineset_replicas(stack: Stack) -> int:
    obj = client.CustomObjectsApi(stack.api).get_namespaced_custom_object(
        "cluster.x-k8s.io", "v1beta2", "default", "machinesets", "gpu-workers")
    return int(obj["spec"]["replicas"])


def node_gpus(stack: Stack) -> dict[str, int]:
    return {n.metadata.name: gpus_allocatable(n) for n in stack.nodes()}


def pods_running(stack: Stack, names: list[str]) -> bool:
    pods = {p.metadata.name: p for p in stack.pods()}
    return all(n in pods and pods[n].status.phase == "Running" for n in names)


def describe(stack: Stack) -> str:
    pods = "; ".join(f"{p.metadata.name}: {p.status.phase} on {p.spec.node_name}" for p in stack.pods())
    nodes = "; ".join(f"{name}: {gpus} GPU(s)" for name, gpus in node_gpus(stack).items())
    return f"pods: {pods} | nodes: {nodes}"


def busy_workers(stack: Stack, memory_gib: int = 48, timeout: float = 150.0) -> None:
    """The stack's two workers Ready with their boot GPU, each taken by a pod (busy-0, busy-1) of `memory_gib`."""
    stack.wait_for("two Ready workers with their boot GPU",
                   lambda: len([n for n in stack.nodes() if is_ready(n) and gpus_allocatable(n) >= 1]) == 2,
                   timeout, lambda: describe(stack))
    for name in ("busy-0", "busy-1"):
        stack.core.create_namespaced_pod("demo", pod(name, memory_gib=memory_gib, gpus=1))
    stack.wait_for("busy pods Running", lambda: pods_running(stack, ["busy-0", "busy-1"]), timeout,
                   lambda: describe(stack))


# --- what DDS answers cluster-autoscaler ---

class ProviderClient:
    """A client of DDS's externalgrpc service with the autoscaler's own credentials, at any address (one replica)."""

    def __init__(self, stack: Stack, address: Optional[str] = None, timeout: float = 5.0) -> None:
        config = load_cloud_config(stack.tls_dir / certs.CLOUD_CONFIG)
        self._channel = open_channel(replace(config, address=address or config.address))
        self._stub = pb_grpc.CloudProviderStub(self._channel)
        self._timeout = timeout

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "ProviderClient":
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def node_groups(self) -> list[str]:
        return [g.id for g in self._stub.NodeGroups(pb.NodeGroupsRequest(), timeout=self._timeout).nodeGroups]

    def node_group_for_node(self, name: str, provider_id: str) -> str:
        """The group id DDS answers for the node ("" for none), as CA asks it every loop."""
        request = pb.NodeGroupForNodeRequest(node=pb.ExternalGrpcNode(name=name, providerID=provider_id))
        return self._stub.NodeGroupForNode(request, timeout=self._timeout).nodeGroup.id

    def refusal(self) -> Optional[tuple[grpc.StatusCode, str]]:
        """(code, details) when NodeGroups is refused, None when it is answered."""
        try:
            self.node_groups()
        except grpc.RpcError as exc:
            return exc.code(), exc.details() or ""
        return None


# --- no double action ---

def check_no_double_action(stack: Stack, *, expected_nodes: int, expected_attached: int,
                           history: Optional[ClusterHistory] = None) -> list[str]:
    """The reliability invariants at rest (harness/invariants.py: each device attached at most once, pool counts add
    up, every node shows the GPUs the fabric attached to it, CA's view converged, ...) and the exact counts the scenario
    expects: as many devices attached and nodes as the pods need, not one more. Empty: nothing wrong."""
    problems = [str(v) for v in check_invariants(stack, history=history, settled=True)]
    facts = fabric_facts(stack)
    if facts.attached_count() != expected_attached:
        problems.append(f"{facts.attached_count()} devices attached, expected {expected_attached}: {facts.attached()}")
    replicas, nodes = machineset_replicas(stack), len(stack.nodes())
    if not replicas == nodes == expected_nodes:
        problems.append(f"MachineSet replicas {replicas}, nodes {nodes}; expected {expected_nodes}")
    return problems


def log_lines(path: Path, text: str) -> list[str]:
    return [line for line in path.read_text(errors="replace").splitlines() if text in line]
