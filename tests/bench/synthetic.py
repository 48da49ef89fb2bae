"""Seeded synthetic snapshots for the cross-check tests and the benchmark: GPU clusters with a bit of everything the
simulation models (several groups, models and pools, taints, zones, cordoned and not-ready nodes, non-DDS nodes,
model selectors, node affinity, tolerations, host ports, anti-affinity). Same seed, same snapshot."""

from __future__ import annotations

import random
from dataclasses import dataclass

from dds.model.groups import NodeGroupSpec, SourceRef, Taint
from dds.model.resources import Resources
from dds.model.snapshot import (ContainerRequests, Device, HostPort, LabelSelector, NodeInfo, NodeSelectorTerm,
                                PodAffinityTerm, PodInfo, PoolInfo, SelectorRequirement, Snapshot, Toleration)

GiB = 2**30
GPU = "nvidia.com/gpu"
PRODUCT = "nvidia.com/gpu.product"
HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
MODELS = ("A100", "A30")
DEDICATED = Taint(key="dedicated", value="training", effect="NoSchedule")


@dataclass(frozen=True)
class Shape:
    nodes: int = 20
    pending: int = 10
    slots: int = 8  # max GPUs per node
    pools: int = 2
    pool_free: int = 0  # free devices per pool and model; 0 = about one per node
    constraints: bool = True  # taints, affinity, ports, anti-affinity: off for pure-throughput runs
    busy: bool = False  # every GPU in use and every pending pod wants GPUs: each one needs attaches or a node


def _groups(shape: Shape) -> tuple[NodeGroupSpec, ...]:
    source = SourceRef(kind="File", name="synthetic")
    return tuple(NodeGroupSpec(id=f"gpu-{p}", min_size=1, max_size=shape.nodes + 8, replicas=0, milli_cpu=32_000,
                               memory=256 * GiB, max_gpus_per_node=shape.slots, initial_gpus=0,
                               gpu_models=(MODELS[p % 2], MODELS[(p + 1) % 2]) if p % 3 else (),
                               fabric_pool=f"pool-{p}", labels={"pool": f"pool-{p}"}, source=source)
                 for p in range(shape.pools))


def random_snapshot(seed: int, shape: Shape = Shape()) -> Snapshot:
    rng = random.Random(seed)
    groups = _groups(shape)
    nodes: list[NodeInfo] = []
    pods: list[PodInfo] = []
    for i in range(shape.nodes):
        group = groups[i % len(groups)]
        name = f"node-{i:05d}"
        dds = not (shape.constraints and rng.random() < 0.05)
        gpus = rng.randint(0, shape.slots) if rng.random() < 0.8 else 0
        model = group.gpu_models[0] if group.gpu_models else rng.choice(MODELS)
        labels = {HOSTNAME: name, ZONE: f"zone-{i % 3}", "pool": group.fabric_pool}
        if gpus:
            labels[PRODUCT] = model
        devices = tuple(Device(f"{name}-d{j}", model, group.fabric_pool, float(j)) for j in range(gpus))
        taints = (DEDICATED,) if shape.constraints and rng.random() < 0.1 else ()
        nodes.append(NodeInfo(
            name=name, provider_id=f"synthetic://{name}", group_id=group.id if dds else None, labels=labels,
            taints=taints, unschedulable=shape.constraints and rng.random() < 0.03,
            ready=not (shape.constraints and rng.random() < 0.03),
            allocatable=Resources(32_000, 256 * GiB, 500 * GiB, 110, {GPU: gpus} if gpus else {}),
            devices=devices if dds else (), attaching=0))
        used_gpus = gpus if shape.busy or rng.random() < 0.7 else rng.randint(0, gpus)  # most GPUs are in use
        cpu_left, memory_left = 32_000, 256 * GiB
        for j in range(rng.randint(1 if shape.busy and gpus else 0, 4)):
            take_gpus = used_gpus if j == 0 else 0
            cpu = rng.choice((500, 1000, 4000, 8000))
            memory = rng.choice((1, 4, 16, 64)) * GiB
            if cpu > cpu_left or memory > memory_left:
                break
            cpu_left, memory_left = cpu_left - cpu, memory_left - memory
            pods.append(_pod(f"bound-{i}-{j}", rng, cpu, memory, take_gpus, node=name, shape=shape))
    for k in range(shape.pending):
        gpus = rng.choice((1, 1, 1, 2, 2, 4) if shape.busy else (0, 1, 1, 1, 2, 2, 4, shape.slots))
        pods.append(_pod(f"pending-{k:05d}", rng, rng.choice((500, 2000, 4000, 16000)),
                         rng.choice((1, 8, 32, 128)) * GiB, gpus, node=None, shape=shape, pending=True))
    free = shape.pool_free or max(1, shape.nodes // (2 * shape.pools))
    pools = tuple(PoolInfo(f"pool-{p}", {m: rng.randint(0, free) for m in MODELS}) for p in range(shape.pools))
    return Snapshot(now=10_000.0, nodes=tuple(nodes), pods=tuple(pods), groups=groups, pools=pools)


def _pod(name: str, rng: random.Random, cpu: int, memory: int, gpus: int, node, shape: Shape,
         pending: bool = False) -> PodInfo:
    requests = Resources(milli_cpu=cpu, memory=memory, scalar={GPU: gpus} if gpus else {})
    app = rng.choice(("train", "serve", "etl"))
    selector: dict[str, str] = {}
    affinity: tuple[NodeSelectorTerm, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    ports: tuple[HostPort, ...] = ()
    anti: tuple[PodAffinityTerm, ...] = ()
    init: tuple[ContainerRequests, ...] = ()
    if shape.constraints:
        if gpus and rng.random() < 0.3:
            selector[PRODUCT] = rng.choice(MODELS)
        if rng.random() < 0.15:
            affinity = (NodeSelectorTerm((SelectorRequirement(ZONE, rng.choice(("In", "NotIn")), ("zone-1",)),)),)
        if rng.random() < 0.2:
            tolerations = (Toleration(key="dedicated", operator="Exists"),)
        if pending and rng.random() < 0.05:
            ports = (HostPort(8080),)
        if pending and rng.random() < 0.05:
            anti = (PodAffinityTerm(LabelSelector({"app": app}), HOSTNAME),)
        if rng.random() < 0.1:
            init = (ContainerRequests(Resources(milli_cpu=cpu * 2, memory=memory)),
                    ContainerRequests(Resources(milli_cpu=100, memory=GiB // 4), restartable_init=True))
    return PodInfo(namespace="default", name=name, uid=f"uid-{name}", labels={"app": app},
                   containers=(ContainerRequests(requests),), init_containers=init, node_name=node,
                   node_selector=selector, required_node_affinity=affinity, tolerations=tolerations, host_ports=ports,
                   required_pod_anti_affinity=anti, priority=rng.choice((0, 0, 0, 100)), owner_kind="Job",
                   created_at=float(rng.randint(0, 1000)))
