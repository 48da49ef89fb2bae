"""`make demo`: the talk's demo end to end on the embedded default, with a readable timeline.

What runs, all on this machine: etcd, kube-apiserver, kube-scheduler and kwok as processes (harness/controlplane.py),
DDS (`dds serve` in cluster mode, mutual TLS, simulated fabric), Cluster API's own manager (its MachineSet and Machine
controllers, built by hack/build-binaries.sh at the version hack/versions.env pins) with the harness's kwok
infrastructure provider standing for the servers (harness/kwok_provider.py), and the real cluster-autoscaler of the Kubernetes profile (1.36.1 with Kubernetes 1.36 by
default, DDS_K8S_PROFILE=1.35 for 1.35.2: docs/versions.md) with `--cloud-provider=externalgrpc`, built from source by
hack/build-binaries.sh ($DDS_CLUSTER_AUTOSCALER names another build of the same version). The version the demo prints
is the one the running binary logs.

The scenario (shared/seeds/004, the talk's demo):
1. Two workers of MachineSet gpu-workers, one A30 each, both busy.
2. A pod asks for one more GPU: Pending -> DDS's fast path attaches a GPU to a worker within seconds (no node, no wait
   for CA, which holds GPU pods back for 30 s) -> Running.
3. Memory-heavy pods that no worker can hold even with every GPU slot filled -> CA calls IncreaseSize -> DDS adds a
   node -> Running.
4. Those pods go away -> idle GPUs are detached after the cooldown, the empty node is removed.

    python -m harness.demo [--workdir DIR] [--attach-latency 4:6] [--node-provisioning 20] [--json] [--dra]
                           [--fabric simulated|composability]

`--dra` runs the same scenario with every GPU asked for through a ResourceClaim (harness/demo_dra.py, docs/dra.md).
`--cxl-memory` gives the pool CXL memory too: step 3's pods get memory attached to a worker, no node added
(harness/demo_cxl.py, docs/cxl-memory.md).
`--fabric composability` runs it through CoHDI's real CDI operator and the fabric-manager emulator, GPUs claimed from
NVIDIA's DRA driver (harness/demo_cdi.py); its second line is the operator's version.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, TextIO

from kubernetes import client

from dds.model.cxl import CXL_MODEL_PREFIX, chunk_bytes, memory_text
from dds.model.quantity import to_int
from harness.demo_plot import Moment, Recording, Sample, Span, render, write_recording
from harness.stack import (WORKLOAD_NAMESPACE as DEMO_NAMESPACE, StackError, StackOptions, gpus_allocatable,
                               group_of, is_ready, machineset, pod, start_stack)

GiB = 2**30
BOOT_GPUS = 1  # the demo MachineSet's capacity.cluster-autoscaler.kubernetes.io/gpu-count: each node boots with one
PICTURE = "demo-timeline.png"  # written beside the logs, with its recording (demo-timeline.json): harness/demo_plot.py
# DDS's and CA's Events marked on the picture: (kind, reason, subject prefix) -> what a reader is told happened.
MOMENTS = {("dds", "AttachingGPU", "pod/"): "DDS attaches a GPU", ("ca", "TriggeredScaleUp", "pod/"): "CA scale-up",
           ("dds", "AttachingMemory", "pod/"): "DDS attaches CXL memory",
           ("dds", "AddingNode", "machineset/"): "DDS adds a node",
           ("dds", "DetachingGPU", "node/"): "DDS detaches a GPU",
           ("dds", "DetachingMemory", "node/"): "DDS detaches CXL memory",
           ("dds", "RemovingNode", "machineset/"): "DDS removes a node"}


@dataclass(frozen=True)
class DemoOptions:
    workdir: Path
    # The demo's shape: the talk's latencies compressed (attach 4-6 s for tens of seconds, a node in 20 s for tens of
    # minutes), cooldowns short enough to watch; `stack.dds_settings` picks another fabric backend (the e2e variants).
    stack: StackOptions = StackOptions()
    step_timeout_seconds: float = 240.0
    echo: bool = True


# --- the timeline ---

@dataclass(frozen=True)
class Entry:
    at: float  # seconds since the demo's start
    kind: str  # pod | node | dds (DDS's Events) | ca (cluster-autoscaler's Events) | step
    subject: str
    text: str

    def line(self) -> str:
        return f"{self.at:7.1f}s  {self.kind:<5} {self.subject:<28} {self.text}"


@dataclass
class Timeline:
    out: Optional[TextIO]
    started: float = field(default_factory=time.monotonic)
    entries: list[Entry] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)  # what the cluster showed at each poll, for the picture
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, subject: str, text: str) -> Entry:
        entry = Entry(round(time.monotonic() - self.started, 1), kind, subject, text)
        with self._lock:
            self.entries.append(entry)
        if self.out is not None:
            print(entry.line(), file=self.out, flush=True)
        return entry

    def now(self) -> float:
        return round(time.monotonic() - self.started, 1)

    def sample(self, sample: Sample) -> None:
        with self._lock:
            self.samples.append(sample)

    def find(self, kind: str, predicate: Callable[[Entry], bool]) -> list[Entry]:
        with self._lock:
            return [e for e in self.entries if e.kind == kind and predicate(e)]


class ClusterWatcher:
    """Turns what the cluster shows into timeline lines: pod phases, nodes and their GPUs, and DDS's Events."""

    def __init__(self, api: client.ApiClient, timeline: Timeline, interval: float = 0.5,
                 pool_free: Callable[[], Optional[int]] = lambda: None) -> None:
        self._core = client.CoreV1Api(api)
        self._resource = client.ResourceV1Api(api)
        self._pool_free = pool_free
        self._timeline = timeline
        self._interval = interval
        self._pods: dict[str, str] = {}
        self._nodes: dict[str, str] = {}
        self._events: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-watch", daemon=True)

    def start(self) -> "ClusterWatcher":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.poll()
            except Exception as exc:  # the apiserver may be going away at the end of the demo
                self._timeline.add("step", "watch", f"cannot read the cluster: {exc}")

    def poll(self) -> None:
        with self._lock:  # the watch thread and the scenario (before it changes anything) both poll
            # Events first: an Event announces what DDS or CA does, its effect on pods and nodes shows after it; seen
            # in the same poll, the effect must not be timed before its cause.
            self._poll_events()
            # The sample is timed when its reads start: never after a pod line it explains (a GPU shown, then the
            # pod Running on it, both seen in this poll).
            at = self._timeline.now()
            pods = self._poll_pods()
            nodes = self._poll_nodes()
            self._sample(at, pods, nodes)

    def _sample(self, at: float, pods: list[Any], nodes: list[Any]) -> None:
        self._timeline.sample(sample_of(at, pods, nodes, self._resource.list_resource_slice().items,
                                        self._pool_free()))

    def _poll_pods(self) -> list[Any]:
        seen = set()
        items = self._core.list_namespaced_pod(DEMO_NAMESPACE).items
        for item in items:
            name = item.metadata.name
            seen.add(name)
            state = pod_state(item)
            if self._pods.get(name) != state:
                self._pods[name] = state
                self._timeline.add("pod", name, state)
        for gone in set(self._pods) - seen:
            del self._pods[gone]
            self._timeline.add("pod", gone, "deleted")
        return items

    def _poll_nodes(self) -> list[Any]:
        seen = set()
        items = self._core.list_node().items
        for node in items:
            name = node.metadata.name
            seen.add(name)
            state = f"{'Ready' if is_ready(node) else 'NotReady'}, {gpus_allocatable(node)} GPU(s) allocatable"
            if self._nodes.get(name) != state:
                verb = "registered" if name not in self._nodes else "now"
                self._nodes[name] = state
                self._timeline.add("node", name, f"{verb} {state}")
        for gone in set(self._nodes) - seen:
            del self._nodes[gone]
            self._timeline.add("node", gone, "removed from the cluster")
        return items

    def _poll_events(self) -> None:
        events = self._core.list_event_for_all_namespaces().items
        for event in sorted(events, key=lambda e: (e.last_timestamp or e.event_time or e.metadata.creation_timestamp)):
            source = event.source.component if event.source else None
            if source not in ("dds", "cluster-autoscaler"):
                continue
            count = event.count or 1
            if self._events.get(event.metadata.uid, 0) >= count:
                continue
            self._events[event.metadata.uid] = count
            involved = event.involved_object
            self._timeline.add("dds" if source == "dds" else "ca", f"{involved.kind.lower()}/{involved.name}",
                               f"{event.reason}: {event.message}")


