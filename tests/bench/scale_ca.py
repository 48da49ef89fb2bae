"""DDS as the real cluster-autoscaler sees it: CA's scan, and DDS's share of it (issue 26, docs/scale.md).

On the same cluster as tests/bench/scale.py (N kwok nodes of one MachineSet group, M pods, 1 % pending and
Unschedulable), this starts `dds serve` and the pinned cluster-autoscaler (externalgrpc, its production scan interval
of 10 s) twice: with the group in spec-fixed mode, then in observed mode (live nodes mapped to the group: an answer CA
caches), as the baseline. Each run gets a fresh DDS and CA, so their counters start at zero. Per run it prints

    bench-scale-ca nodes=N pods=M mode=spec-fixed|observed scans=… ca_main_p50_s=… ca_main_p99_s=… calls_per_scan=…
                   dds_s_per_scan=… dds_share=… first_scale_up_s=… calls.<Method>=…

- `ca_main_p50_s`, `ca_main_p99_s`: `cluster_autoscaler_function_duration_seconds{function="main"}` quantiles over the
  measuring window (bucket-interpolated, as Prometheus' histogram_quantile);
- `calls_per_scan` and `calls.<Method>`: DDS's gRPC calls in the window (`dds_grpc_request_duration_seconds_count`)
  divided by CA's main loops in it;
- `dds_s_per_scan`: DDS's own time answering them (the same histogram's `_sum`, server side) per scan; `dds_share`:
  that over CA's main-loop time;
- `first_scale_up_s`: from CA's start (the pending pods are Unschedulable before it starts) to DDS's first
  NodeGroupIncreaseSize call: CA's time from unschedulable pods to its scale-up decision, start-up included;
- `ca.<function>_s`: CA's mean time per call of each step it times (`function` label of the same histogram:
  updateClusterState, filterOutSchedulable, scaleUp, findUnneeded, ...) over the window: where its loop goes.

then the spec-fixed/observed ratios and the issue's goals as `ok` / `MISSED`. The window starts at the first scale-up
(or when `--first-scale-up-timeout` passes without one) and lasts `--window-seconds`.

    python -m tests.bench.scale_ca --sizes 1000x10000
"""

from __future__ import annotations

import argparse
import re
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Optional

from kubernetes import client

from dds import certs
from harness.autoscaler import AutoscalerHandle, start_autoscaler
from harness.controlplane import ControlPlane, ensure_binaries, free_ports, start_control_plane
from harness.stack import DdsProcess, start_dds
from tests.bench.scale import (GROUP_NAME, NAMESPACE, Size, bulk_client, labels_of, log, parse_sizes, populate, quantile,
                               write_settings)

MODES = ("spec-fixed", "observed")
CA_NAMESPACE = "dds-system"  # CA's status ConfigMap
SCAN_INTERVAL_SECONDS = 10.0  # CA's default
DDS_LATENCY = "dds_grpc_request_duration_seconds"
CA_FUNCTION = "cluster_autoscaler_function_duration_seconds"

# CA's cluster-wide resource limits: its default --cores-total is 0:320000, exactly what 5,000 bench nodes of 64 CPUs
# hold, so at 5,000 nodes CA refused every scale-up ("cluster-wide" quota exceeded, resources: cpu) whatever DDS
# answered. The bench measures DDS under CA, not that limit: far above any size benched here.
CA_RESOURCE_LIMITS = ("--cores-total=0:100000000", "--memory-total=0:1000000000")

# Goals (issue 26; benchmark only): DDS's own time per CA scan, by size.
DDS_SECONDS_PER_SCAN_GOAL = {1000: 0.1, 5000: 1.0}


