"""CoHDI's composable-resource-operator (the CDI operator of the talk) as a local process on a harness ControlPlane.

The operator runs as shipped: the binary hack/build-binaries.sh builds from the pinned upstream source (`cro-manager`),
its own CRDs, RBAC and webhook configuration from the same source tree (copied beside the binary in the cache, never
kept in this repository), `CDI_PROVIDER_TYPE=FTI_CDI` against one of the FTI APIs (`FabricManagerAccess.api`): the
fabric manager (`FTI_CDI_API_TYPE=FM`, harness/fabric_manager.py) or the cluster manager (`FTI_CDI_API_TYPE=CM`,
harness/cluster_manager.py), and `DEVICE_RESOURCE_TYPE` either `DEVICE_PLUGIN` or `DRA`.

`CdiOperator.start()` prepares the cluster the way an operator install would:

- the operator's CRDs (config/crd/bases) and the third-party CRDs it reads (harness/crds: the GPU operator's
  ClusterPolicy, Metal3's Metal3Machine and BareMetalHost, OpenShift's Machine), each waited for until Established;
- namespace `composable-resource-operator-system` with Secret `credentials` (the fabric manager's OIDC login), the GPU
  operator's namespace with a ClusterPolicy whose driver is enabled and the two DaemonSets the operator restarts;
- its RBAC (config/rbac, rendered with the namespace and name prefix of config/default/kustomization.yaml) bound to
  its ServiceAccount, whose token (TokenRequest API) is the operator's only credential: it runs under the shipped
  role, not as an admin, plus a separate ClusterRole of the few rules the shipped role lacks (MISSING_RBAC_RULES);
- a serving certificate for its admission webhook in `$TMPDIR/k8s-webhook-server/serving-certs` (controller-runtime's
  default, TMPDIR private to this instance) and the ValidatingWebhookConfiguration of config/webhook pointing at
  `https://127.0.0.1:9443` with that certificate's CA.

Then it starts the process (own process group, log under the control plane's logs/, stopped with the control plane)
and returns once its /readyz answers and its webhook serves TLS. The webhook port is fixed at 9443 on all interfaces by
the operator, so one operator at a time runs in a network namespace (the machine's, or a parallel test worker's own:
harness/netns.py); a taken port is a clear error, never a silent clash.

Modes, as this upstream commit behaves:
- DRA: a node's fabric machine is its providerID `fsas-cdi://<uuid>`; detaches need the alpha DeviceTaintRule API
  (DRA_FEATURE_GATES / DRA_RUNTIME_CONFIG on the control plane; checked at install).
- DEVICE_PLUGIN (needs FTI_CDI_CLUSTER_ID, composableresource_adapter.go:58-61): a node's machine is found through
  the Node's `machine.openshift.io/machine` annotation (harness/gpu_node_agent.py creates the chain). With the FM API
  the client then GETs a cluster-api-provider-metal3 Metal3Machine (internal/cdi/fti/fm/client.go:416-430), a type the
  manager's scheme (cmd/main.go:48, 52-59) does not register: every attach, detach, health check and upstream sync
  fails before any fabric request with `no kind is registered for the type v1beta1.Metal3Machine` (docs/
  composability.md, "Known issues"). With the CM API the client reads OpenShift's Machine as unstructured and then
  the BareMetalHost (cm/client.go getNodeMachineID): that works, so DEVICE_PLUGIN mode runs with the CM API.
"""

from __future__ import annotations

import base64
import contextlib
import enum
import errno
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import requests
import yaml

from dds import certs
from harness.controlplane import ControlPlane, ManagedProcess, free_ports
from harness.install import RBAC_COLLECTIONS, AdminApi, as_installed, yaml_documents
# Restarted by the operator after an attach or detach in DEVICE_PLUGIN mode (internal/controller); the node agent
# plays their pods.
from harness.gpu_node_agent import GPU_OPERATOR_DAEMONSETS