def free_gpus(samples: dict[str, float]) -> Optional[int]:
    """The pool's free GPUs in DDS's metrics: its free devices but the CXL memory chunks (devices too, whose model
    names their size: dds/model/cxl.py); None when DDS reported none."""
    free = [v for k, v in samples.items() if k.startswith("dds_pool_devices{") and 'state="free"' in k
            and f'model="{CXL_MODEL_PREFIX}' not in k]
    return int(sum(free)) if free else None


def sample_of(at: float, pods: list[Any], nodes: list[Any], resource_slices: list[Any],
              pool_free: Optional[int]) -> Sample:
    """The picture's numbers from what one poll read: GPUs each node shows (nvidia.com/gpu, or its devices in
    ResourceSlices with DRA), each node's allocatable memory (CXL memory attached makes it grow), Ready nodes, pods
    Pending and Running, and the pool's free GPUs as DDS reports them."""
    devices: dict[str, int] = {}
    for resource_slice in resource_slices:
        node = resource_slice.spec.node_name
        if node:
            devices[node] = devices.get(node, 0) + len(resource_slice.spec.devices or ())
    phases = [p.status.phase or "Pending" for p in pods if not p.metadata.deletion_timestamp]
    gpus = {n.metadata.name: gpus_allocatable(n) + devices.get(n.metadata.name, 0) for n in nodes}
    memory = {n.metadata.name: memory_gib(n) for n in nodes}
    return Sample(at, gpus, sum(1 for n in nodes if is_ready(n)), phases.count("Pending"), phases.count("Running"),
                  pool_free, memory)


