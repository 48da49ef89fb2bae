"""`make bench-scale`: DDS at production scale on the real control plane, through a real gRPC channel.

For each size (default 1,000 nodes / 10,000 pods, then 5,000 / 50,000): etcd, kube-apiserver, kube-scheduler and kwok as
local processes; one MachineSet group whose Machines own every kwok node; 99 % of the pods bound (one GPU pod per node, so
no GPU is free) and 1 % pending asking one GPU each, which the scheduler marks Unschedulable. Then DDS runs as a process
(`dds serve`, mutual TLS, simulated fabric) twice on the same cluster: with the watch cache (`watch`) and with a LIST per
decision (`list`, DDS_WATCH_CACHE=false: the path before the cache), and each run prints one line:

    bench-scale nodes=N pods=M mode=watch sync_s=… increase_p50_ms=… increase_p99_ms=… loop_p50_ms=… loop_p99_ms=…
                plan_cli_s=… rss_mib=… lists_per_min=… requests_per_min=…

then the ratio list/watch per figure and the goals (docs/scale.md) as `ok` / `MISSED` for the watch run.

What the figures mean: sync_s is `dds serve` start to /readyz (the first LIST of every watched kind included);
increase_* is NodeGroupIncreaseSize(delta=1) timed at the client; loop_* are quantiles of
dds_control_loop_duration_seconds (interpolated in its buckets); plan_cli_s is `dds plan --kubeconfig` end to end
(a new Python process); rss_mib is DDS's VmRSS after the run; lists_per_min and requests_per_min are
dds_apiserver_requests_total deltas over a quiet window (no gRPC calls, the control loop running every 2 s).
What they leave out: attaches never finish here (the fabric's latency is a day) so each IncreaseSize plans the same
pending pods and finds them covered by the attaches in flight; no cluster-autoscaler runs (its calls are made by this
harness, sequentially): tests/bench/scale_ca.py runs the real one on the same cluster (`make bench-scale` runs both).
Nor does Cluster API's manager: the MachineSet, Machines and Nodes are written here as it would leave them, because it
did not hold 5,000 Machines on the 2-core machine (tests/bench/scale_capi.py measures what it costs; each run says so).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import yaml
from kubernetes import client

from dds import certs
from dds.model.groups import LABEL_ATTACHED_GPU
from harness.controlplane import KWOK_NODE_ANNOTATION, ControlPlane, ensure_binaries, free_ports, start_control_plane
from harness.provider_client import CloudConfig, ExternalGrpcClient, ProviderError, open_channel
from harness.stack import DdsProcess, start_dds

NAMESPACE = "bench"
# Each run keeps its fabric state and instances in a namespace of its own: attaches the first run left in flight (their
# latency is a day) would otherwise be the second run's orphans to reclaim, work the first run never had.
DDS_NAMESPACES = {"list": "dds-list", "watch": "dds-watch"}
GROUP_NAME = "gpu-workers"
GROUP_ID = f"MachineSet/{NAMESPACE}/{GROUP_NAME}"
GPU = "nvidia.com/gpu"
PENDING_FRACTION = 0.01
LOOP_INTERVAL_SECONDS = 2.0
# The LIST-per-call baseline at 5,000 nodes keeps its process busy decoding for tens of seconds at a time; /metrics
# answers when it gets the interpreter back.
METRICS_TIMEOUT_SECONDS = 120.0
CA_DEADLINE_SECONDS = 5.0  # cluster-autoscaler's externalgrpc default grpc_timeout
WORKERS = 12  # parallel creates while populating

# Why the Cluster API objects are the harness's (docs/scale.md "Cluster API's manager at 5,000 Machines"), as
# tests/bench/scale_capi.py measured it; that benchmark measures it again.
CLUSTER_API_AT_5000 = ("as shipped, Cluster API v1.14.2's manager did not hold 5,000 Machines on the 2-core machine: "
                       "2,679 of 5,000 Running with a nodeRef after the 25 min bound, its creation rate falling from "
                       "~290 to ~50 Machines a minute (manager 206 s CPU, 357 MiB peak RSS; kube-apiserver 846 s CPU), "
                       "measured 2026-11-29 by `python -m tests.bench.scale_capi`")

# Goals (benchmark only, never asserted in tests): (figure, size) -> bound.
GOALS: dict[tuple[str, int], float] = {
    ("increase_p99_ms", 1000): 100.0,
    ("increase_p99_ms", 5000): 500.0,
    ("loop_p99_ms", 5000): 1000.0,
    ("rss_mib", 5000): 1536.0,
    ("lists_per_min", 1000): 0.0,
    ("lists_per_min", 5000): 0.0,
}
FIGURES = ("sync_s", "increase_p50_ms", "increase_p99_ms", "loop_p50_ms", "loop_p99_ms", "plan_cli_s", "rss_mib",
           "lists_per_min", "requests_per_min")


@dataclass(frozen=True)
class Size:
    nodes: int
    pods: int

    @property
    def pending(self) -> int:
        return max(1, int(self.pods * PENDING_FRACTION))

    @property
    def bound(self) -> int:
        return self.pods - self.pending


# --- the cluster ---

def node_name(i: int) -> str:
    return f"bench-w-{i:05d}"


def node_body(i: int) -> dict[str, Any]:
    key, value = KWOK_NODE_ANNOTATION
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110", GPU: "1"}
    name = node_name(i)
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {key: value},
                         # CA's GPU label as a running DDS leaves it: the first deployment's label pass (one PATCH
                         # per node, in a thread of its own) is not the steady state this measures.
                         "labels": {"kubernetes.io/hostname": name, "nvidia.com/gpu.product": "A30",
                                    "dds.cdi.dev/initial-gpus-attached": "true", LABEL_ATTACHED_GPU: "A30"}},
            "spec": {"providerID": f"kwok://{name}"},
            "status": {"capacity": resources, "allocatable": resources}}


def machineset_body(size: Size) -> dict[str, Any]:
    labels = {"cluster.x-k8s.io/cluster-name": "bench", "cluster.x-k8s.io/set-name": GROUP_NAME}
    return {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "MachineSet",
            "metadata": {"name": GROUP_NAME, "namespace": NAMESPACE, "annotations": {
                "dds.cdi.dev/enabled": "true",
                "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size": "0",
                "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size": str(size.nodes * 10),
                "capacity.cluster-autoscaler.kubernetes.io/cpu": "64",
                "capacity.cluster-autoscaler.kubernetes.io/memory": "512Gi",
                "capacity.cluster-autoscaler.kubernetes.io/maxPods": "110",
                "capacity.cluster-autoscaler.kubernetes.io/gpu-count": "1",
                "capacity.cluster-autoscaler.kubernetes.io/gpu-type": GPU,
                "dds.cdi.dev/max-gpus-per-node": "4", "dds.cdi.dev/gpu-models": "A30",
                "dds.cdi.dev/fabric-pool": "default"}},
            "spec": {"clusterName": "bench", "replicas": size.nodes, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"clusterName": "bench", "bootstrap": {"dataSecretName": "b"},
                                           "infrastructureRef": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
                                                                 "kind": "KwokMachineTemplate", "name": GROUP_NAME}}}}}


def machine_body(i: int, owner_uid: str) -> dict[str, Any]:
    name = node_name(i)
    return {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine",
            "metadata": {"name": name, "namespace": NAMESPACE,
                         "labels": {"cluster.x-k8s.io/set-name": GROUP_NAME},
                         "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "MachineSet",
                                              "name": GROUP_NAME, "uid": owner_uid, "controller": True}]},
            "spec": {"clusterName": "bench", "providerID": f"kwok://{name}", "bootstrap": {"dataSecretName": "b"},
                     "infrastructureRef": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
                                           "kind": "KwokMachine", "name": name}}}


def pod_body(name: str, node: Optional[str], gpus: int) -> dict[str, Any]:
    requests = {"cpu": "100m", "memory": "256Mi", **({GPU: str(gpus)} if gpus else {})}
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                            "resources": {"requests": requests,
                                                          "limits": {GPU: str(gpus)} if gpus else {}}}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": "bench"},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "bench",
                                              "uid": "00000000-0000-0000-0000-000000000001", "controller": True}]},
            "spec": spec}


def in_parallel(calls: Iterable[Callable[[], Any]], workers: int = 0) -> None:
    """Run the calls on `workers` threads; each returns an undecoded response, drained here so that its connection
    goes back to the pool (an unread response holds its socket until garbage collection: 50,000 of them exhaust the
    file descriptors)."""
    def run(call: Callable[[], Any]) -> None:
        response = call()
        getattr(response, "read", lambda: None)()
        getattr(response, "release_conn", lambda: None)()

    with ThreadPoolExecutor(workers or WORKERS) as pool:
        for future in [pool.submit(run, call) for call in calls]:
            future.result()


def bulk_client(plane: ControlPlane) -> client.ApiClient:
    """A client whose connection pool holds every worker's connection: without it each request past the pool's 10
    opens a TLS connection of its own, and tens of thousands of creates run out of file descriptors."""
    from kubernetes import config

    configuration = client.Configuration()
    config.load_kube_config(config_file=str(plane.kubeconfig), client_configuration=configuration)
    configuration.connection_pool_maxsize = 2 * WORKERS
    return client.ApiClient(configuration)


def populate(plane: ControlPlane, size: Size) -> None:
    api = bulk_client(plane)
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    plane.create_namespace(NAMESPACE)
    for namespace in DDS_NAMESPACES.values():
        plane.create_namespace(namespace)
    started = time.monotonic()
    machineset = custom.create_namespaced_custom_object("cluster.x-k8s.io", "v1beta1", NAMESPACE, "machinesets",
                                                        machineset_body(size))
    uid = machineset["metadata"]["uid"]
    in_parallel(lambda i=i: core.create_node(node_body(i), _preload_content=False) for i in range(size.nodes))
    in_parallel(lambda i=i: custom.create_namespaced_custom_object(
        "cluster.x-k8s.io", "v1beta1", NAMESPACE, "machines", machine_body(i, uid), _preload_content=False)
                for i in range(size.nodes))
    # What Cluster API's controller would write: the Machine runs and names its Node (else it is capacity to come).
    in_parallel(lambda i=i: custom.patch_namespaced_custom_object_status(
        "cluster.x-k8s.io", "v1beta1", NAMESPACE, "machines", node_name(i),
        {"status": {"phase": "Running", "nodeRef": {"apiVersion": "v1", "kind": "Node", "name": node_name(i)}}},
        _preload_content=False) for i in range(size.nodes))

    def bound(i: int) -> Callable[[], Any]:
        node, slot = i % size.nodes, i // size.nodes  # round robin: the first pod on each node takes its GPU
        return lambda: core.create_namespaced_pod(NAMESPACE, pod_body(f"run-{i:06d}", node_name(node),
                                                                      gpus=1 if slot == 0 else 0),
                                                  _preload_content=False)

    in_parallel(bound(i) for i in range(size.bound))
    in_parallel(lambda i=i: core.create_namespaced_pod(NAMESPACE, pod_body(f"wait-{i:05d}", None, gpus=1),
                                                       _preload_content=False) for i in range(size.pending))
    log(f"created {size.nodes} nodes, {size.nodes} machines, {size.pods} pods in {time.monotonic() - started:.0f}s")
    wait_until(f"{size.pending} pending pods marked Unschedulable", lambda: unschedulable(core) >= size.pending,
               timeout=600)
    # kwok marks bound pods Running at about 100 a second on this machine, minutes after they were created. Measuring
    # before it is done would time DDS against a stream of pod updates that a settled cluster does not have.
    wait_until(f"{size.bound} bound pods Running", lambda: bound_not_running(core) == 0, timeout=1800)


def bound_not_running(core: client.CoreV1Api) -> int:
    pods = core.list_namespaced_pod(NAMESPACE, field_selector="status.phase=Pending", _preload_content=False)
    return sum(1 for p in json.loads(pods.data)["items"] if (p.get("spec") or {}).get("nodeName"))


def unschedulable(core: client.CoreV1Api) -> int:
    pods = core.list_namespaced_pod(NAMESPACE, field_selector="spec.nodeName=", _preload_content=False)
    items = json.loads(pods.data)["items"]
    return sum(1 for p in items for c in (p.get("status") or {}).get("conditions") or ()
               if c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable")


# --- DDS ---

def write_settings(workdir: Path, plane: ControlPlane, size: Size, grpc_port: int, metrics_port: int,
                   namespace: str) -> Path:
    tls = workdir / "tls"
    bundle = certs.generate_bundle(["localhost"], ["127.0.0.1"], days=1)
    certs.write_bundle(tls, bundle, certs.CloudConfigOptions(address=f"127.0.0.1:{grpc_port}", files_dir=str(tls)))
    settings = {
        "listen": f"127.0.0.1:{grpc_port}", "metrics_listen": f"127.0.0.1:{metrics_port}",
        "tls_cert": str(tls / certs.SERVER_CERT), "tls_key": str(tls / certs.SERVER_KEY),
        "tls_ca": str(tls / certs.CLIENT_CA_CERT), "kubeconfig": str(plane.kubeconfig), "namespace": namespace,
        "machineset_namespaces": [NAMESPACE], "loop_interval_seconds": LOOP_INTERVAL_SECONDS,
        "node_group_namespaces": {NAMESPACE: {"pools": ["*"]}},
        "pending_debounce_seconds": 86400.0,  # the loop plans and observes; attaching stays CA's (case 1)
        # Enough devices for every pending pod twice; the simulated manager keeps its state in one ConfigMap (1 MiB).
        "fabric": "simulated",
        "simulated_fabric": {"pools": [{"name": "default", "devices": {"A30": 2 * size.pending}}],
                             "attach_latency": {"min": 86400, "max": 86400}},
    }
    path = workdir / "dds.yaml"
    path.write_text(yaml.safe_dump(settings))
    return path


def grpc_client(workdir: Path, grpc_port: int) -> ExternalGrpcClient:
    tls = workdir / "tls"
    config = CloudConfig(address=f"127.0.0.1:{grpc_port}", cert=tls / certs.CLIENT_CERT, key=tls / certs.CLIENT_KEY,
                         cacert=tls / certs.CA_CERT)
    return ExternalGrpcClient(open_channel(config), timeout=120.0)


def first_refresh(provider: ExternalGrpcClient, timeout: float = 120.0) -> None:
    """CA's first call, retried while the channel connects: on a loaded machine DDS's first loop pass (labelling every
    node) can delay the TLS handshake past gRPC's connect attempt, which fails the call at once (CA retries too)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            provider.refresh()
            return
        except ProviderError as exc:
            if "UNAVAILABLE" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def requests_by_verb(dds: DdsProcess) -> dict[str, float]:
    out = {}
    for key, value in dds.metrics(timeout=METRICS_TIMEOUT_SECONDS).items():
        if key.startswith("dds_apiserver_requests_total{"):
            out[key.split('verb="')[1].split('"')[0]] = value
    return out