OPERATOR_BINARY = "cro-manager"
# config/default/kustomization.yaml of the operator: every object of its install gets this namespace and name prefix.
OPERATOR_NAMESPACE = "composable-resource-operator-system"
NAME_PREFIX = "composable-resource-operator-"
SERVICE_ACCOUNT = f"{NAME_PREFIX}controller-manager"
CREDENTIALS_SECRET = "credentials"  # name and namespace are fixed in the operator (internal/cdi/fti/token.go)
DEFAULT_GPU_OPERATOR_NAMESPACE = "gpu-operator"  # the operator's default for NVIDIA_GPU_OPERATOR_NAMESPACE
CLUSTER_POLICY_NAME = "cluster-policy"
WEBHOOK_PORT = 9443  # controller-runtime's default; cmd/main.go does not change it
WEBHOOK_CERT_SUBDIR = Path("k8s-webhook-server") / "serving-certs"
THIRD_PARTY_CRDS = Path(__file__).with_name("crds")
# In DRA mode every detach goes through a DeviceTaintRule, which the operator writes as resource.k8s.io/v1alpha3: alpha
# in Kubernetes 1.35 (gate DRADeviceTaints), and in 1.36 still served as v1alpha3 only on request (DRADeviceTaints is
# beta and on there; setting it is harmless). The control plane must serve it
# (start_control_plane(..., feature_gates=DRA_FEATURE_GATES, runtime_config=DRA_RUNTIME_CONFIG)).
DRA_FEATURE_GATES = {"DRADeviceTaints": True}
DRA_RUNTIME_CONFIG = ("resource.k8s.io/v1alpha3=true",)
_DEVICE_TAINT_RULES = "/apis/resource.k8s.io/v1alpha3"

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
_POLL_S = 0.1


class CdiOperatorError(RuntimeError):
    """The operator could not be installed, started or reached; the message says why and shows its log's tail."""


class WebhookPortTaken(CdiOperatorError):
    """Another operator (another test run's) holds the fixed webhook port: only one runs in a network at a time."""


class DeviceResourceType(str, enum.Enum):
    """How the operator expects a node to expose an attached GPU (its env DEVICE_RESOURCE_TYPE)."""

    DEVICE_PLUGIN = "DEVICE_PLUGIN"  # node capacity nvidia.com/gpu; needs FTI_CDI_CLUSTER_ID and the Metal3 mapping
    DRA = "DRA"  # ResourceSlices of the vendor's DRA driver; a node's machine comes from providerID fsas-cdi://<uuid>


class FtiApi(str, enum.Enum):
    """Which FTI API the operator's CDI client speaks (its env FTI_CDI_API_TYPE)."""

    FM = "FM"  # the fabric manager (harness/fabric_manager.py): DRA mode only at this commit
    CM = "CM"  # the cluster manager (harness/cluster_manager.py): the one that attaches in DEVICE_PLUGIN mode


@dataclass(frozen=True)
class FabricManagerAccess:
    """How the operator reaches the fabric manager (the emulator in tests) and logs in to it."""

    endpoint: str  # host:port[/path/] as FTI_CDI_ENDPOINT: the operator prepends https:// and appends "/" if missing
    ca_file: Path  # PEM of the CA that signed the fabric manager's certificate (the operator trusts system roots only)
    tenant_id: str
    username: str
    password: str
    client_id: str
    client_secret: str
    realm: str
    # FTI_CDI_CLUSTER_ID; required by the operator in DEVICE_PLUGIN mode, where a node's machine id is then found
    # through Metal3 (node annotation -> Machine -> BareMetalHost). Empty: from the node's providerID (FM, DRA only).
    cluster_id: str = ""
    api: FtiApi = FtiApi.FM

    @classmethod
    def of(cls, emulator: Any, cluster_id: str = "") -> "FabricManagerAccess":
        """The access to a started emulator: harness.fabric_manager.FabricManagerEmulator (FM API), or
        harness.cluster_manager.ClusterManagerEmulator (CM API, whose cluster id is the emulator's own)."""
        from harness.cluster_manager import ClusterManagerEmulator

        login = emulator.credentials
        api = FtiApi.CM if isinstance(emulator, ClusterManagerEmulator) else FtiApi.FM
        if api is FtiApi.CM:
            cluster_id = cluster_id or emulator.cluster_uuid
        return cls(endpoint=emulator.endpoint, ca_file=Path(emulator.ca_cert_path), tenant_id=emulator.tenant_uuid,
                   username=login.username, password=login.password, client_id=login.client_id,
                   client_secret=login.client_secret, realm=login.realm, cluster_id=cluster_id, api=api)

    def credentials(self) -> dict[str, str]:
        return {"username": self.username, "password": self.password, "client_id": self.client_id,
                "client_secret": self.client_secret, "realm": self.realm}


