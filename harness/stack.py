"""The whole DDS stack on this machine, for `make demo`, the e2e tests and the reliability campaign.

    control plane (etcd, kube-apiserver, kube-scheduler, kwok; harness/controlplane.py)
    + Cluster API: its own manager (harness/capi.py, as shipped: its CRDs, conversion and admission webhooks,
      ServiceAccount and RBAC) and the hardware's stand-in, the kwok infrastructure provider (harness/kwok_provider.py,
      in this process: killing DDS does not stop machines from being made)
    + MachineSet default/gpu-workers (manifests/examples as v1beta2, with short cooldowns), its template on the
      provider's KwokMachineTemplate shaped as DDS's group template
    + DDS: `python -m dds serve --config ...` as a process of its own, on mutual TLS, restartable and killable, with
      its ServiceAccount's kubeconfig (`dds_kubeconfig`: the RBAC of manifests/dds, harness/rbac.py)
    + the real cluster-autoscaler (--cloud-provider=externalgrpc; $DDS_CLUSTER_AUTOSCALER or the binary cache, the
      pinned version only: harness/autoscaler.py), with the ServiceAccount of manifests/cluster-autoscaler

`StackOptions.dds_settings` overrides any DDS setting (e.g. a different fabric backend, fault injection).
"""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import yaml
from kubernetes import client

from dds import certs
from dds.config import Settings
from dds.model.groups import ANN_GPU_IDLE_COOLDOWN, ANN_NODE_IDLE_COOLDOWN
from harness import kwok_provider, rbac
from harness.autoscaler import AutoscalerHandle, free_port, start_autoscaler
from harness.controlplane import RESOURCE_CLAIM_CONTROLLER
from harness.kwok_provider import KWOK_PROVIDER_IDS, ProviderIds

ROOT = Path(__file__).resolve().parents[1]
MACHINESET_FILE = ROOT / "manifests" / "examples" / "machineset-gpu-workers.yaml"
GPU = "nvidia.com/gpu"
WORKLOAD_NAMESPACE = "demo"
PROVISIONING_REQUEST_CRDS = ROOT / "tests" / "e2e" / "crds" / "provisioningrequests"
DDS_NAMESPACE = "dds-system"


class StackError(RuntimeError):
    """A part of the stack did not start or a wait timed out; the message carries what was seen and log tails."""


@dataclass(frozen=True)
class StackOptions:
    attach_latency: tuple[float, float] = (4.0, 6.0)  # seconds; the talk's hardware takes tens of seconds
    detach_latency: tuple[float, float] = (2.0, 3.0)
    node_provisioning_seconds: float = 20.0  # stands for the tens of minutes a real server takes
    gpu_idle_cooldown_seconds: float = 15.0
    node_idle_cooldown_seconds: float = 20.0
    pool_size: int = 8
    workers: int = 2
    dds_settings: dict[str, Any] = field(default_factory=dict)  # merged over the defaults below (nested dicts too)
    dds_env: dict[str, str] = field(default_factory=dict)  # added to the first DDS process's environment
    autoscaler: bool = True
    autoscaler_binary: Optional[Path] = None  # None: $DDS_CLUSTER_AUTOSCALER, else the binary cache
    autoscaler_timings: dict[str, float] = field(default_factory=dict)
    # Merged over the example MachineSet's annotations, e.g. {"dds.cdi.dev/template-mode": "observed"}.
    machineset_annotations: dict[str, str] = field(default_factory=dict)
    # Passed to kube-apiserver and kube-scheduler, e.g. {"GenericWorkload": True, "GangScheduling": True} with
    # runtime_config ("scheduling.k8s.io/v1alpha1=true",) for the 1.35 Workload API.
    feature_gates: dict[str, bool] = field(default_factory=dict)
    runtime_config: tuple[str, ...] = ()
    # kube-controller-manager's resourceclaim controller (DRA claim templates, claims released when pods end).
    controller_manager: bool = False
    # The controllers it runs (with `controller_manager`): e.g. the Job controller for Kueue's batch Jobs.
    controllers: tuple[str, ...] = (RESOURCE_CLAIM_CONTROLLER,)
    # ProvisioningRequests served (docs/kueue.md): their CRD (vendored from cluster-autoscaler) installed before DDS
    # starts, and cluster-autoscaler run with --enable-provisioning-requests under the RBAC that flag needs
    # (manifests/cluster-autoscaler/provisioning-requests).
    provisioning_requests: bool = False
    # kube-scheduler's DynamicResources bindingTimeout (None: its default); DDS is told the same
    # (dra_binding_timeout_seconds) by the test that sets it.
    dra_binding_timeout_seconds: Optional[float] = None
    # The providerIDs the infrastructure provider gives its hosts and their Nodes (kwok://<name> by default).
    provider_ids: ProviderIds = KWOK_PROVIDER_IDS
    # The hardware's side of a real fabric backend, entered once the control plane runs and before the MachineSet and
    # DDS exist, closed with the stack: called with the Stack, returns a context manager (harness/cdi_stack.py: the
    # fabric-manager emulator, the GPU node agent and the real CDI operator).
    fabric_side: Optional[Callable[["Stack"], Any]] = None