def settled_requests(dds: DdsProcess, timeout: float = 60.0) -> dict[str, float]:
    """The request counts once the calls' own tail has been sent: a burst's Events are written between CA's calls and
    the rest right after the last one (dds/controller/calls_first.py). Steady state starts when two reads two seconds
    apart agree."""
    deadline = time.monotonic() + timeout
    last = requests_by_verb(dds)
    while time.monotonic() < deadline:
        time.sleep(2.0)
        now = requests_by_verb(dds)
        if now == last:
            return now
        last = now
    return last


_LABEL = re.compile(r'(\w+)="([^"]*)"')


def labels_of(key: str) -> dict[str, str]:
    return dict(_LABEL.findall(key.partition("{")[2]))


def quantile(samples: dict[str, float], name: str, q: float, **match: str) -> float:
    """histogram_quantile over the cumulative buckets of `name` whose labels include `match`."""
    buckets = sorted((float(labels_of(key)["le"].replace("+Inf", "inf")), value) for key, value in samples.items()
                     if key.startswith(f"{name}_bucket{{")
                     and all(labels_of(key).get(k) == v for k, v in match.items()))
    total = buckets[-1][1] if buckets else 0.0
    if not total:
        return float("nan")
    rank, lower, below = q * total, 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if upper == float("inf"):
                return lower
            return lower + (upper - lower) * (rank - below) / max(count - below, 1e-9)
        lower, below = upper, count
    return lower