def ca_metrics(port: int, timeout: float = 30.0) -> dict[str, float]:
    """CA's /metrics samples of its function-duration histogram, keyed by name{labels}."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith(CA_FUNCTION):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {key: value - before.get(key, 0.0) for key, value in after.items()}


def sample(samples: dict[str, float], name: str, **match: str) -> float:
    return sum(value for key, value in samples.items()
               if key.startswith(f"{name}{{") and all(labels_of(key).get(k) == v for k, v in match.items()))


def calls_by_method(dds_samples: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in dds_samples.items():
        if key.startswith(f"{DDS_LATENCY}_count{{"):
            out[labels_of(key)["method"]] = value
    return out


def ca_port(ca: AutoscalerHandle) -> int:
    cmdline = (ca.log_path.parent / "cluster-autoscaler.cmdline").read_text()
    return int(re.search(r"--address=127\.0\.0\.1:(\d+)", cmdline).group(1))


def set_mode(plane: ControlPlane, mode: str) -> None:
    custom = client.CustomObjectsApi(bulk_client(plane))
    custom.patch_namespaced_custom_object("cluster.x-k8s.io", "v1beta1", NAMESPACE, "machinesets", GROUP_NAME,
                                          {"metadata": {"annotations": {"dds.cdi.dev/template-mode": mode}}})


def wait_first_scale_up(dds: DdsProcess, timeout: float) -> Optional[float]:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if calls_by_method(dds.metrics(timeout=60.0)).get("NodeGroupIncreaseSize", 0) > 0:
            return time.monotonic() - started
        time.sleep(1.0)
    return None


def run_mode(workdir: Path, plane: ControlPlane, size: Size, mode: str, window: float, first_timeout: float,
             bin_dir: Path) -> dict[str, float]:
    set_mode(plane, mode)
    mode_dir = workdir / mode
    mode_dir.mkdir(parents=True, exist_ok=True)
    namespace = f"dds-ca-{mode}"
    plane.create_namespace(namespace)
    grpc_port, metrics_port = free_ports(2)
    config = write_settings(mode_dir, plane, size, grpc_port, metrics_port, namespace)
    dds = start_dds(config, mode_dir / "dds.log", metrics_port, timeout=900)
    ca: Optional[AutoscalerHandle] = None
    try:
        ca = start_autoscaler(plane.kubeconfig, mode_dir / "tls" / certs.CLOUD_CONFIG, mode_dir / "ca",
                              bin_dir=bin_dir, namespace=CA_NAMESPACE, scan_interval=SCAN_INTERVAL_SECONDS,
                              max_node_provision_time=None, scale_down_unneeded_time=None,
                              scale_down_delay_after_add=None, node_info_cache_expire_time=None,
                              extra_flags=CA_RESOURCE_LIMITS)
        first = wait_first_scale_up(dds, first_timeout)
        log(f"{mode}: first scale-up {'none' if first is None else f'{first:.0f}s'} after CA started")
        port = ca_port(ca)
        ca_before, dds_before = ca_metrics(port), dds.metrics(timeout=60.0)
        time.sleep(window)
        ca_window = delta(ca_metrics(port), ca_before)
        dds_window = delta(dds.metrics(timeout=60.0), dds_before)
        if not ca.running():
            raise RuntimeError(f"cluster-autoscaler exited during the window; see {ca.log_path}")
    finally:
        if ca is not None:
            ca.stop()
        dds.stop()
    scans = sample(ca_window, f"{CA_FUNCTION}_count", function="main")
    calls = calls_by_method(dds_window)
    per_scan = max(scans, 1.0)
    dds_seconds = sample(dds_window, f"{DDS_LATENCY}_sum")
    ca_seconds = sample(ca_window, f"{CA_FUNCTION}_sum", function="main")
    figures = {
        "scans": scans,
        "ca_main_p50_s": quantile(ca_window, CA_FUNCTION, 0.5, function="main"),
        "ca_main_p99_s": quantile(ca_window, CA_FUNCTION, 0.99, function="main"),
        "calls_per_scan": sum(calls.values()) / per_scan,
        "dds_s_per_scan": dds_seconds / per_scan,
        "dds_share": dds_seconds / ca_seconds if ca_seconds else float("nan"),
        "first_scale_up_s": float("nan") if first is None else first,
    }
    figures.update({f"calls.{method}": count / per_scan for method, count in sorted(calls.items()) if count})
    figures.update(call_latencies(dds_window, per_scan))
    figures.update(ca_steps(ca_window))
    return figures


# CA's per-node calls: where DDS's share of the scan goes.
HOT_METHODS = ("NodeGroupForNode", "NodeGroupGetOptions")


def call_latencies(dds_window: dict[str, float], per_scan: float) -> dict[str, float]:
    """DDS's per-call p50/p99 of CA's per-node calls (bucket-interpolated) and how many calls a scan took over 1 ms:
    a mean per call far above the p50 is a tail of calls that waited for a core or the interpreter."""
    out = {}
    for method in HOT_METHODS:
        for q in (0.5, 0.99):
            out[f"dds_{method}_p{round(q * 100)}_ms"] = 1000 * quantile(dds_window, DDS_LATENCY, q, method=method)
    slow = sum(value for key, value in dds_window.items() if key.startswith(f"{DDS_LATENCY}_count{{"))
    slow -= sum(value for key, value in dds_window.items()
                if key.startswith(f"{DDS_LATENCY}_bucket{{") and labels_of(key).get("le") == "0.001")
    out["dds_calls_over_1ms_per_scan"] = slow / per_scan
    return out


def ca_steps(ca_window: dict[str, float]) -> dict[str, float]:
    """CA's mean seconds per call of each timed step but `main` (the loop itself), over the window."""
    steps: dict[str, float] = {}
    for key, count in ca_window.items():
        if key.startswith(f"{CA_FUNCTION}_count{{") and count:
            function = labels_of(key)["function"]
            if function != "main":
                steps[f"ca.{function}_s"] = sample(ca_window, f"{CA_FUNCTION}_sum", function=function) / count
    return dict(sorted(steps.items()))