def memory_gib(node: Any) -> float:
    """The node's allocatable memory in GiB (a quantity as the node writes it: bytes, or 64Gi)."""
    return round(to_int((node.status.allocatable or {}).get("memory", "0")) / GiB, 3)


def pod_state(pod: Any) -> str:
    if pod.metadata.deletion_timestamp:
        return "terminating"
    phase = pod.status.phase or "Pending"
    if phase == "Pending":
        scheduled = next((c for c in pod.status.conditions or () if c.type == "PodScheduled"), None)
        if scheduled is not None and scheduled.status == "False":
            return f"Pending ({scheduled.reason}: {(scheduled.message or '').strip()[:90]})"
        return "Pending"
    return f"{phase} on {pod.spec.node_name}"


# --- the scenario ---

@dataclass
class DemoResult:
    timeline: list[Entry]
    autoscaler: str
    gpu_path_seconds: float  # the 1-GPU pod: Pending -> Running
    node_path_seconds: float  # the memory-heavy pods: Pending -> Running
    nodes_added: int
    nodes_removed: int
    gpus_attached: int  # every GPU attach DDS made, boot-time GPUs of new nodes included (CXL memory apart)
    gpus_attached_at_boot: int  # of those, the GPUs each node boots with (capacity.../gpu-count per node)
    gpus_detached: int
    metrics: dict[str, float]
    decisions: list[dict[str, Any]]  # DDS's decision journal at the end, newest first
    workdir: Path
    samples: list[Sample] = field(default_factory=list)  # what the watcher saw at each poll
    spans: list[Span] = field(default_factory=list)  # the GPU path and the node path, in timeline seconds
    picture: Optional[Path] = None  # the timeline's PNG, beside the logs
    memory_attached: int = 0  # bytes of CXL memory DDS attached (dds_cxl_memory_chunks_attached_total), and detached
    memory_detached: int = 0
    memory_path: str = "node path"  # how the memory-heavy pods were served (harness/demo_cxl.py: "memory path")
    cluster_api: str = ""  # "Cluster API v1.14.2": the manager's version
    # DDS's decision to remove the added node (its GPUs first) -> the Node gone, through Cluster API; None: not seen
    node_removal_seconds: Optional[float] = None