def histogram_quantile(dds: DdsProcess, name: str, q: float) -> float:
    """Prometheus' histogram_quantile over DDS's own buckets of `name`."""
    return quantile(dds.metrics(timeout=METRICS_TIMEOUT_SECONDS), name, q)


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def run_mode(workdir: Path, plane: ControlPlane, size: Size, watch: bool, calls: int, quiet_seconds: float
             ) -> dict[str, float]:
    grpc_port, metrics_port = free_ports(2)
    mode_dir = workdir / ("watch" if watch else "list")
    mode_dir.mkdir(parents=True, exist_ok=True)
    config = write_settings(mode_dir, plane, size, grpc_port, metrics_port, DDS_NAMESPACES["watch" if watch else "list"])
    env = {"DDS_WATCH_CACHE": "true" if watch else "false"}
    started = time.monotonic()
    dds = start_dds(config, mode_dir / "dds.log", metrics_port, timeout=900, env=env)
    sync_s = time.monotonic() - started
    try:
        provider = grpc_client(mode_dir, grpc_port)
        first_refresh(provider)
        assert any(g.id == GROUP_ID for g in provider.node_groups()), provider.node_groups()
        latencies, refused, over_deadline = [], 0, 0
        for _ in range(calls):
            begin = time.perf_counter()
            try:
                provider.increase_size(GROUP_ID, 1)
            except ProviderError:
                refused += 1  # a refusal is an answer too: its latency counts the same
            latencies.append(time.perf_counter() - begin)
            over_deadline += latencies[-1] > CA_DEADLINE_SECONDS
        before = settled_requests(dds)
        time.sleep(quiet_seconds)
        after = requests_by_verb(dds)
        per_min = 60.0 / quiet_seconds
        plan_started = time.monotonic()
        subprocess.run([sys.executable, "-m", "dds", "plan", "--kubeconfig", str(plane.kubeconfig), "--config",
                        str(config), "--json"], check=True,
                       stdout=subprocess.DEVNULL, env={**os.environ, **env}, timeout=900)
        plan_cli_s = time.monotonic() - plan_started
        figures = {
            "sync_s": sync_s,
            "increase_p50_ms": 1000 * statistics.median(latencies),
            "increase_p99_ms": 1000 * percentile(latencies, 0.99),
            "loop_p50_ms": 1000 * histogram_quantile(dds, "dds_control_loop_duration_seconds", 0.5),
            "loop_p99_ms": 1000 * histogram_quantile(dds, "dds_control_loop_duration_seconds", 0.99),
            "plan_cli_s": plan_cli_s,
            "rss_mib": rss_mib(dds.process.pid),
            "lists_per_min": per_min * (after.get("LIST", 0) - before.get("LIST", 0)),
            "requests_per_min": per_min * (sum(after.values()) - sum(before.values())),
        }
        log(f"{'watch' if watch else 'list'}: {calls} IncreaseSize calls, {refused} refused, {over_deadline} over CA's "
            f"{CA_DEADLINE_SECONDS:.0f}s deadline; steady-state requests by verb: "
            f"{ {k: after.get(k, 0) - before.get(k, 0) for k in after} }")
        return figures
    finally:
        dds.stop()