@dataclass(frozen=True)
class OperatorRelease:
    """The built operator and the install files of the same upstream tree, as hack/build-binaries.sh caches them:
    <cache>/cro-manager-<commit>/{cro-manager, config/crd/bases/, config/rbac/, config/webhook/manifests.yaml}."""

    binary: Path
    crd_dir: Path
    rbac_dir: Path
    webhook_manifest: Path

    @classmethod
    def locate(cls, bin_dir: Path) -> "OperatorRelease":
        link = bin_dir / OPERATOR_BINARY
        if not os.access(link, os.X_OK):
            raise CdiOperatorError(f"{bin_dir}: no executable {OPERATOR_BINARY} (run `bash hack/build-binaries.sh`; it "
                                   f"builds the operator from shared/third_party)")
        # Resolved once: a concurrent build re-creates the bin dir's symlinks.
        binary = link.resolve()
        config = binary.parent / "config"
        release = cls(binary=binary, crd_dir=config / "crd" / "bases", rbac_dir=config / "rbac",
                      webhook_manifest=config / "webhook" / "manifests.yaml")
        missing = [str(path) for path in (release.crd_dir, release.rbac_dir / "kustomization.yaml",
                                          release.webhook_manifest) if not path.exists()]
        if missing:
            raise CdiOperatorError(f"the operator build in {binary.parent} lacks its install files {missing}; "
                                   f"delete that folder and run `bash hack/build-binaries.sh` again")
        return release

    def crds(self) -> list[dict[str, Any]]:
        return [doc for path in sorted(self.crd_dir.glob("*.yaml")) for doc in yaml_documents(path)
                if doc.get("kind") == "CustomResourceDefinition"]

    def rbac(self) -> list[dict[str, Any]]:
        """config/rbac's objects as config/default installs them: in the operator's namespace, names prefixed."""
        kustomization = yaml.safe_load((self.rbac_dir / "kustomization.yaml").read_text()) or {}
        entries = kustomization.get("resources", [])
        return [_as_installed(doc) for entry in entries for doc in yaml_documents(self.rbac_dir / entry)]

    def validating_webhooks(self, ca_pem: bytes) -> list[dict[str, Any]]:
        """config/webhook's ValidatingWebhookConfiguration, each webhook sent to this machine's port 9443."""
        configurations = []
        for doc in yaml_documents(self.webhook_manifest):
            if doc.get("kind") != "ValidatingWebhookConfiguration":
                raise CdiOperatorError(f"{self.webhook_manifest}: unexpected {doc.get('kind')} (only validating "
                                       f"webhooks are registered by the harness)")
            doc["metadata"]["name"] = NAME_PREFIX + doc["metadata"]["name"]
            for webhook in doc.get("webhooks", []):
                path = webhook["clientConfig"]["service"].get("path", "/")
                webhook["clientConfig"] = {"url": f"https://127.0.0.1:{WEBHOOK_PORT}{path}",
                                           "caBundle": base64.b64encode(ca_pem).decode()}
            configurations.append(doc)
        return configurations


def _as_installed(obj: dict[str, Any]) -> dict[str, Any]:
    return as_installed(obj, NAME_PREFIX, OPERATOR_NAMESPACE, CdiOperatorError)


