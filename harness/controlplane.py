"""A real Kubernetes control plane as local processes, for integration tests, e2e tests and the demo.

etcd, kube-apiserver, kube-scheduler and kwok (the pinned builds of hack/build-binaries.sh) run on free loopback ports
under one work directory:

    workdir/kubeconfig            token user in system:masters (no RBAC in the way), CA of the serving certificate:
                                  for the tests' own setup and inspection only; DDS and cluster-autoscaler run with
                                  the ServiceAccount kubeconfigs of harness/rbac.py (the RBAC manifests/ ships)
    workdir/logs/<component>.log  each component's output (appended across an apiserver restart)
    workdir/logs/audit.log        the apiserver's audit log of ServiceAccounts' requests (harness/audit.py)
    workdir/pki/                  serving CA and certificate, service-account key, token file
    workdir/etcd/                 etcd's data

There is no kube-controller-manager: no garbage collection, no Deployment/ReplicaSet controllers, no node lifecycle, no
namespace controller (`ControlPlane.delete_namespace` does that controller's job for tests). Because nothing would ever
remove the `node.kubernetes.io/not-ready` taint, the TaintNodesByCondition admission plugin is off; ServiceAccount
admission is off too (no token controller). kwok manages the Nodes annotated `kwok.x-k8s.io/node: fake`
(`KWOK_NODE_ANNOTATION`): Ready at once, pods bound to them Running at once (harness/kwok_stages.yaml). kwok is
also their kubelet for the apiserver's exec: a kwok `Exec` object names the local command's environment, and kwok
runs where harness/bin overlays /usr/bin (harness/gpu_node_agent.py: nvidia-smi in a GPU node's driver pod).

No process outlives its ControlPlane: `stop()` (also the context manager's exit) terminates each component's process
group and kills what is left after a timeout; a finalizer and an atexit hook do the same if a test run forgets or
crashes; and when started from the main thread, children are told by the kernel to die with this process (SIGKILL'd
runs included).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import ctypes
import datetime
import errno
import functools
import itertools
import logging
import os
import secrets
import signal
import socket
import subprocess
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence

import requests
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from dds import certs
from harness import audit

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-binaries.sh"
KWOK_STAGES = Path(__file__).with_name("kwok_stages.yaml")
# kwok's Exec API, served so that an exec on a pod of a kwok node runs a local command (harness/gpu_node_agent.py).
KWOK_CRDS = Path(__file__).with_name("kwok_crds")
# Executables kwok's execs find at /usr/bin (harness/bin/nvidia-smi: the CDI operator runs /usr/bin/nvidia-smi).
HARNESS_BIN = Path(__file__).with_name("bin")
# Run in a private mount namespace before kwok: harness/bin overlays /usr/bin, and /run/nvidia/driver (where the CDI
# operator chroots in DRA mode) is this machine's root. $0 is harness/bin; nothing outside kwok's process sees it.
_KWOK_MOUNTS = ('mount -t overlay overlay -o "lowerdir=$0:/usr/bin" /usr/bin && mount -t tmpfs tmpfs /run'
                ' && mkdir -p /run/nvidia/driver && mount --rbind / /run/nvidia/driver && exec "$@"')
CRD_DIRECTORIES = (REPO_ROOT / "manifests" / "crds" / "cluster-api", REPO_ROOT / "manifests" / "crds" / "composability")
BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "kwok")
CONTROLLER_MANAGER = "kube-controller-manager"  # optional: start_control_plane(controller_manager=True)
# The 1.35 name of the controller (cmd/kube-controller-manager/names: ResourceClaimController; alias
# resource-claim-controller).
RESOURCE_CLAIM_CONTROLLER = "resourceclaim-controller"
# The Job controller (Jobs' pods made and counted): tests/e2e/test_kueue.py, where Kueue admits batch Jobs.
JOB_CONTROLLER = "job-controller"
# The garbage collector (dependents deleted with their owner): a deleted Job's Workload, ProvisioningRequest and pods.
GARBAGE_COLLECTOR = "garbage-collector-controller"

KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
ADMIN_USER = "dds-test-admin"
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"

BUILD_TIMEOUT_S = 3600.0  # a cold build of all five on 2 cores took 555 s here (module downloads included)
READY_TIMEOUT_S = 90.0  # per component; the apiserver's post-start hooks take a few seconds on a busy 2-core machine
CRD_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
LOG_TAIL_LINES = 40
_PROBE_TIMEOUT_S = 2.0
_POLL_S = 0.1


class ControlPlaneError(RuntimeError):
    """The control plane could not be built, started or used; the message says which component and shows its log."""


# --- binaries ---

def ensure_binaries(timeout: float = BUILD_TIMEOUT_S) -> Path:
    """Build (once; cached by version) the pinned binaries with hack/build-binaries.sh and return their directory: those
    of the Kubernetes profile $DDS_K8S_PROFILE names, else of hack/versions.env's default one (harness/versions.py)."""
    try:
        done = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=timeout,
                              start_new_session=True)
    except subprocess.TimeoutExpired as exc:
        raise ControlPlaneError(f"{BUILD_SCRIPT} did not finish in {timeout:.0f} s; its last output:\n"
                                f"{_tail_text(_as_text(exc.stderr))}") from exc
    if done.returncode != 0:
        raise ControlPlaneError(f"{BUILD_SCRIPT} failed with exit code {done.returncode}; its last output:\n"
                                f"{_tail_text(done.stderr)}")
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    if not lines:
        raise ControlPlaneError(f"{BUILD_SCRIPT} printed no bin directory; its last output:\n{_tail_text(done.stderr)}")
    bin_dir = Path(lines[-1].strip())
    _check_binaries(bin_dir)
    return bin_dir