def line(size: Size, mode: str, figures: dict[str, float]) -> str:
    return (f"bench-scale nodes={size.nodes} pods={size.pods} mode={mode} "
            + " ".join(f"{k}={figures[k]:.{3 if k.endswith('_s') else 1}f}" for k in FIGURES))


def verdicts(size: Size, figures: dict[str, float]) -> list[str]:
    out = []
    for (figure, nodes), bound in GOALS.items():
        if nodes == size.nodes:
            value = figures[figure]
            out.append(f"{'ok' if value <= bound else 'MISSED'} {figure} {value:.1f} <= {bound:g}")
    return out


def bench_size(size: Size, bin_dir: Path, calls: int, baseline_calls: int, quiet_seconds: float, keep: bool,
               modes: tuple[str, ...] = ("list", "watch")) -> None:
    workdir = Path(tempfile.mkdtemp(prefix=f"dds-bench-scale-{size.nodes}-"))
    log(f"nodes={size.nodes} pods={size.pods} ({size.pending} pending): control plane in {workdir}")
    print(f"bench-scale nodes={size.nodes} cluster-api: the MachineSet, its {size.nodes} Machines and their Nodes are "
          f"written by this harness as Cluster API would leave them; Cluster API's manager does not run here (the e2e "
          f"tests and the demo run it): {CLUSTER_API_AT_5000}", flush=True)
    plane = start_control_plane(workdir / "cp", bin_dir=bin_dir)
    try:
        populate(plane, size)
        results = {}
        if "list" in modes:  # the baseline's calls take seconds each: fewer of them give its percentiles
            results["list"] = run_mode(workdir, plane, size, False, baseline_calls, quiet_seconds)
        if "watch" in modes:
            results["watch"] = run_mode(workdir, plane, size, True, calls, quiet_seconds)
        for mode in ("watch", "list"):
            if mode in results:
                print(line(size, mode, results[mode]), flush=True)
        if len(results) == 2:
            ratios = " ".join(f"{k}={results['list'][k] / results['watch'][k]:.1f}x" if results["watch"][k] else
                              f"{k}=n/a" for k in FIGURES if k not in ("lists_per_min", "requests_per_min"))
            print(f"bench-scale nodes={size.nodes} pods={size.pods} list/watch {ratios}", flush=True)
        for verdict in verdicts(size, results["watch"]) if "watch" in results else ():
            print(f"bench-scale nodes={size.nodes} goal {verdict}", flush=True)
    finally:
        plane.stop()
        if not keep:
            subprocess.run(["rm", "-rf", str(workdir / "cp" / "etcd")], check=False)