def line(size: Size, mode: str, figures: dict[str, float]) -> str:
    return (f"bench-scale-ca nodes={size.nodes} pods={size.pods} mode={mode} "
            + " ".join(f"{k}={v:.4f}" if k.endswith(("_s", "_ms", "_per_scan", "share")) and not k.startswith("calls")
                       else f"{k}={v:.1f}" for k, v in figures.items()))


def verdicts(size: Size, results: dict[str, dict[str, float]]) -> list[str]:
    fixed, observed = results["spec-fixed"], results["observed"]
    out = [(fixed["calls_per_scan"] <= observed["calls_per_scan"],
            f"calls_per_scan {fixed['calls_per_scan']:.0f} <= observed {observed['calls_per_scan']:.0f}"),
           (fixed["ca_main_p50_s"] <= observed["ca_main_p50_s"],
            f"ca_main_p50_s {fixed['ca_main_p50_s']:.2f} <= observed {observed['ca_main_p50_s']:.2f}")]
    bound = DDS_SECONDS_PER_SCAN_GOAL.get(size.nodes)
    if bound is not None:
        out.append((fixed["dds_s_per_scan"] <= bound, f"dds_s_per_scan {fixed['dds_s_per_scan']:.3f} <= {bound:g}"))
    return [f"{'ok' if good else 'MISSED'} {text}" for good, text in out]


def bench_size(size: Size, bin_dir: Path, window: float, first_timeout: float, modes: tuple[str, ...]) -> None:
    workdir = Path(tempfile.mkdtemp(prefix=f"dds-bench-scale-ca-{size.nodes}-"))
    log(f"nodes={size.nodes} pods={size.pods} ({size.pending} pending): control plane in {workdir}")
    plane = start_control_plane(workdir / "cp", bin_dir=bin_dir)
    try:
        populate(plane, size)
        plane.create_namespace(CA_NAMESPACE)
        results = {mode: run_mode(workdir, plane, size, mode, window, first_timeout, bin_dir) for mode in modes}
        for mode, figures in results.items():
            print(line(size, mode, figures), flush=True)
        if len(results) == 2:
            ratios = " ".join(f"{k}={results['spec-fixed'][k] / results['observed'][k]:.2f}x"
                              if results["observed"].get(k) else f"{k}=n/a"
                              for k in ("calls_per_scan", "ca_main_p50_s", "ca_main_p99_s", "dds_s_per_scan",
                                        "first_scale_up_s"))
            print(f"bench-scale-ca nodes={size.nodes} pods={size.pods} spec-fixed/observed {ratios}", flush=True)
            for verdict in verdicts(size, results):
                print(f"bench-scale-ca nodes={size.nodes} goal {verdict}", flush=True)
    finally:
        plane.stop()
        subprocess.run(["rm", "-rf", str(workdir / "cp" / "etcd")], check=False)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000x10000,5000x50000", help="NODESxPODS,... (default: %(default)s)")
    parser.add_argument("--window-seconds", type=float, default=120.0,
                        help="measuring window after the first scale-up (default: %(default)s)")
    parser.add_argument("--first-scale-up-timeout", type=float, default=300.0,
                        help="how long to wait for CA's first scale-up (default: %(default)s)")
    parser.add_argument("--modes", default=",".join(MODES), help="default: %(default)s")
    args = parser.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    bin_dir = ensure_binaries()
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"unknown mode(s) {', '.join(unknown)}; known: {', '.join(MODES)}")
    for size in parse_sizes(args.sizes):
        bench_size(size, bin_dir, args.window_seconds, args.first_scale_up_timeout, modes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