def _check_binaries(bin_dir: Path) -> None:
    missing = [name for name in BINARIES if not os.access(bin_dir / name, os.X_OK)]
    if missing:
        raise ControlPlaneError(f"{bin_dir}: no executable {', '.join(missing)} (run `bash hack/build-binaries.sh`)")


# --- processes ---

def _parent_death_signal() -> Optional[Callable[[], None]]:
    """A preexec_fn asking the kernel to SIGKILL the child when the thread that forked it dies (Linux prctl).

    Only offered to the main thread: the kernel watches the forking *thread*, so a child started from a short-lived
    worker thread would die with that thread."""
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: the child only calls it
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def set_signal() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)

    return set_signal


class ManagedProcess:
    """One component: started in its own process group with output appended to its log; stopped with its group."""

    def __init__(self, name: str, argv: list[str], log_path: Path, env: Optional[dict[str, str]] = None) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self.env = env
        self._popen: Optional[subprocess.Popen[bytes]] = None

    @property
    def pid(self) -> Optional[int]:
        return self._popen.pid if self._popen else None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            out.write(f"=== {datetime.datetime.now().isoformat()} starting: {' '.join(self.argv)}\n".encode())
            out.flush()
            self._popen = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                           env=self.env, start_new_session=True,
                                           preexec_fn=_parent_death_signal())

    def exit_code(self) -> Optional[int]:
        """None while running (or never started)."""
        return self._popen.poll() if self._popen else None

    def running(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def terminate(self) -> None:
        self._signal_group(signal.SIGTERM)

    def wait_or_kill(self, deadline: float) -> None:
        """Wait for the exit until `deadline` (monotonic), then SIGKILL the whole group and reap."""
        if self._popen is None:
            return
        try:
            self._popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("%s (pid %d) ignored SIGTERM for %.0f s: killing it", self.name, self._popen.pid,
                        STOP_TIMEOUT_S)
            self._signal_group(signal.SIGKILL)
            self._popen.wait()
        # Children the component may have started share its group; nothing of it may stay behind.
        self._signal_group(signal.SIGKILL)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        self.terminate()
        self.wait_or_kill(time.monotonic() + timeout)

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            return _tail_text(self.log_path.read_text(errors="replace"), lines)
        except OSError as exc:
            return f"(log {self.log_path} unreadable: {exc})"

    def _signal_group(self, sig: signal.Signals) -> None:
        if self._popen is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._popen.pid, sig)


def _stop_all(processes: list[ManagedProcess], timeout: float = STOP_TIMEOUT_S) -> None:
    """Stop the components newest first, each after the one that depends on it: kube-apiserver with etcd still up
    exits in well under a second, while without etcd it spends its whole grace period trying to delete its Lease."""
    for process in reversed(processes):
        process.stop(timeout)


# --- ports, files ---