class Demo:
    # The memory-heavy pods' step: what is expected, and the name of the path that serves them (a variant with CXL
    # memory in the pool expects an attach instead: harness/demo_cxl.py).
    memory_step = ("two memory-heavy pods (24Gi each) no worker can hold even with all 4 GPU slots: expect CA's "
                   "scale-up and a new node")
    memory_path = "node path"

    def __init__(self, options: DemoOptions, out: Optional[TextIO]) -> None:
        self.options = options
        self.timeline = Timeline(out if options.echo else None)
        self.watcher: Optional[ClusterWatcher] = None

    def wait_for(self, what: str, predicate: Callable[[], Any], timeout: Optional[float] = None,
                 describe: Callable[[], str] = lambda: "") -> Any:
        value = self.stack.wait_for(what, predicate, timeout or self.options.step_timeout_seconds, describe)
        if self.watcher is not None:
            self.watcher.poll()  # record what was just seen before the scenario changes it
        return value

    def step(self, text: str) -> None:
        self.timeline.add("step", "==>", text)

    def pods_running(self, names: list[str]) -> bool:
        pods = {p.metadata.name: p for p in self.stack.pods()}
        return all(n in pods and pods[n].status.phase == "Running" for n in names)

    def pods_describe(self) -> str:
        return "; ".join(f"{p.metadata.name}: {pod_state(p)}" for p in self.stack.pods())

    def nodes_describe(self) -> str:
        return "; ".join(f"{n.metadata.name}: {gpus_allocatable(n)} GPU(s)" for n in self.stack.nodes())

    def start(self) -> None:
        options = self.options.stack
        self.step(f"starting etcd, kube-apiserver, kube-scheduler, kwok and Cluster API's manager; MachineSet default/gpu-workers (2 workers, "
                  f"1 A30 each at boot, up to 4 attachable); DDS (mutual TLS, simulated fabric: {options.pool_size} x "
                  f"A30, attach {options.attach_latency[0]:g}-{options.attach_latency[1]:g}s); "
                  f"logs in {self.options.workdir}")
        self.stack = start_stack(self.options.workdir, options)
        self.core = self.stack.core
        self.dds = self.stack.dds
        self.step(cluster_api_step(self.stack))
        self.step(f"autoscaler: {self.stack.autoscaler.kind} (--cloud-provider=externalgrpc, "
                  f"log {self.stack.autoscaler.log_path})")
        self.watcher = ClusterWatcher(self.stack.control_plane.api_client(), self.timeline,
                                      pool_free=self.pool_free).start()

    def pool_free(self) -> Optional[int]:
        """Free GPUs in the pool as DDS reports them (dds_pool_devices{state="free"}); None when unread."""
        dds = getattr(self, "dds", None)
        try:
            samples = dds.metrics(timeout=2.0) if dds is not None else {}
        except OSError:  # DDS restarting or stopping: a gap in the line, not a zero
            return None
        return free_gpus(samples)

    def nodes(self) -> list[Any]:
        return self.stack.nodes()

    def ready_workers(self) -> list[Any]:
        return [n for n in self.stack.nodes() if is_ready(n)]

    # -- the talk's scenario --
    def run(self) -> DemoResult:
        self.step("waiting for the two workers, each with its boot-time A30")
        self.wait_for("two Ready workers with 1 GPU each",
                      lambda: len([n for n in self.ready_workers() if gpus_allocatable(n) == 1]) == 2,
                      describe=self.nodes_describe)
        workers = {n.metadata.name for n in self.nodes()}

        self.step("two pods take both GPUs (48Gi each, so the workers are also short of memory)")
        for name in ("busy-0", "busy-1"):
            self.core.create_namespaced_pod(DEMO_NAMESPACE, pod(name, memory_gib=48, gpus=1))
        self.wait_for("busy-0 and busy-1 Running", lambda: self.pods_running(["busy-0", "busy-1"]),
                      describe=self.pods_describe)

        self.step("a pod asks for one more GPU: expect DDS's fast path to attach one to a worker, and no new node")
        self.core.create_namespaced_pod(DEMO_NAMESPACE, pod("train-0", memory_gib=8, gpus=1))
        gpu_started = time.monotonic()
        self.wait_for("train-0 Running", lambda: self.pods_running(["train-0"]), describe=self.pods_describe)
        gpu_path = time.monotonic() - gpu_started
        self.step(f"train-0 Running {gpu_path:.1f}s after it was created, on a worker that got a GPU")

        self.step(self.memory_step)
        for name in ("mem-0", "mem-1"):
            self.core.create_namespaced_pod(DEMO_NAMESPACE, pod(name, memory_gib=24))
        node_started = time.monotonic()
        self.wait_for("mem-0 and mem-1 Running", lambda: self.pods_running(["mem-0", "mem-1"]),
                      describe=lambda: f"{self.pods_describe()} | {self.nodes_describe()}")
        node_path = time.monotonic() - node_started
        added = {n.metadata.name for n in self.nodes()} - workers
        self.step(self.memory_served(node_path, added))

        self.step("train-0, mem-0 and mem-1 finish: expect idle GPUs detached after the cooldown, the empty node removed")
        for name in ("train-0", "mem-0", "mem-1"):
            self.core.delete_namespaced_pod(name, DEMO_NAMESPACE, grace_period_seconds=0)

        def settled() -> bool:
            nodes = self.nodes()
            names = {n.metadata.name for n in nodes}
            return names == workers and all(gpus_allocatable(n) == 1 and self.memory_settled(n) for n in nodes)

        self.wait_for("the added node removed and each worker back to 1 GPU", settled,
                      timeout=self.options.step_timeout_seconds + self.options.stack.gpu_idle_cooldown_seconds
                      + self.options.stack.node_idle_cooldown_seconds, describe=self.nodes_describe)
        self.step("back to two workers with one busy A30 each")
        return self.result(gpu_path, node_path, workers, added)

    def memory_served(self, seconds: float, added: set[str]) -> str:
        return f"mem-0 and mem-1 Running {seconds:.1f}s after creation, on new node(s) {', '.join(sorted(added))}"

    def memory_settled(self, node: Any) -> bool:
        """Whether `node` is back to its own memory at the end (always: this scenario attaches none)."""
        return True

    def result(self, gpu_path: float, node_path: float, workers: set[str], added: set[str]) -> DemoResult:
        """What the run showed, once the watcher has printed the last Events."""
        time.sleep(1.5)
        after = self.dds.metrics()
        spans = [self.span("GPU path", ["train-0"], gpu_path, "1 pod, a GPU attached to a worker, no node added"),
                 self.span(self.memory_path, ["mem-0", "mem-1"], node_path,
                           f"2 pods, {len(added)} node{'' if len(added) == 1 else 's'} added")]
        result = DemoResult(
            timeline=list(self.timeline.entries), autoscaler=self.stack.autoscaler.kind, gpu_path_seconds=gpu_path,
            node_path_seconds=node_path, nodes_added=len(added),
            nodes_removed=len(added - {n.metadata.name for n in self.nodes()}),
            gpus_attached=int(_total(after, "dds_gpus_attached_total")),
            gpus_attached_at_boot=BOOT_GPUS * (len(workers) + len(added)),
            gpus_detached=int(_total(after, "dds_gpus_detached_total")),
            memory_attached=memory_counted(after, "dds_cxl_memory_chunks_attached_total"),
            memory_detached=memory_counted(after, "dds_cxl_memory_chunks_detached_total"),
            metrics=after, decisions=self.dds.decisions(), workdir=self.options.workdir,
            samples=list(self.timeline.samples), spans=spans, memory_path=self.memory_path,
            cluster_api=f"Cluster API {self.stack.cluster_api.version}",
            node_removal_seconds=node_removal_seconds(self.timeline.entries, added))
        result.picture = self.draw(result, workers)
        return result

    def span(self, name: str, pods: list[str], seconds: float, detail: str) -> Span:
        """A path as the timeline saw it: it ends when the last of `pods` was seen Running, `seconds` after they
        were created."""
        running = [first.at for pod_name in pods for first in self.timeline.find(
            "pod", lambda e, n=pod_name: e.subject == n and e.text.startswith("Running"))[:1]]
        end = max(running) if running else round(time.monotonic() - self.timeline.started, 1)
        return Span(name, round(max(end - seconds, 0.0), 1), end, detail)

    def draw(self, result: DemoResult, workers: set[str]) -> Path:
        """The timeline's picture and its recording, beside the logs."""
        options = self.options.stack
        fabric = options.dds_settings.get("fabric", "simulated")
        title = (f"DDS demo with {result.autoscaler} and {result.cluster_api} \u2014 {fabric} fabric, "
                 f"{options.pool_size} x A30, kwok nodes")
        recording = Recording(title, result.samples, result.spans, moments(result.timeline), sorted(workers),
                              own_memory_gib=group_of(machineset(options)).memory / GiB)
        write_recording(recording, self.options.workdir / Path(PICTURE).with_suffix(".json"))
        return render(recording, self.options.workdir / PICTURE)

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()
        if getattr(self, "stack", None) is not None:
            self.stack.close()