# What the operator calls but its shipped role (config/rbac/role.yaml at CRO_COMMIT) does not grant: each was seen
# refused (403) in the test control plane's audit log. A refusal does not just fail one call: the operator reads through
# controller-runtime's cache, whose informer retries the forbidden list forever while the reconcile waits for it, so
# the ComposableResource controller's only worker hangs and no device attaches or detaches any more. Granted by a
# ClusterRole of its own beside the shipped RBAC, named for what it is, so the gap stays visible;
# `grant_missing_rbac=False` runs the shipped RBAC alone. tests/unit/testing/test_cdi_operator_install.py checks that
# upstream still lacks each rule.
MISSING_RBAC_ROLE = f"{NAME_PREFIX}rbac-missing-upstream"
MISSING_RBAC_RULES: list[dict[str, Any]] = [
    # DRA mode, every detach: a DeviceTaintRule keeps the GPU from new claims while it is drained (utils.
    # CreateDeviceTaint / DeleteDeviceTaint). The API itself is alpha in Kubernetes 1.35 (gate DRADeviceTaints,
    # resource.k8s.io/v1alpha3): without it served, no detach in DRA mode completes ("no matches for kind").
    {"apiGroups": ["resource.k8s.io"], "resources": ["devicetaintrules"],
     "verbs": ["get", "list", "watch", "create", "delete"]},
    # Whether a node has a driver, when no nvidia-driver pod runs on it (utils.getClusterPolicy lists ClusterPolicies).
    {"apiGroups": ["nvidia.com"], "resources": ["clusterpolicies"], "verbs": ["get", "list", "watch"]},
    # DRA mode, every attach and detach: the DRA driver's kubelet-plugin pod on the node is deleted so that it
    # republishes the node's GPUs (utils.TerminateKubeletPluginPodOnNode), unless that pod is under 10 s old. Refused,
    # an attach still completes (the error is only recorded) but every detach stops there and retries forever.
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]},
]


def missing_rbac() -> list[dict[str, Any]]:
    """The ClusterRole of MISSING_RBAC_RULES and its binding to the operator's ServiceAccount."""
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": MISSING_RBAC_ROLE},
         "rules": MISSING_RBAC_RULES},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": MISSING_RBAC_ROLE},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": MISSING_RBAC_ROLE},
         "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": OPERATOR_NAMESPACE}]},
    ]


# Collection URL of each kind the harness creates ({namespace} filled from the object).
_COLLECTIONS = {
    ("v1", "Namespace"): "/api/v1/namespaces",
    ("v1", "Secret"): "/api/v1/namespaces/{namespace}/secrets",
    **RBAC_COLLECTIONS,
    ("apps/v1", "DaemonSet"): "/apis/apps/v1/namespaces/{namespace}/daemonsets",
    ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration"):
        "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"):
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
    ("nvidia.com/v1", "ClusterPolicy"): "/apis/nvidia.com/v1/clusterpolicies",
}