def wait_until(what: str, predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f}s")
        time.sleep(2.0)


def log(message: str) -> None:
    print(f"[bench-scale {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def parse_sizes(text: str) -> list[Size]:
    out = []
    for part in text.split(","):
        nodes, pods = part.lower().split("x")
        out.append(Size(int(nodes), int(pods)))
    return out


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000x10000,5000x50000", help="NODESxPODS,... (default: %(default)s)")
    parser.add_argument("--calls", type=int, default=50, help="IncreaseSize calls per run (default: %(default)s)")
    parser.add_argument("--baseline-calls", type=int, default=5,
                        help="IncreaseSize calls in the LIST-per-call run (default: %(default)s)")
    parser.add_argument("--quiet-seconds", type=float, default=60.0,
                        help="steady-state window for request rates (default: %(default)s)")
    parser.add_argument("--keep", action="store_true", help="keep etcd's data dir for a look afterwards")
    parser.add_argument("--modes", default="list,watch",
                        help="which runs: list (the LIST-per-call baseline), watch (the cache); default: %(default)s")
    args = parser.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # 50,000 pods: kwok, watches, pools add up
    bin_dir = ensure_binaries()
    for size in parse_sizes(args.sizes):
        bench_size(size, bin_dir, args.calls, args.baseline_calls, args.quiet_seconds, args.keep,
                   tuple(m.strip() for m in args.modes.split(",") if m.strip()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
