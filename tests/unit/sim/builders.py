"""Builders for tiny simulations whose outcome can be worked out by hand."""

from __future__ import annotations

from typing import Optional, Sequence

from dds.config import PoolSpec
from dds.sim.scenario import ClusterSpec, Scenario, Timing
from dds.sim.trace import Job
from dds.sim.workloads import GiB, gpu_group


def job(name: str, at: float, gpus: int = 1, cores: float = 1, duration: float = 100.0,
        model: Optional[str] = None) -> Job:
    return Job(name=name, arrival_s=at, duration_s=duration, milli_cpu=int(cores * 1000), memory=GiB, gpus=gpus,
               gpu_model=model)


def cluster(layout: Sequence[int], pool_gpus: int, *, cores: int = 8, max_gpus: int = 8,
            max_nodes: Optional[int] = None, gpu_idle_cooldown: float = 60.0,
            node_idle_cooldown: float = 600.0) -> ClusterSpec:
    group = gpu_group("workers", nodes=len(layout), max_nodes=max_nodes, cores=cores, memory=64 * GiB,
                      max_gpus=max_gpus, pool="pool-0", models=("A30",), gpu_idle_cooldown_s=gpu_idle_cooldown,
                      node_idle_cooldown_s=node_idle_cooldown)
    return ClusterSpec(groups=(group,), pools=(PoolSpec(name="pool-0", devices={"A30": pool_gpus}),),
                       initial_nodes={"workers": len(layout)}, preconfigured={"workers": tuple(layout)})


def scenario(cluster_spec: ClusterSpec, jobs: Sequence[Job], *, attach: float = 30.0, detach: float = 10.0,
             provision: float = 300.0, loop: float = 10.0) -> Scenario:
    return Scenario(name="tiny", description="hand-computed", cluster=cluster_spec, jobs=tuple(jobs),
                    timing=Timing(attach_s=attach, detach_s=detach, node_provision_s=provision, loop_interval_s=loop))