def cluster_api_step(stack: Any) -> str:
    """The demo's line naming Cluster API: the manager's version and process, and what stands for the servers."""
    manager = stack.cluster_api
    return (f"Cluster API {manager.version}: its manager (pid {manager.pid}, log {manager.log_path}) runs the "
            f"MachineSet and its Machines; the kwok infrastructure provider stands for the servers "
            f"({stack.options.node_provisioning_seconds:g}s to provision one)")


def node_removal_seconds(timeline: list[Entry], added: set[str]) -> Optional[float]:
    """From DDS's first step in removing an added node (releasing its GPUs, or the removal itself) to the timeline
    seeing the Node gone: DDS's detaches, then Cluster API's Machine deletion, its hooks and the host's removal."""
    spans = []
    for name in added:
        started = [e.at for e in timeline if e.kind == "dds" and e.subject == f"node/{name}"
                   and ("is being removed" in e.text or e.text.startswith("RemovingNode"))]
        gone = [e.at for e in timeline if e.kind == "node" and e.subject == name and e.text == "removed from the cluster"]
        if started and gone:
            spans.append(gone[-1] - min(started))
    return round(max(spans), 1) if spans else None


def moments(timeline: list[Entry], merge_within: float = 1.5) -> list[Moment]:
    """DDS's and CA's Events a reader should see on the picture (MOMENTS); those close together share one mark."""
    marks: list[Moment] = []
    for entry in timeline:
        reason = entry.text.split(":", 1)[0]
        label = next((text for (kind, known, prefix), text in MOMENTS.items()
                      if entry.kind == kind and reason == known and entry.subject.startswith(prefix)), None)
        if label is None:
            continue
        if marks and entry.at - marks[-1].at <= merge_within:
            if label not in marks[-1].label:
                marks[-1] = Moment(marks[-1].at, f"{marks[-1].label}, {label}")
            continue
        marks.append(Moment(entry.at, label))
    return marks