def machineset(options: StackOptions) -> dict:
    """The example MachineSet (manifests/examples) with `workers` replicas and cooldowns short enough to watch."""
    obj = copy.deepcopy(yaml.safe_load(MACHINESET_FILE.read_text()))
    obj["spec"]["replicas"] = options.workers
    annotations = obj["metadata"]["annotations"]
    annotations[ANN_GPU_IDLE_COOLDOWN] = f"{options.gpu_idle_cooldown_seconds:g}s"
    annotations[ANN_NODE_IDLE_COOLDOWN] = f"{options.node_idle_cooldown_seconds:g}s"
    annotations.update(options.machineset_annotations)
    return obj


def cluster_api_machineset(options: StackOptions) -> dict:
    """The stack's MachineSet as Cluster API's manager gets it: the example on kwok hosts."""
    from harness.kwok_provider import on_kwok_hosts

    return on_kwok_hosts(machineset(options))


def group_of(obj: dict) -> Any:
    """The DDS node group a MachineSet object is, as DDS parses it."""
    from harness.kwok_provider import node_group

    try:
        return node_group(obj)
    except ValueError as exc:
        raise StackError(f"the stack's MachineSet is no DDS group: {exc}") from exc


def pod(name: str, memory_gib: int, gpus: int = 0, cpu: str = "1", namespace: str = WORKLOAD_NAMESPACE) -> dict:
    limits = {GPU: str(gpus)} if gpus else {}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/part-of": "dds-demo"}},
        "spec": {
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"requests": {"cpu": cpu, "memory": f"{memory_gib}Gi", **limits},
                                          "limits": limits}}],
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
        },
    }


DEFAULT_FABRIC = "simulated"