class CdiOperator:
    """Handle on the operator process and its install. Use as a context manager, or call start() and stop()."""

    def __init__(self, plane: ControlPlane, fabric: FabricManagerAccess, *,
                 device_resource_type: DeviceResourceType = DeviceResourceType.DRA,
                 gpu_operator_namespace: str = DEFAULT_GPU_OPERATOR_NAMESPACE, leader_elect: bool = False,
                 grant_missing_rbac: bool = True, bin_dir: Optional[Path] = None) -> None:
        device_resource_type = DeviceResourceType(device_resource_type)
        if device_resource_type is DeviceResourceType.DEVICE_PLUGIN and not fabric.cluster_id:
            # The operator refuses this itself, but only at its first reconcile, deep in a status error.
            raise CdiOperatorError("DEVICE_PLUGIN mode needs FabricManagerAccess.cluster_id (the operator's "
                                   "FTI_CDI_CLUSTER_ID): without it the operator supports DRA only")
        if fabric.api is FtiApi.CM and not fabric.cluster_id:
            # The CM client puts the cluster id in every path (cm/client.go); empty, every call would be a 404.
            raise CdiOperatorError("the cluster-manager API (FTI_CDI_API_TYPE=CM) needs FabricManagerAccess."
                                   "cluster_id (the operator's FTI_CDI_CLUSTER_ID)")
        self.plane = plane
        self.fabric = fabric
        self.device_resource_type = device_resource_type
        self.gpu_operator_namespace = gpu_operator_namespace
        self.leader_elect = leader_elect
        self.grant_missing_rbac = grant_missing_rbac
        self.release = OperatorRelease.locate(bin_dir or plane.bin_dir)
        self.workdir = plane.workdir / "cdi-operator"
        self.tmpdir = self.workdir / "tmp"
        self.kubeconfig = self.workdir / "kubeconfig"
        self.webhook_ca: Optional[bytes] = None
        self._apiserver_ca = self.workdir / "apiserver-ca.crt"
        self._probe_port = free_ports(1)[0]
        self._process: Optional[ManagedProcess] = None
        self._webhooks: list[dict[str, Any]] = []
        self._api: Optional[AdminApi] = None

    # -- public API --

    @property
    def pid(self) -> Optional[int]:
        return self._process.pid if self._process else None

    @property
    def log_path(self) -> Path:
        return self.plane.logs / f"{OPERATOR_BINARY}.log"

    @property
    def readyz_url(self) -> str:
        return f"http://127.0.0.1:{self._probe_port}/readyz"

    def running(self) -> bool:
        return self._process is not None and self._process.running()

    def log_tail(self, lines: int = 40) -> str:
        return self._process.tail(lines) if self._process else "(the operator was never started)"

    def start(self) -> "CdiOperator":
        """Install (idempotent), start the process and wait until it is ready; returns self."""
        self.install()
        self._launch()
        return self

    def start_when_port_free(self, wait_s: float) -> "CdiOperator":
        """`start`, waiting up to `wait_s` while another run's operator holds the fixed webhook port."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return self.start()
            except WebhookPortTaken:
                if time.monotonic() > deadline:
                    raise
                time.sleep(5)

    def install(self) -> None:
        """Everything the operator needs in the cluster and on disk, without starting it."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._write_apiserver_ca()
        api = self._admin_api()
        if self.device_resource_type is DeviceResourceType.DRA:
            _check_device_taint_rules_served(api)
        self._install_crds(api)
        self._install_prerequisites(api)
        for obj in self.release.rbac():
            api.apply(obj)
        if self.grant_missing_rbac:
            for obj in missing_rbac():
                api.apply(obj)
        self._write_kubeconfig(api)
        self._install_webhook(api)

    def restart(self) -> None:
        """Stop the operator gracefully (SIGTERM) and start it again; return once it is ready."""
        self._stop_process()
        self._launch()

    def kill(self) -> None:
        """SIGKILL the operator (a crash: no graceful shutdown) and reap it. `restart()` or `start()` brings it back."""
        if self._process is None or self._process.pid is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, signal.SIGKILL)
        self._process.wait_or_kill(time.monotonic() + STOP_TIMEOUT_S)

    def stop(self) -> None:
        """Stop the process and unregister its webhook (with failurePolicy Fail, a registered webhook nobody serves
        would refuse every ComposabilityRequest write). The rest of the install stays. Safe to call twice."""
        self._stop_process()
        if self._api is not None:
            with contextlib.suppress(CdiOperatorError):  # the control plane may already be down
                for configuration in self._webhooks:
                    self._api.delete(configuration)
            self._api.close()
            self._api = None

    def __enter__(self) -> "CdiOperator":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return (f"CdiOperator(pid={self.pid}, mode={self.device_resource_type.value}, api={self.fabric.api.value}, "
                f"fabric={self.fabric.endpoint!r}, log={str(self.log_path)!r})")

    # -- install --

    def _admin_api(self) -> AdminApi:
        if self._api is None:
            self._api = AdminApi(self.plane, self._apiserver_ca, _COLLECTIONS, CdiOperatorError)
        return self._api

    def _write_apiserver_ca(self) -> None:
        kubeconfig = yaml.safe_load(self.plane.kubeconfig.read_text())
        ca_data = kubeconfig["clusters"][0]["cluster"]["certificate-authority-data"]
        self._apiserver_ca.write_bytes(base64.b64decode(ca_data))

    def _install_crds(self, api: AdminApi) -> None:
        third_party = [doc for entry in (yaml.safe_load((THIRD_PARTY_CRDS / "kustomization.yaml").read_text())
                                         or {}).get("resources", [])
                       for doc in yaml_documents(THIRD_PARTY_CRDS / entry)]
        crds = self.release.crds() + third_party
        for crd in crds:
            api.apply(crd)
        for crd in crds:
            api.wait_established(crd["metadata"]["name"])

    def _install_prerequisites(self, api: AdminApi) -> None:
        for namespace in (OPERATOR_NAMESPACE, self.gpu_operator_namespace):
            api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        api.apply({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                   "metadata": {"name": CREDENTIALS_SECRET, "namespace": OPERATOR_NAMESPACE},
                   "stringData": self.fabric.credentials()})
        api.apply({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": CLUSTER_POLICY_NAME},
                   "spec": {"driver": {"enabled": True}}})
        for name, image in GPU_OPERATOR_DAEMONSETS.items():
            api.apply(_daemonset(self.gpu_operator_namespace, name, image))

    def _write_kubeconfig(self, api: AdminApi) -> None:
        """A kubeconfig holding a token of the operator's ServiceAccount (TokenRequest API): no admin rights."""
        document = api.service_account_kubeconfig(OPERATOR_NAMESPACE, SERVICE_ACCOUNT, "cdi-operator")
        self.kubeconfig.write_text(yaml.safe_dump(document, sort_keys=False))
        self.kubeconfig.chmod(0o600)

    def _install_webhook(self, api: AdminApi) -> None:
        bundle = certs.generate_bundle(dns_names=["localhost"], ip_addresses=["127.0.0.1"], days=30)
        cert_dir = self.tmpdir / WEBHOOK_CERT_SUBDIR
        cert_dir.mkdir(parents=True, exist_ok=True)
        (cert_dir / "tls.crt").write_bytes(bundle.server.cert_pem)
        key = cert_dir / "tls.key"
        key.write_bytes(bundle.server.key_pem)
        key.chmod(0o600)
        self.webhook_ca = bundle.ca.cert_pem
        (self.workdir / "webhook-ca.crt").write_bytes(bundle.ca.cert_pem)
        self._webhooks = self.release.validating_webhooks(bundle.ca.cert_pem)
        for configuration in self._webhooks:
            api.apply(configuration)

    # -- the process --

    def _argv(self) -> list[str]:
        return [str(self.release.binary), f"--kubeconfig={self.kubeconfig}",
                "--metrics-bind-address=0",  # the shipped default: off
                f"--health-probe-bind-address=127.0.0.1:{self._probe_port}",
                # One instance per test: without leader election a restarted operator reconciles at once instead of
                # waiting out the previous instance's Lease (15 s), and /readyz then means "reconciling".
                f"--leader-elect={'true' if self.leader_elect else 'false'}"]

    def _env(self) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.workdir),
            "TMPDIR": str(self.tmpdir),  # controller-runtime looks for the webhook certificate under it
            "SSL_CERT_FILE": str(self.fabric.ca_file),  # the FM client trusts the system roots: this file is them
            "ENABLE_WEBHOOKS": "true",
            "DEVICE_RESOURCE_TYPE": self.device_resource_type.value,
            "CDI_PROVIDER_TYPE": "FTI_CDI",
            "FTI_CDI_API_TYPE": self.fabric.api.value,
            "FTI_CDI_ENDPOINT": self.fabric.endpoint,
            "FTI_CDI_TENANT_ID": self.fabric.tenant_id,
            "NVIDIA_GPU_OPERATOR_NAMESPACE": self.gpu_operator_namespace,
        }
        if self.fabric.cluster_id:
            env["FTI_CDI_CLUSTER_ID"] = self.fabric.cluster_id
        return env

    def _launch(self) -> None:
        _check_webhook_port_free()
        if self._process is None:
            self._process = self.plane.add_component(OPERATOR_BINARY, self._argv(), env=self._env())
        self._process.start()
        try:
            self._wait_ready()
        except BaseException:
            self._stop_process()
            raise

    def _stop_process(self) -> None:
        if self._process is not None and self._process.running():
            self._process.stop(STOP_TIMEOUT_S)

    def _wait_ready(self) -> None:
        assert self._process is not None
        session = requests.Session()
        session.trust_env = False
        checks: list[Callable[[], str]] = [_probe(session, self.readyz_url),
                                           _webhook_probe(session, self.workdir / "webhook-ca.crt")]
        deadline = time.monotonic() + READY_TIMEOUT_S
        try:
            while True:
                code = self._process.exit_code()
                if code is not None:
                    raise CdiOperatorError(self._exit_message(code))
                why = next((reason for reason in (check() for check in checks) if reason), "")
                if not why:
                    return
                if time.monotonic() > deadline:
                    raise CdiOperatorError(f"{OPERATOR_BINARY} not ready after {READY_TIMEOUT_S:.0f} s ({why}); last "
                                           f"lines of {self.log_path}:\n{self.log_tail()}")
                time.sleep(_POLL_S)
        finally:
            session.close()

    def _exit_message(self, code: int) -> str:
        tail = self.log_tail()
        if "address already in use" in tail and f":{WEBHOOK_PORT}" in tail:
            return (f"{OPERATOR_BINARY} could not listen on its webhook port {WEBHOOK_PORT} (fixed by the operator): "
                    f"another process took it; last lines of {self.log_path}:\n{tail}")
        return f"{OPERATOR_BINARY} exited with code {code} while starting; last lines of {self.log_path}:\n{tail}"