def _total(samples: dict[str, float], name: str) -> float:
    return sum(v for k, v in samples.items() if k.startswith(name + "{") or k == name)


def memory_counted(samples: dict[str, float], name: str) -> int:
    """Bytes of CXL memory a chunk counter counts: each series' count times the size its model names."""
    return sum(int(v) * (chunk_bytes(model.group(1)) or 0) for k, v in samples.items()
               if k.startswith(name + "{") and (model := re.search(r'model="([^"]*)"', k)))


def run_demo(options: DemoOptions, out: Optional[TextIO] = sys.stdout, scenario: type["Demo"] = Demo) -> DemoResult:
    demo = scenario(options, out)
    try:
        demo.start()
        return demo.run()
    finally:
        demo.close()


def summary(result: DemoResult) -> str:
    return "\n".join([
        "",
        f"autoscaler:            {result.autoscaler}",
        f"nodes:                 {result.cluster_api} (kwok infrastructure provider)",
        f"GPU path:              1 pod Pending -> Running in {result.gpu_path_seconds:.1f}s (no node added for it)",
        f"{result.memory_path + ':':<22} 2 pods Pending -> Running in {result.node_path_seconds:.1f}s",
        f"GPUs attached by DDS:  {result.gpus_attached} ({result.gpus_attached_at_boot} at node boot, "
        f"{result.gpus_attached - result.gpus_attached_at_boot} for pending pods)",
        f"GPUs detached by DDS:  {result.gpus_detached} (idle past the cooldown, or with a removed node)",
        *([f"CXL memory by DDS:     {memory_text(result.memory_attached)} attached, "
           f"{memory_text(result.memory_detached)} detached"] if result.memory_attached else []),
        f"nodes added/removed:   {result.nodes_added} / {result.nodes_removed}",
        *([f"node removal:          {result.node_removal_seconds:.1f}s from DDS's decision to the Node gone (its GPUs "
           f"back in the pool first, then Cluster API's deletion)"] if result.node_removal_seconds is not None else []),
        f"logs and configs:      {result.workdir}",
        *([f"timeline picture:      {result.picture}"] if result.picture else []),
    ])