# Under pytest-xdist (`make test`) each worker picks its ports from a block of its own, below the kernel's ephemeral
# range: a port one worker chose and released until its component binds it cannot be taken by another worker (nor by an
# outgoing connection, which gets an ephemeral port). Within its block a worker goes round from a random start, so a
# port it released a moment ago is the last it reuses. Outside xdist (the demo, a single pytest) the kernel picks.
WORKER_PORT_BASE = 20000
WORKER_PORT_BLOCK = 400


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


@functools.lru_cache(maxsize=1)
def _worker_ports() -> Optional[Iterator[int]]:
    """The endless round of this xdist worker's port block ("gw3": the fourth block), or None outside xdist or when
    the block would reach into the ephemeral range."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or not worker[2:].isdigit():
        return None
    first = WORKER_PORT_BASE + int(worker[2:]) * WORKER_PORT_BLOCK
    if first + WORKER_PORT_BLOCK > _ephemeral_low():
        log.warning("xdist worker %s: no port block below the ephemeral range; the kernel picks its ports", worker)
        return None
    offset = secrets.randbelow(WORKER_PORT_BLOCK)
    return (first + (offset + step) % WORKER_PORT_BLOCK for step in itertools.count())


_worker_ports_lock = threading.Lock()


def free_ports(count: int) -> list[int]:
    """`count` distinct free loopback ports (held open together while choosing, so they differ); in a pytest-xdist
    worker, from the worker's own block."""
    with contextlib.ExitStack() as stack:
        sockets = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            _bind_free(sock)
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]


