"""What Cluster API's own manager costs at bench-scale's size: `python -m tests.bench.scale_capi`.

On one real control plane (etcd, kube-apiserver, kube-scheduler, kwok) it runs Cluster API's manager as the e2e tests
do (harness/capi_stack.py: its CRDs, webhooks and RBAC, the harness's kwok infrastructure provider as the hardware)
and asks it for bench-scale's node group: one MachineSet of N Machines (default 5,000) on kwok hosts shaped as
bench-scale's nodes. It measures:

- `up_s`: the MachineSet created → every Machine Running with a nodeRef; `machine_p50_s`/`p90`/`p99`: per Machine,
  its creationTimestamp → first seen Running with a nodeRef (seen by a LIST every POLL_SECONDS, so to that
  resolution);
- `down_s`: replicas lowered by S (default 500) → S Machines and their Nodes gone;
- `idle_manager_cpu_per_min`, `idle_apiserver_cpu_per_min`: CPU seconds per minute over a quiet window holding N-S;
- `manager_cpu_s`, `manager_rss_mib` (VmHWM, the peak), `apiserver_cpu_s`, `etcd_cpu_s`, `harness_cpu_s` (this
  process: the kwok provider, the hardware's stand-in, and the LISTs that watch progress) over the scale-up.

The baseline, measured in the same run on the same plane once the manager is stopped: the harness's path, which
bench-scale takes today (tests/bench/scale.py `populate`) — the same N Nodes and N Machines written directly with the
status Cluster API would leave. Its `up_s`, `apiserver_cpu_s` and `etcd_cpu_s` give the ratios `capi/harness`.

A run past `--timeout-minutes` stops and prints what it reached (Machines Running so far). `--sets K` splits the
Machines over K MachineSets (Cluster API creates one MachineSet's Machines one after another, different MachineSets'
in parallel); `--manager-arg` passes a flag to the manager (e.g. `--kube-api-qps=…`; by default it runs as shipped).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Optional

from kubernetes import client

from harness import kwok_provider
from harness.capi_stack import cluster_api_on
from harness.controlplane import ControlPlane, ensure_binaries, start_control_plane
from tests.bench import scale

NAMESPACE = scale.NAMESPACE
BASELINE_NAMESPACE = "bench-direct"
CLUSTER = "bench"
GROUP = "cluster.x-k8s.io"
VERSION = "v1beta2"
POLL_SECONDS = 10.0
QUIET_SECONDS = 60.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
MANAGER = "cluster-api-manager"
APISERVER, ETCD = "kube-apiserver", "etcd"


# --- what a process costs ---

def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` (its threads included), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # fields 14 and 15 of proc(5), counted after the name


def status_mib(pid: int, key: str) -> float:
    for text in Path(f"/proc/{pid}/status").read_text().splitlines():
        if text.startswith(f"{key}:"):
            return int(text.split()[1]) / 1024
    return float("nan")


def self_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass
class CpuMeter:
    """CPU seconds spent by named processes (and this one) since `start()`."""

    pids: dict[str, int]
    _start: dict[str, float] = field(default_factory=dict)

    def start(self) -> "CpuMeter":
        self._start = {**{name: cpu_seconds(pid) for name, pid in self.pids.items()}, "harness": self_cpu_seconds()}
        return self

    def spent(self) -> dict[str, float]:
        now = {**{name: cpu_seconds(pid) for name, pid in self.pids.items()}, "harness": self_cpu_seconds()}
        return {name: now[name] - self._start[name] for name in self._start}


# --- Machines, as Cluster API reports them ---

def created_at(obj: dict[str, Any]) -> float:
    return datetime.fromisoformat(obj["metadata"]["creationTimestamp"].replace("Z", "+00:00")).timestamp()


def is_running(machine: dict[str, Any]) -> bool:
    status = machine.get("status") or {}
    return status.get("phase") == "Running" and bool((status.get("nodeRef") or {}).get("name"))


@dataclass
class Progress:
    """Machines first seen Running with a nodeRef, by name: when (wall clock) and how long after their creation."""

    seen: dict[str, float] = field(default_factory=dict)
    latency: dict[str, float] = field(default_factory=dict)

    def observe(self, machines: list[dict[str, Any]], now: float) -> None:
        for machine in machines:
            name = machine["metadata"]["name"]
            if name not in self.seen and is_running(machine):
                self.seen[name] = now
                self.latency[name] = now - created_at(machine)


def percentile(samples: list[float], q: float) -> float:
    return scale.percentile(samples, q) if samples else float("nan")


def ratio(numerator: float, denominator: float) -> str:
    return f"{numerator / denominator:.1f}x" if denominator > 0 else "n/a"


# --- the run ---

def list_machines(custom: client.CustomObjectsApi, namespace: str) -> list[dict[str, Any]]:
    response = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "machines", _preload_content=False)
    return json.loads(response.data)["items"]


def count_nodes(core: client.CoreV1Api) -> int:
    return len(json.loads(core.list_node(_preload_content=False).data)["items"])


def node_shape() -> dict[str, Any]:
    """bench-scale's node (tests/bench/scale.py node_body) as a KwokMachineTemplate's host shape."""
    body = scale.node_body(0)
    labels = {k: v for k, v in body["metadata"]["labels"].items() if k != "kubernetes.io/hostname"}
    return {"labels": labels, "capacity": body["status"]["capacity"]}


def set_names(sets: int) -> list[str]:
    return [scale.GROUP_NAME] if sets == 1 else [f"{scale.GROUP_NAME}-{k}" for k in range(sets)]


def split(total: int, parts: int) -> list[int]:
    """`total` in `parts` as even as can be, the larger parts first."""
    return [total // parts + (1 if k < total % parts else 0) for k in range(parts)]


def machineset(name: str, replicas: int) -> dict[str, Any]:
    """bench-scale's DDS group as Cluster API's manager gets it (v1beta2, on kwok hosts), named `name`."""
    obj = scale.machineset_body(scale.Size(replicas, replicas))
    obj["apiVersion"] = f"{GROUP}/{VERSION}"
    obj["metadata"]["name"] = name
    for labels in (obj["spec"]["selector"]["matchLabels"], obj["spec"]["template"]["metadata"]["labels"]):
        labels["cluster.x-k8s.io/set-name"] = name
    obj["spec"]["template"]["spec"]["clusterName"] = CLUSTER
    return kwok_provider.on_kwok_hosts(obj)


def wait(what: str, done: Callable[[], bool], deadline: float) -> bool:
    while not done():
        if time.monotonic() > deadline:
            scale.log(f"{what}: not reached before the run's bound")
            return False
        time.sleep(POLL_SECONDS)
    return True


def through_cluster_api(plane: ControlPlane, machines: int, scale_down: int, deadline: float, sets: int = 1,
                        manager_args: tuple[str, ...] = ()) -> dict[str, float]:
    api = scale.bulk_client(plane)
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    plane.create_namespace(NAMESPACE)
    capi = cluster_api_on(plane, manager_args=manager_args)
    scale.log(f"Cluster API {capi.version} manager running (pid {capi.manager.pid})")
    capi.workload_cluster(NAMESPACE, CLUSTER)
    names = set_names(sets)
    for name in names:
        kwok_provider.create_template(capi.api, kwok_provider.machine_template(NAMESPACE, name, node_shape()))
    meter = CpuMeter({MANAGER: capi.manager.pid, APISERVER: plane.pids()[APISERVER], ETCD: plane.pids()[ETCD]})
    meter.start()
    progress = Progress()
    started = time.monotonic()
    for name, replicas in zip(names, split(machines, sets)):
        custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "machinesets", machineset(name, replicas))
    last_log = 0.0

    def all_running() -> bool:
        nonlocal last_log
        progress.observe(list_machines(custom, NAMESPACE), time.time())
        if time.monotonic() - last_log > 60:
            last_log = time.monotonic()
            scale.log(f"{len(progress.seen)}/{machines} Machines Running with a nodeRef after "
                      f"{time.monotonic() - started:.0f}s; manager RSS {status_mib(capi.manager.pid, 'VmRSS'):.0f} MiB")
        return len(progress.seen) >= machines

    held = wait(f"{machines} Machines Running", all_running, deadline)
    spent = meter.spent()
    latencies = list(progress.latency.values())
    figures = {"machines_running": float(len(progress.seen)), "up_s": time.monotonic() - started,
               "machine_p50_s": percentile(latencies, 0.5), "machine_p90_s": percentile(latencies, 0.9),
               "machine_p99_s": percentile(latencies, 0.99),
               "manager_cpu_s": spent[MANAGER], "apiserver_cpu_s": spent[APISERVER], "etcd_cpu_s": spent[ETCD],
               "harness_cpu_s": spent["harness"], "manager_rss_mib": status_mib(capi.manager.pid, "VmHWM"),
               "apiserver_rss_mib": status_mib(plane.pids()[APISERVER], "VmRSS")}
    if not held:
        return figures
    target = machines - scale_down
    nodes_before = count_nodes(core)
    started = time.monotonic()
    for name, replicas in zip(names, split(target, sets)):
        custom.patch_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "machinesets", name,
                                              {"spec": {"replicas": replicas}})
    if wait(f"{scale_down} Machines and Nodes gone",
            lambda: len(list_machines(custom, NAMESPACE)) <= target and count_nodes(core) <= nodes_before - scale_down,
            deadline):
        figures["down_s"] = time.monotonic() - started
    quiet = CpuMeter({MANAGER: capi.manager.pid, APISERVER: plane.pids()[APISERVER]}).start()
    time.sleep(QUIET_SECONDS)
    idle = quiet.spent()
    figures["idle_manager_cpu_per_min"] = idle[MANAGER] * 60 / QUIET_SECONDS
    figures["idle_apiserver_cpu_per_min"] = idle[APISERVER] * 60 / QUIET_SECONDS
    figures["manager_rss_mib"] = status_mib(capi.manager.pid, "VmHWM")
    capi.provider.stop()
    capi.manager.stop()  # unregisters its webhooks: the baseline's v1beta2 writes need none
    return figures


def machine_v1beta2(i: int) -> dict[str, Any]:
    name = scale.node_name(i)
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Machine",
            "metadata": {"name": name, "namespace": BASELINE_NAMESPACE,
                         "labels": {"cluster.x-k8s.io/set-name": scale.GROUP_NAME}},
            "spec": {"clusterName": CLUSTER, "providerID": f"kwok://{name}",
                     "bootstrap": {"dataSecretName": kwok_provider.BOOTSTRAP_SECRET},
                     "infrastructureRef": kwok_provider.infrastructure_ref(name)}}


def through_harness(plane: ControlPlane, machines: int) -> dict[str, float]:
    """The baseline: the harness writes the Nodes and Machines itself, as bench-scale does today."""
    api = scale.bulk_client(plane)
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    plane.create_namespace(BASELINE_NAMESPACE)
    meter = CpuMeter({APISERVER: plane.pids()[APISERVER], ETCD: plane.pids()[ETCD]}).start()
    started = time.monotonic()
    offset = 100_000  # names apart from the Cluster API run's hosts
    scale.in_parallel(lambda i=i: core.create_node(scale.node_body(offset + i), _preload_content=False)
                      for i in range(machines))
    scale.in_parallel(lambda i=i: custom.create_namespaced_custom_object(
        GROUP, VERSION, BASELINE_NAMESPACE, "machines", machine_v1beta2(offset + i), _preload_content=False)
                      for i in range(machines))
    scale.in_parallel(lambda i=i: custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, BASELINE_NAMESPACE, "machines", scale.node_name(offset + i),
        {"status": {"phase": "Running", "nodeRef": {"name": scale.node_name(offset + i)}}}, _preload_content=False)
                      for i in range(machines))
    spent = meter.spent()
    return {"up_s": time.monotonic() - started, "apiserver_cpu_s": spent[APISERVER], "etcd_cpu_s": spent[ETCD],
            "harness_cpu_s": spent["harness"]}


CAPI_FIGURES = ("machines_running", "up_s", "machine_p50_s", "machine_p90_s", "machine_p99_s", "down_s",
                "manager_cpu_s", "manager_rss_mib", "apiserver_cpu_s", "apiserver_rss_mib", "etcd_cpu_s",
                "harness_cpu_s", "idle_manager_cpu_per_min", "idle_apiserver_cpu_per_min")


def report(machines: int, scale_down: int, version: str, capi: dict[str, float],
           harness: Optional[dict[str, float]], setup: str = "") -> list[str]:
    """The run's lines: Cluster API's figures, the baseline's, and the ratios of the two."""
    def fmt(figures: dict[str, float], names: tuple[str, ...]) -> str:
        return " ".join(f"{name}={figures[name]:.1f}" for name in names if name in figures)

    lines = [f"bench-scale-capi machines={machines} scale_down={scale_down} cluster-api={version} path=cluster-api "
             + (f"{setup} " if setup else "") + fmt(capi, CAPI_FIGURES)]
    if harness is not None:
        lines.append(f"bench-scale-capi machines={machines} path=harness "
                     + fmt(harness, ("up_s", "apiserver_cpu_s", "etcd_cpu_s", "harness_cpu_s")))
        lines.append(f"bench-scale-capi machines={machines} capi/harness "
                     + " ".join(f"{name}={ratio(capi[name], harness[name])}"
                                for name in ("up_s", "apiserver_cpu_s", "etcd_cpu_s")))
    return lines


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--machines", type=int, default=5000, help="Machines to ask for (default: %(default)s)")
    parser.add_argument("--scale-down", type=int, default=500, help="Machines to remove after (default: %(default)s)")
    parser.add_argument("--sets", type=int, default=1,
                        help="MachineSets the Machines are split in (default: %(default)s, bench-scale's one group)")
    parser.add_argument("--manager-arg", action="append", default=[], metavar="FLAG",
                        help="a flag for Cluster API's manager, e.g. --manager-arg=--kube-api-qps=500 (repeatable; "
                             "default: as shipped)")
    parser.add_argument("--timeout-minutes", type=float, default=25.0,
                        help="stop the Cluster API run there and report what it reached (default: %(default)s)")
    args = parser.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    bin_dir = ensure_binaries()
    workdir = Path(tempfile.mkdtemp(prefix=f"dds-bench-capi-{args.machines}-"))
    scale.log(f"machines={args.machines}: control plane in {workdir}")
    with start_control_plane(workdir / "cp", bin_dir=bin_dir) as plane:
        deadline = time.monotonic() + 60 * args.timeout_minutes
        capi = through_cluster_api(plane, args.machines, args.scale_down, deadline, args.sets,
                                   tuple(args.manager_arg))
        version = cluster_api_on(plane).version
        held = capi["machines_running"] >= args.machines
        harness = through_harness(plane, args.machines) if held else None
        setup = f"sets={args.sets} manager_args={','.join(args.manager_arg) or 'as-shipped'}"
        for text in report(args.machines, args.scale_down, version, capi, harness, setup):
            print(text, flush=True)
    shutil.rmtree(workdir / "cp" / "etcd", ignore_errors=True)  # hundreds of MiB at 5,000 Machines; logs stay
    return 0


if __name__ == "__main__":
    sys.exit(main())