def _latency(value: str) -> tuple[float, float]:
    low, _, high = value.partition(":")
    return float(low), float(high or low)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, help="where logs and configs go (default: a new temporary directory)")
    parser.add_argument("--attach-latency", type=_latency, default=(4.0, 6.0), metavar="MIN:MAX")
    parser.add_argument("--node-provisioning", type=float, default=20.0, metavar="SECONDS")
    parser.add_argument("--json", action="store_true", help="print the result as JSON at the end")
    parser.add_argument("--dra", action="store_true",
                        help="the same demo with GPUs asked for through ResourceClaims (harness/demo_dra.py)")
    parser.add_argument("--cxl-memory", action="store_true",
                        help="the pool also holds CXL memory: the memory-heavy pods get memory attached to a worker "
                             "instead of a new node (harness/demo_cxl.py, docs/cxl-memory.md)")
    parser.add_argument("--fabric", choices=("simulated", "composability"), default="simulated",
                        help="composability: DDS drives the real CDI operator (harness/demo_cdi.py; DRA claims)")
    args = parser.parse_args(argv)
    import tempfile

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="dds-demo-"))
    options = DemoOptions(workdir=workdir, stack=StackOptions(attach_latency=args.attach_latency,
                                                              node_provisioning_seconds=args.node_provisioning))
    scenario: type[Demo] = Demo
    failures: tuple[type[Exception], ...] = (StackError,)
    if args.fabric == "composability":
        from harness.cdi_operator import CdiOperatorError
        from harness.demo_cdi import CdiDemo, cdi_demo_options

        options, scenario = cdi_demo_options(options), CdiDemo
        failures += (CdiOperatorError,)
    elif args.dra:
        from harness.demo_dra import DraDemo, dra_options

        options, scenario = dra_options(options), DraDemo
    elif args.cxl_memory:
        from harness.demo_cxl import CxlDemo, cxl_options

        options, scenario = cxl_options(options), CxlDemo
    try:
        result = run_demo(options, scenario=scenario)
    except failures as exc:
        print(f"\ndemo failed: {exc}\nlogs: {workdir}", file=sys.stderr)
        return 1
    print(summary(result))
    if args.json:
        print(json.dumps({k: v for k, v in result.__dict__.items()
                          if k not in ("timeline", "metrics", "decisions", "samples", "spans")}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