def _check_device_taint_rules_served(api: AdminApi) -> None:
    answer = api.request("GET", _DEVICE_TAINT_RULES, ok=(200, 404))
    served = {resource["name"] for resource in answer.json().get("resources", [])} if answer.ok else set()
    if "devicetaintrules" not in served:
        raise CdiOperatorError(
            "the CDI operator in DRA mode detaches through DeviceTaintRules (resource.k8s.io/v1alpha3), which this "
            "control plane does not serve: start it with feature_gates=DRA_FEATURE_GATES and "
            "runtime_config=DRA_RUNTIME_CONFIG (harness/cdi_operator.py), or every detach would hang")


def _daemonset(namespace: str, name: str, image: str) -> dict[str, Any]:
    """One of the GPU operator's DaemonSets. No DaemonSet controller runs in the harness: it schedules nothing and the
    operator's restart of it is a no-op, as on a cluster whose nodes carry no GPU yet, unless the GPU node agent plays
    its pods (NodeTimings.plugin_restart_s, harness/gpu_node_agent.py)."""
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": name, "namespace": namespace},
            "spec": {"selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"nodeSelector": {"nvidia.com/gpu.present": "true"},
                                           "containers": [{"name": name, "image": image}]}}}}


def _check_webhook_port_free() -> None:
    """The operator listens on :9443 (all interfaces); fail before starting it if something already does."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As Go's listener does: a port held only by connections in TIME_WAIT is free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", WEBHOOK_PORT))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            raise WebhookPortTaken(
                f"port {WEBHOOK_PORT} is taken ({_listener_of(WEBHOOK_PORT)}): the CDI operator serves its admission "
                f"webhook there (fixed by the operator, all interfaces), so only one operator can run in this network "
                f"namespace at a time") from exc


def _listener_of(port: int) -> str:
    """Who listens on `port`, from /proc (best effort: another user's process shows as unknown)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # 0A: LISTEN
                    inodes.add(f"socket:[{fields[9]}]")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                return f"by pid {proc.name}: {command[:300]}"
    return "by a process this user cannot see"


def _probe(session: requests.Session, url: str) -> Callable[[], str]:
    def check() -> str:
        try:
            response = session.get(url, timeout=2)
        except requests.RequestException as exc:
            return f"GET {url}: {type(exc).__name__}"
        return "" if response.status_code == 200 else f"GET {url}: {response.status_code} {response.text[:200]}"
    return check


def _webhook_probe(session: requests.Session, ca_file: Path) -> Callable[[], str]:
    """Ready once the webhook server completes a TLS handshake with the registered CA: any HTTP answer will do."""
    url = f"https://127.0.0.1:{WEBHOOK_PORT}/readyz"

    def check() -> str:
        try:
            session.get(url, timeout=2, verify=str(ca_file))
        except requests.RequestException as exc:
            return f"webhook {url}: {type(exc).__name__}"
        return ""
    return check