def merge(base: dict, overrides: dict) -> dict:
    out = dict(base)
    for key, value in overrides.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def dds_settings(options: StackOptions, kubeconfig: Path, tls_dir: Path, grpc_port: int, metrics_port: int) -> dict:
    def latency(pair: tuple[float, float]) -> dict:
        return {"min": pair[0], "max": pair[1]}

    base = {
        "listen": f"127.0.0.1:{grpc_port}",
        "metrics_listen": f"127.0.0.1:{metrics_port}",
        "tls_cert": str(tls_dir / certs.SERVER_CERT),
        "tls_key": str(tls_dir / certs.SERVER_KEY),
        "tls_ca": str(tls_dir / certs.CLIENT_CA_CERT),
        "grpc_allowed_clients": [certs.CLIENT_COMMON_NAME],  # the client certificate `certs.generate_bundle` gives CA
        "kubeconfig": str(kubeconfig),
        "namespace": DDS_NAMESPACE,
        "loop_interval_seconds": 1.0,
        "max_node_provision_seconds": max(120.0, options.node_provisioning_seconds * 4),
        "fabric": DEFAULT_FABRIC,  # kwok nodes: the simulated fabric is allowed on them (no default in DDS)
        # The stack's MachineSets live in namespace default; its tests choose pools and short cooldowns freely (a
        # test of the grants themselves, tests/e2e/test_adversarial_node_groups.py, adds namespaces of its own).
        "node_group_namespaces": {"default": {"pools": ["*"], "min_idle_cooldown_seconds": 0}},
        "simulated_fabric": {
            "pools": [{"name": "default", "devices": {"A30": options.pool_size}}],
            "attach_latency": latency(options.attach_latency),
            "detach_latency": latency(options.detach_latency),
        },
    }
    return merge(base, options.dds_settings)


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class DdsProcess:
    """One `dds serve` process: its log, its /metrics, and how to stop it (politely or with SIGKILL)."""

    process: subprocess.Popen
    log_path: Path
    metrics_url: str

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def metrics(self, timeout: float = 5.0) -> dict[str, float]:
        """The `dds_` samples of /metrics, keyed by name{labels} as Prometheus prints them."""
        text = urllib.request.urlopen(self.metrics_url + "/metrics", timeout=timeout).read().decode()
        out = {}
        for line in text.splitlines():
            if line.startswith("dds_"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def decisions(self) -> list[dict[str, Any]]:
        """The decision journal (/decisions?format=json), newest first."""
        import json

        return json.loads(urllib.request.urlopen(self.metrics_url + "/decisions?format=json", timeout=5).read())

    def ready(self) -> bool:
        try:
            return urllib.request.urlopen(self.metrics_url + "/readyz", timeout=2).status == 200
        except OSError:
            return False

    def alive(self) -> bool:
        try:
            return urllib.request.urlopen(self.metrics_url + "/healthz", timeout=2).status == 200
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, as when a node dies or the OOM killer strikes."""
        if self.running:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.running:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def start_dds(config_path: Path, log_path: Path, metrics_port: int, *, wait_ready: bool = True,
              timeout: float = 60.0, extra_args: tuple[str, ...] = (),
              env: Optional[dict[str, str]] = None) -> DdsProcess:
    """Start `dds serve`; wait until /readyz answers 200 (started: every replica, leader or standby), or with
    wait_ready=False only until /healthz does (live, maybe still starting)."""
    command = [sys.executable, "-m", "dds", "serve", "--config", str(config_path), *extra_args]
    with log_path.open("ab") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    handle = DdsProcess(process, log_path, f"http://127.0.0.1:{metrics_port}")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise StackError(f"dds serve exited with {process.returncode}:\n{tail(log_path)}")
        if handle.ready() if wait_ready else handle.alive():
            return handle
        time.sleep(0.3)
    handle.stop()
    raise StackError(f"dds serve not {'ready' if wait_ready else 'live'} within {timeout:.0f}s:\n{tail(log_path)}")


class Stack:
    """Started by `start_stack`; `close()` (or leaving the `with`) stops every part, newest first."""

    def __init__(self, workdir: Path, options: StackOptions) -> None:
        self.workdir = workdir
        self.options = options
        self._exit = ExitStack()
        self.dds: Optional[DdsProcess] = None
        self.autoscaler: Optional[AutoscalerHandle] = None
        self._clusters: set[tuple[str, str]] = set()  # (namespace, name) of the workload clusters made

    def __enter__(self) -> "Stack":
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._exit.close()

    def _start(self) -> None:
        from harness.controlplane import start_control_plane

        self.workdir.mkdir(parents=True, exist_ok=True)
        self.control_plane = self._exit.enter_context(start_control_plane(
            self.workdir / "control-plane", feature_gates=self.options.feature_gates,
            runtime_config=self.options.runtime_config, controller_manager=self.options.controller_manager,
            dra_binding_timeout_seconds=self.options.dra_binding_timeout_seconds,
            controllers=self.options.controllers))
        if self.options.provisioning_requests:
            self.control_plane.install_crds([PROVISIONING_REQUEST_CRDS])
        self.api = self.control_plane.api_client()
        self.core = client.CoreV1Api(self.api)
        for namespace in (DDS_NAMESPACE, WORKLOAD_NAMESPACE):
            self.core.create_namespace({"metadata": {"name": namespace}})
        # DDS and CA never get the admin kubeconfig: their ServiceAccounts under the RBAC manifests/ ships, DDS's with
        # only what its fabric (and reservations, when on) ships with: another fabric's grant is refused here.
        self.dds_kubeconfig = rbac.install(self.control_plane, rbac.dds_for(
            self.options.dds_settings.get("fabric", DEFAULT_FABRIC),
            reservations=bool(self.options.dds_settings.get("reservations",
                                                            Settings.model_fields["reservations"].default))))
        self.autoscaler_kubeconfig = rbac.install(self.control_plane, rbac.autoscaler_for(
            provisioning_requests=self.options.provisioning_requests))
        self.tls_dir = self.workdir / "tls"
        self.grpc_port = free_port()
        bundle = certs.generate_bundle(["localhost"], ["127.0.0.1"], days=1)
        certs.write_bundle(self.tls_dir, bundle, certs.CloudConfigOptions(address=f"127.0.0.1:{self.grpc_port}",
                                                                          files_dir=str(self.tls_dir)))
        self.fabric_side = (self._exit.enter_context(self.options.fabric_side(self))
                            if self.options.fabric_side is not None else None)
        self._start_cluster_api()
        self.config_path = self.write_dds_config("dds.yaml", self.grpc_port)
        self.dds = self.start_dds(env=self.options.dds_env or None)
        self._exit.callback(lambda: self.dds.stop() if self.dds else None)
        if self.options.autoscaler:
            self.start_autoscaler()

    def _start_cluster_api(self) -> None:
        """Cluster API's manager (stopped with the control plane) and the kwok provider; the workload cluster the
        example MachineSet names; its hosts shaped as DDS's group template; the MachineSet as v1beta2."""
        from harness.capi import ClusterApiManager

        self.cluster_api = ClusterApiManager(self.control_plane).start()
        self._exit.callback(self.cluster_api.stop)
        admin = self.cluster_api.admin_api()
        kwok_provider.install(admin)
        self.provider = kwok_provider.KwokInfrastructureProvider(
            self.control_plane.api_client(), provisioning_delay_seconds=self.options.node_provisioning_seconds,
            active=self.cluster_api.running, provider_ids=self.options.provider_ids).start()
        self._exit.callback(self.provider.stop)
        self.add_node_group(machineset(self.options))

    def add_node_group(self, obj: dict, plural: str = "machinesets", api: Optional[client.ApiClient] = None) -> dict:
        """Create a MachineSet (or MachineDeployment) of the stack's workload cluster on kwok hosts shaped as its DDS
        group's template node (a KwokMachineTemplate of its name); `api` writes it (default: the admin); returns what
        the apiserver stored."""
        obj = kwok_provider.on_kwok_hosts(obj)
        cluster = (obj["metadata"]["namespace"], obj["spec"]["clusterName"])
        if cluster not in self._clusters:  # its workload cluster, made once
            kwok_provider.install_cluster(self.cluster_api.admin_api(), *cluster)
            self._clusters.add(cluster)
        gpu_label = self.options.dds_settings.get("gpu_label", Settings.model_fields["gpu_label"].default)
        kwok_provider.create_template(self.cluster_api.admin_api(), kwok_provider.template_for(obj, gpu_label))
        version = obj["apiVersion"].rpartition("/")[2]
        return client.CustomObjectsApi(api or self.api).create_namespaced_custom_object(
            "cluster.x-k8s.io", version, obj["metadata"]["namespace"], plural, obj)

    @contextmanager
    def machines_paused(self) -> Iterator[None]:
        """Cluster API makes no Machine for the stack's MachineSet meanwhile, as when its controllers are still
        reconnecting after an outage."""
        obj = cluster_api_machineset(self.options)
        with kwok_provider.machineset_paused(self.api, obj["metadata"]["namespace"], obj["metadata"]["name"]):
            yield

    # --- DDS ---
    def write_dds_config(self, name: str, grpc_port: int, **overrides: Any) -> Path:
        """A settings file for one DDS replica; `overrides` win over the stack's settings."""
        metrics_port = free_port()
        settings = merge(dds_settings(self.options, self.dds_kubeconfig, self.tls_dir, grpc_port, metrics_port),
                         overrides)
        path = self.workdir / name
        path.write_text(yaml.safe_dump(settings, sort_keys=False))
        return path

    def start_dds(self, config_path: Optional[Path] = None, log_name: str = "dds.log",
                  wait_ready: bool = True, env: Optional[dict[str, str]] = None) -> DdsProcess:
        """`env` is added to this process's environment (e.g. DDS_CRASH_AT, dds/crashpoints.py)."""
        config_path = config_path or self.config_path
        metrics_port = int(yaml.safe_load(config_path.read_text())["metrics_listen"].rsplit(":", 1)[1])
        return start_dds(config_path, self.workdir / log_name, metrics_port, wait_ready=wait_ready, env=env)

    def restart_dds(self, kill: bool = True, env: Optional[dict[str, str]] = None) -> DdsProcess:
        """SIGKILL (or stop) the DDS process and start a new one on the same settings and state."""
        if self.dds is not None:
            self.dds.kill() if kill else self.dds.stop()
        self.dds = self.start_dds(env=env)
        return self.dds

    # --- the autoscaler ---
    def start_autoscaler(self) -> AutoscalerHandle:
        timings = {"scan_interval": 2.0,
                   "max_node_provision_time": max(120.0, self.options.node_provisioning_seconds * 4),
                   "scale_down_unneeded_time": 30.0, "scale_down_delay_after_add": 30.0,
                   **self.options.autoscaler_timings}
        handle = start_autoscaler(self.autoscaler_kubeconfig, self.tls_dir / certs.CLOUD_CONFIG,
                                  self.workdir / "autoscaler", binary=self.options.autoscaler_binary,
                                  bin_dir=self.control_plane.bin_dir,
                                  control_plane_version=self.control_plane.server_version(),
                                  extra_flags=(("--enable-provisioning-requests",)
                                               if self.options.provisioning_requests else ()), **timings)
        self.autoscaler = handle
        self._exit.callback(handle.stop)
        return handle

    # --- looking ---
    def wait_for(self, what: str, predicate: Callable[[], Any], timeout: float,
                 describe: Callable[[], str] = lambda: "", interval: float = 0.5) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            self.check_alive()
            time.sleep(interval)
        raise StackError(f"timed out after {timeout:.0f}s waiting for {what}; {describe()}\n"
                         f"DDS log tail:\n{tail(self.dds.log_path) if self.dds else '(no DDS)'}")

    def check_alive(self) -> None:
        if self.dds is not None and not self.dds.running:
            raise StackError(f"dds serve exited with {self.dds.process.returncode}:\n{tail(self.dds.log_path)}")
        if self.autoscaler is not None and not self.autoscaler.running():
            raise StackError(f"the autoscaler stopped; see {self.autoscaler.log_path}")

    def nodes(self) -> list[Any]:
        return self.core.list_node().items

    def pods(self, namespace: str = WORKLOAD_NAMESPACE) -> list[Any]:
        return self.core.list_namespaced_pod(namespace).items


def start_stack(workdir: Path, options: StackOptions = StackOptions()) -> Stack:
    stack = Stack(Path(workdir), options)
    try:
        stack._start()
    except BaseException:
        stack.close()
        raise
    return stack


def gpus_allocatable(node: Any) -> int:
    return int((node.status.allocatable or {}).get(GPU, "0"))


def is_ready(node: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or ())