def _bind_free(sock: socket.socket) -> None:
    ports = _worker_ports()
    if ports is None:
        sock.bind(("127.0.0.1", 0))
        return
    with _worker_ports_lock:
        for _ in range(WORKER_PORT_BLOCK):
            port = next(ports)
            try:
                sock.bind(("127.0.0.1", port))  # no SO_REUSEADDR: a port still in TIME_WAIT is passed over too
                return
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
    raise ControlPlaneError(f"no free port left in this xdist worker's block "
                            f"({os.environ.get('PYTEST_XDIST_WORKER')}, {WORKER_PORT_BLOCK} ports)")


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    scheduler: int
    kwok: int

    @classmethod
    def pick(cls) -> "Ports":
        return cls(*free_ports(5))


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    serving_cert: Path
    serving_key: Path
    service_account_key: Path
    service_account_public_key: Path
    token_file: Path
    token: str

    @classmethod
    def write(cls, directory: Path) -> "Pki":
        """A serving CA and certificate for 127.0.0.1/localhost, a service-account key pair and an admin token."""
        directory.mkdir(parents=True, exist_ok=True)
        bundle = certs.generate_bundle(dns_names=["localhost"], ip_addresses=["127.0.0.1"], days=365)
        account_key = ec.generate_private_key(ec.SECP256R1())
        token = secrets.token_hex(24)
        pki = cls(ca_cert=directory / "ca.crt", serving_cert=directory / "apiserver.crt",
                  serving_key=directory / "apiserver.key", service_account_key=directory / "sa.key",
                  service_account_public_key=directory / "sa.pub", token_file=directory / "tokens.csv", token=token)
        pki.ca_cert.write_bytes(bundle.ca.cert_pem)
        pki.serving_cert.write_bytes(bundle.server.cert_pem)
        _write_private(pki.serving_key, bundle.server.key_pem)
        _write_private(pki.service_account_key, account_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        pki.service_account_public_key.write_bytes(account_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
        # token,user,uid,"group1,group2": system:masters passes every authorization check.
        _write_private(pki.token_file, f'{token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n'.encode())
        return pki


def _write_private(path: Path, content: bytes) -> None:
    path.write_bytes(content)
    path.chmod(0o600)


def kubeconfig_document(server: str, ca_pem: bytes, token: str) -> dict[str, Any]:
    """Self-contained (CA inline) so the file still works when copied elsewhere."""
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": "dds-test",
        "clusters": [{"name": "dds-test", "cluster": {
            "server": server, "certificate-authority-data": base64.b64encode(ca_pem).decode()}}],
        "users": [{"name": ADMIN_USER, "user": {"token": token}}],
        "contexts": [{"name": "dds-test", "context": {"cluster": "dds-test", "user": ADMIN_USER}}],
    }


def _tail_text(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _as_text(output: Any) -> str:
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""


# --- readiness ---

def _probe(session: requests.Session, url: str, expect: Optional[Callable[[requests.Response], bool]] = None
           ) -> Callable[[], str]:
    """A check returning "" when `url` answers 200 (and `expect` agrees), else why not."""
    def check() -> str:
        try:
            response = session.get(url, timeout=_PROBE_TIMEOUT_S)
        except requests.RequestException as exc:
            return f"GET {url}: {type(exc).__name__}"
        if response.status_code != 200:
            return f"GET {url}: {response.status_code} {response.text[:300]}"
        if expect is not None and not expect(response):
            return f"GET {url}: unexpected answer {response.text[:300]}"
        return ""
    return check


def _loopback_session() -> requests.Session:
    """A session that ignores the environment: REQUESTS_CA_BUNDLE would override the CA we set (requests gives the
    variable precedence over Session.verify), and an HTTPS_PROXY must not see loopback traffic."""
    session = requests.Session()
    session.trust_env = False
    return session


def _wait_ready(process: ManagedProcess, check: Callable[[], str], timeout: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    why = "not checked yet"
    while True:
        code = process.exit_code()
        if code is not None:
            raise ControlPlaneError(f"{process.name} exited with code {code} while starting; last lines of "
                                    f"{process.log_path}:\n{process.tail()}")
        why = check()
        if not why:
            return
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"{process.name} not ready after {timeout:.0f} s ({why}); last lines of "
                                    f"{process.log_path}:\n{process.tail()}")
        time.sleep(_POLL_S)


# --- the control plane ---

_LIVE: "weakref.WeakSet[ControlPlane]" = weakref.WeakSet()


@atexit.register
def _stop_forgotten_control_planes() -> None:
    for plane in list(_LIVE):
        plane.stop()


class ControlPlane:
    """Handle on a running control plane. Use `start_control_plane()` to get one."""

    def __init__(self, workdir: Path, bin_dir: Path, *, scheduler: bool = True, kwok: bool = True,
                 feature_gates: Optional[Mapping[str, bool]] = None, runtime_config: Sequence[str] = (),
                 controller_manager: bool = False, dra_binding_timeout_seconds: Optional[float] = None,
                 controllers: Sequence[str] = (RESOURCE_CLAIM_CONTROLLER,)) -> None:
        self.workdir = workdir
        # kube-scheduler's DynamicResources bindingTimeout (None: its default, 600 s): DRA pool mode's slow-fabric test.
        self.dra_binding_timeout_seconds = dra_binding_timeout_seconds
        # Alpha APIs are off by default (1.35: the Workload API's gangs, DRA binding conditions; 1.36: the Workload
        # API's gangs, DeviceTaintRules): a test that needs them names the gates, passed to every component, and the
        # API groups to serve. Which gates and group versions exist depends on the minor (docs/versions.md): a gate
        # that is gone, or a group version no longer registered, stops the apiserver at start with its name.
        self.feature_gates = dict(feature_gates or {})
        self.runtime_config = tuple(runtime_config)
        self.bin_dir = bin_dir
        self.kubeconfig = workdir / "kubeconfig"
        self.logs = workdir / "logs"
        # ServiceAccounts' requests only (harness/audit.py): a 403 to DDS or CA fails the test that caused it.
        self.audit_log = self.logs / "audit.log"
        audit.register(self.audit_log)
        self.ports = Ports.pick()
        self.server = f"https://127.0.0.1:{self.ports.apiserver}"
        self._pki = Pki.write(workdir / "pki")
        self.token = self._pki.token
        self._with_scheduler = scheduler
        self._with_kwok = kwok
        # Resolved once: a concurrent `hack/build-binaries.sh` re-creates the bin dir's symlinks, and a restart must
        # not depend on that moment.
        self._binaries = {name: (bin_dir / name).resolve() for name in BINARIES}
        # kube-controller-manager with only its resourceclaim controller (DRA: claims made from templates, released
        # when their pods end), or the `controllers` a test names; the other controllers' work is done by kwok, the
        # harness and DDS as before.
        self._with_controller_manager = controller_manager
        self._controllers = tuple(controllers)
        if controller_manager:
            self._binaries[CONTROLLER_MANAGER] = (bin_dir / CONTROLLER_MANAGER).resolve()
            self._controller_manager_port = free_ports(1)[0]
        self._processes: list[ManagedProcess] = []
        self._lock = threading.Lock()
        self._stopped = False
        self._session = _loopback_session()
        self._session.verify = str(self._pki.ca_cert)
        self._session.headers["Authorization"] = f"Bearer {self.token}"
        self._etcd = self._component("etcd", self._etcd_argv())
        self._apiserver = self._component("kube-apiserver", self._apiserver_argv())
        _LIVE.add(self)
        # A ControlPlane dropped without stop() still takes its processes down (the list, not self, is referenced).
        self._finalizer = weakref.finalize(self, _stop_all, self._processes)

    # -- public API --

    def server_version(self) -> str:
        """The running kube-apiserver's gitVersion ("v1.36.3"), as /version reports it."""
        return str(self._request("GET", "/version").json()["gitVersion"])

    def api_client(self) -> Any:
        """A new kubernetes.client.ApiClient for this control plane (one per caller: they are not shared)."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def restart_apiserver(self) -> None:
        """Stop kube-apiserver and start it again on the same port and etcd (data kept); return once it is ready."""
        began = time.time()
        with self._lock:
            self._check_not_stopped()
            self._apiserver.stop()
            self._apiserver.start()
        self._wait_apiserver_ready()
        # Until its RBAC informers have synced, a starting apiserver answers 403 to every ServiceAccount: not a
        # verdict on the roles, so harness/audit.py does not count those.
        audit.restarted(self.audit_log, began, time.time())

    def create_namespace(self, name: str, labels: Optional[dict[str, str]] = None) -> None:
        self._check_not_stopped()
        self._request("POST", "/api/v1/namespaces", json_body={
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}})

    def delete_namespace(self, name: str, timeout: float = 30.0) -> None:
        """Delete a namespace and everything in it, as the namespace controller (not running here) would.

        Each namespaced resource type the apiserver serves is emptied with a zero grace period (no kubelet will confirm
        a pod's end). An object a finalizer still holds has its finalizers cleared: whoever owned them belonged to
        the test that is over, and a leftover would show up in the next test's cluster-wide lists. Last, the
        namespace's own `kubernetes` finalizer is cleared so the namespace goes away."""
        self._check_not_stopped()
        path = f"/api/v1/namespaces/{name}"
        if self._request("DELETE", path, ok=(200, 202, 404)).status_code == 404:
            return
        for collection in self._namespaced_collections():
            self._empty_collection(collection.format(namespace=name))
        deadline = time.monotonic() + timeout
        while True:
            response = self._request("GET", path, ok=(200, 404))
            if response.status_code == 404:
                return
            namespace = response.json()
            if namespace["spec"].get("finalizers"):
                namespace["spec"]["finalizers"] = []
                self._request("PUT", f"{path}/finalize", json_body=namespace, ok=(200, 404, 409))
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"namespace {name} still exists {timeout:.0f} s after its deletion "
                                        f"(finalizers: {namespace['metadata'].get('finalizers')})")
            time.sleep(_POLL_S)

    def add_component(self, name: str, argv: list[str], env: Optional[dict[str, str]] = None) -> ManagedProcess:
        """A process of the test's own (e.g. the CDI operator, harness/cdi_operator.py), not yet started: its log is
        logs/<name>.log and it is stopped with this control plane, before the components it talks to."""
        self._check_not_stopped()
        return self._component(name, argv, env)

    def pids(self) -> dict[str, int]:
        """The process id of each component started (for checks that nothing is left behind)."""
        return {p.name: p.pid for p in self._processes if p.pid is not None}

    def stop(self) -> None:
        """Terminate every component, SIGKILL what is left after a timeout, reap all. Safe to call twice."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        _LIVE.discard(self)
        self._finalizer()  # runs _stop_all once and disarms the finalizer
        self._session.close()

    def __enter__(self) -> "ControlPlane":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"ControlPlane(server={self.server!r}, workdir={str(self.workdir)!r})"

    # -- startup --

    def _start(self, crds: bool) -> None:
        self._etcd.start()
        with _loopback_session() as plain:
            _wait_ready(self._etcd, _probe(plain, f"http://127.0.0.1:{self.ports.etcd_client}/health",
                                           lambda r: r.json().get("health") == "true"))
        self._apiserver.start()
        self._wait_apiserver_ready()
        self.kubeconfig.write_text(yaml.safe_dump(
            kubeconfig_document(self.server, self._pki.ca_cert.read_bytes(), self.token), sort_keys=False))
        self.kubeconfig.chmod(0o600)
        if self._with_scheduler:
            scheduler = self._component("kube-scheduler", self._scheduler_argv())
            scheduler.start()
            _wait_ready(scheduler, _probe(self._session, f"https://127.0.0.1:{self.ports.scheduler}/healthz"))
        if self._with_controller_manager:
            manager = self._component(CONTROLLER_MANAGER, self._controller_manager_argv())
            manager.start()
            _wait_ready(manager, _probe(self._session, f"https://127.0.0.1:{self._controller_manager_port}/healthz"))
        if self._with_kwok:
            self.install_crds([KWOK_CRDS])  # before kwok starts: it watches Execs from the start (--enable-crds)
            kwok = self._component("kwok", self._kwok_argv(), env=self._kwok_env())
            kwok.start()
            with _loopback_session() as plain:
                _wait_ready(kwok, _probe(plain, f"http://127.0.0.1:{self.ports.kwok}/healthz"))
        if crds:
            self.install_crds(CRD_DIRECTORIES)

    def _wait_apiserver_ready(self) -> None:
        readyz = _probe(self._session, f"{self.server}/readyz")
        # The system namespaces are created by a loop that may lag /readyz; tests use "default" at once.
        default_namespace = _probe(self._session, f"{self.server}/api/v1/namespaces/default")
        _wait_ready(self._apiserver, lambda: readyz() or default_namespace())

    def _component(self, name: str, argv: list[str], env: Optional[dict[str, str]] = None) -> ManagedProcess:
        process = ManagedProcess(name, argv, self.logs / f"{name}.log", env)
        self._processes.append(process)
        return process

    def _etcd_argv(self) -> list[str]:
        client_url = f"http://127.0.0.1:{self.ports.etcd_client}"
        peer_url = f"http://127.0.0.1:{self.ports.etcd_peer}"
        return [str(self._binaries["etcd"]), "--name=dds-test", f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={client_url}", f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=dds-test={peer_url}",
                "--unsafe-no-fsync=true",  # test data: durability is not worth the fsync latency
                "--log-level=warn"]

    def _apiserver_argv(self) -> list[str]:
        pki = self._pki
        return [str(self._binaries["kube-apiserver"]),
                f"--etcd-servers=http://127.0.0.1:{self.ports.etcd_client}",
                "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
                f"--secure-port={self.ports.apiserver}",
                f"--cert-dir={self.workdir / 'pki' / 'generated'}",
                f"--tls-cert-file={pki.serving_cert}", f"--tls-private-key-file={pki.serving_key}",
                f"--token-auth-file={pki.token_file}", "--authorization-mode=RBAC",
                f"--audit-policy-file={audit.write_policy(self.workdir / 'audit-policy.yaml')}",
                f"--audit-log-path={self.audit_log}", "--audit-log-format=json",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-signing-key-file={pki.service_account_key}",
                f"--service-account-key-file={pki.service_account_public_key}",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                "--endpoint-reconciler-type=none",  # a loopback advertise address is not a valid endpoint
                # No kube-controller-manager: nothing would lift the not-ready taint or mint SA tokens (module doc).
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
                "--allow-privileged=true",
                # Bounds the HTTP server's shutdown to 2 s; otherwise open watches (scheduler, kwok, tests) hold a
                # stop or restart for the whole request timeout (60 s).
                "--shutdown-send-retry-after=true",
                # Nodes' Hostname addresses are not resolvable names here; kwok posts InternalIP 127.0.0.1 and serves
                # exec as their kubelet (harness/gpu_node_agent.py).
                "--kubelet-preferred-address-types=InternalIP"] + self._gate_flags() + (
                    [f"--runtime-config={','.join(self.runtime_config)}"] if self.runtime_config else [])

    def _gate_flags(self) -> list[str]:
        if not self.feature_gates:
            return []
        gates = ",".join(f"{name}={'true' if on else 'false'}" for name, on in sorted(self.feature_gates.items()))
        return [f"--feature-gates={gates}"]

    def _scheduler_argv(self) -> list[str]:
        config = self.workdir / "kube-scheduler.yaml"
        settings: dict[str, Any] = {
            "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(self.kubeconfig)},
            "leaderElection": {"leaderElect": False}}
        if self.dra_binding_timeout_seconds is not None:
            settings["profiles"] = [{"schedulerName": "default-scheduler", "pluginConfig": [
                {"name": "DynamicResources", "args": {"bindingTimeout": f"{self.dra_binding_timeout_seconds:g}s"}}]}]
        config.write_text(yaml.safe_dump(settings))
        # /healthz is on the scheduler's always-allowed paths, so no delegated authn/authz kubeconfig is needed. It
        # serves with the apiserver's certificate (valid for 127.0.0.1), so the probe can verify it.
        return [str(self._binaries["kube-scheduler"]), f"--config={config}",
                "--bind-address=127.0.0.1", f"--secure-port={self.ports.scheduler}",
                f"--tls-cert-file={self._pki.serving_cert}", f"--tls-private-key-file={self._pki.serving_key}"
                ] + self._gate_flags()

    def _controller_manager_argv(self) -> list[str]:
        # Serves /healthz with the apiserver's certificate (valid for 127.0.0.1) so the probe can verify it.
        return [str(self._binaries[CONTROLLER_MANAGER]), f"--kubeconfig={self.kubeconfig}",
                f"--controllers={','.join(self._controllers)}", "--leader-elect=false",
                "--bind-address=127.0.0.1", f"--secure-port={self._controller_manager_port}",
                f"--tls-cert-file={self._pki.serving_cert}", f"--tls-private-key-file={self._pki.serving_key}"
                ] + self._gate_flags()

    def _kwok_argv(self) -> list[str]:
        key, value = KWOK_NODE_ANNOTATION
        argv = [f"--kubeconfig={self.kubeconfig}", f"--config={KWOK_STAGES}",
                f"--manage-nodes-with-annotation-selector={key}={value}",
                f"--server-address=127.0.0.1:{self.ports.kwok}",
                # The apiserver reaches kwok as the nodes' kubelet (exec, logs): InternalIP and kubeletEndpoint.
                "--node-ip=127.0.0.1", f"--node-port={self.ports.kwok}", "--enable-crds=Exec",
                "--node-lease-duration-seconds=40"]  # kubelet's default; kwok renews the Leases itself
        argv = [str(self._binaries["kwok"]), *argv]
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", _KWOK_MOUNTS, str(HARNESS_BIN),
                *argv] if _private_mounts_work() else argv

    def _kwok_env(self) -> dict[str, str]:
        # kwok reads ~/.kwok/kwok.yaml whenever it exists: a private HOME keeps a developer's file out of the tests.
        home = self.workdir / "kwok-home"
        home.mkdir(exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("KWOK_")}
        env["HOME"] = str(home)
        return env

    # -- CRDs --

    def install_crds(self, directories: Iterable[Path]) -> None:
        """Create (or replace) the CRDs listed by each directory's kustomization.yaml and wait until Established."""
        names = []
        for crd in _crd_documents(directories):
            names.append(crd["metadata"]["name"])
            path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
            response = self._request("POST", path, json_body=crd, ok=(201, 409))
            if response.status_code == 409:
                current = self._request("GET", f"{path}/{names[-1]}").json()
                crd = {**crd, "metadata": {**crd["metadata"],
                                           "resourceVersion": current["metadata"]["resourceVersion"]}}
                self._request("PUT", f"{path}/{names[-1]}", json_body=crd)
        for name in names:
            self._wait_established(name)

    def _wait_established(self, name: str) -> None:
        path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
        deadline = time.monotonic() + CRD_TIMEOUT_S
        while True:
            conditions = self._request("GET", path).json().get("status", {}).get("conditions") or []
            status = {c["type"]: c for c in conditions}
            if status.get("Established", {}).get("status") == "True":
                return
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"CRD {name} not Established after {CRD_TIMEOUT_S:.0f} s: {conditions}; "
                                        f"last lines of {self._apiserver.log_path}:\n{self._apiserver.tail()}")
            time.sleep(_POLL_S)

    # -- REST helpers --

    def _namespaced_collections(self) -> list[str]:
        """URL templates (`{namespace}` placeholder) of every namespaced resource that supports deletecollection."""
        group_versions = ["/api/v1"]
        for group in self._request("GET", "/apis").json().get("groups", []):
            group_versions.append(f"/apis/{group['preferredVersion']['groupVersion']}")
        collections = []
        for prefix in group_versions:
            for resource in self._request("GET", prefix, ok=(200, 404, 503)).json().get("resources", []):
                if (resource.get("namespaced") and "/" not in resource["name"]
                        and "deletecollection" in resource.get("verbs", [])):
                    collections.append(f"{prefix}/namespaces/{{namespace}}/{resource['name']}")
        return collections

    def _empty_collection(self, collection: str) -> None:
        options = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0,
                   "propagationPolicy": "Background"}
        response = self._request("DELETE", collection, json_body=options, ok=(200, 404, 405))
        if response.status_code != 200:
            return
        # The answer lists what was deleted; an object with finalizers is among them, only marked for deletion.
        for item in response.json().get("items") or []:
            if item.get("metadata", {}).get("finalizers"):
                log.info("clearing finalizers %s of %s/%s", item["metadata"]["finalizers"], collection,
                         item["metadata"]["name"])
                self._request("PATCH", f"{collection}/{item['metadata']['name']}",
                              json_body={"metadata": {"finalizers": None}}, ok=(200, 404),
                              content_type="application/merge-patch+json")

    def _request(self, method: str, path: str, json_body: Any = None, ok: tuple[int, ...] = (200, 201),
                 content_type: str = "application/json") -> requests.Response:
        try:
            response = self._session.request(method, f"{self.server}{path}", json=json_body, timeout=30,
                                             headers={"Content-Type": content_type})
        except requests.RequestException as exc:
            raise ControlPlaneError(f"{method} {path}: {exc}") from exc
        if response.status_code not in ok:
            raise ControlPlaneError(f"{method} {path}: {response.status_code} {response.text[:500]}")
        return response

    def _check_not_stopped(self) -> None:
        if self._stopped:
            raise ControlPlaneError(f"{self!r} was stopped")


def _crd_documents(directories: Iterable[Path]) -> Iterator[dict[str, Any]]:
    for directory in directories:
        kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text()) or {}
        for entry in kustomization.get("resources", []):
            for document in yaml.safe_load_all((directory / entry).read_text()):
                if document and document.get("kind") == "CustomResourceDefinition":
                    yield document


def start_control_plane(workdir: Path, *, scheduler: bool = True, kwok: bool = True, crds: bool = True,
                        bin_dir: Optional[Path] = None, feature_gates: Optional[Mapping[str, bool]] = None,
                        runtime_config: Sequence[str] = (), controller_manager: bool = False,
                        dra_binding_timeout_seconds: Optional[float] = None,
                        controllers: Sequence[str] = (RESOURCE_CLAIM_CONTROLLER,)) -> ControlPlane:
    """Start etcd and kube-apiserver (plus kube-scheduler, kwok, and the CRDs DDS uses, unless told not to) under
    `workdir`, wait until each is ready, and return the handle. On failure nothing is left running and the error
    shows the failing component's log tail.

    Ports are picked free just before the start; if another process takes one in between, the start is tried once
    more on new ports."""
    bin_dir = bin_dir or ensure_binaries()
    _check_binaries(bin_dir)
    for attempt in (1, 2):
        attempt_dir = workdir if attempt == 1 else workdir / f"retry-{attempt}"
        attempt_dir.mkdir(parents=True, exist_ok=True)
        plane = ControlPlane(attempt_dir, bin_dir, scheduler=scheduler, kwok=kwok, feature_gates=feature_gates,
                             runtime_config=runtime_config, controller_manager=controller_manager,
                             dra_binding_timeout_seconds=dra_binding_timeout_seconds, controllers=controllers)
        try:
            plane._start(crds)
            return plane
        except BaseException as exc:
            plane.stop()
            if attempt == 1 and isinstance(exc, ControlPlaneError) and _port_taken(str(exc)):
                log.warning("a port was taken while the control plane started; retrying on new ports: %s", exc)
                continue
            raise
    raise AssertionError("unreachable")


@functools.lru_cache(maxsize=1)
def _private_mounts_work() -> bool:
    """Whether kwok can run under _KWOK_MOUNTS here (root with CAP_SYS_ADMIN, overlayfs). Without it, an exec on a
    GPU node's driver pod fails with "no such file" for /usr/bin/nvidia-smi, and the log says why."""
    try:
        probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", _KWOK_MOUNTS,
                                str(HARNESS_BIN), "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("kwok runs without the harness/bin overlay (execs of /usr/bin/nvidia-smi will fail): %s", exc)
        return False
    if probe.returncode != 0:
        log.warning("kwok runs without the harness/bin overlay (execs of /usr/bin/nvidia-smi will fail): %s",
                    probe.stderr.decode(errors="replace").strip())
    return probe.returncode == 0


def _port_taken(message: str) -> bool:
    return "address already in use" in message or os.strerror(errno.EADDRINUSE).lower() in message.lower()
