"""Kueue's manager (sigs.k8s.io/kueue, cmd/kueue) as a local process on a harness ControlPlane.

It runs as shipped: the binary hack/build-binaries.sh builds from the pinned Go module (`kueue`, KUEUE_VERSION in
hack/versions.env; cached as <cache>/kueue-<version>/, not per Kubernetes profile), and the install files of the same
release, cached beside it under config/ (never kept in this repository), installed as config/default would
(namespace `kueue-system`, name prefix `kueue-`):

- its CRDs (config/crd/bases) with the conversion webhooks config/crd/kustomization.yaml patches in;
- its RBAC (config/rbac): the manager's only credential is a TokenRequest token of its ServiceAccount
  `kueue-controller-manager` — the shipped roles, not an admin;
- its admission webhooks (config/webhook, with that kustomization's namespaceSelectors), and the Secret
  (config/internalcert) its internal certificate management fills. As shipped, Kueue makes its own serving
  certificate (for `kueue-webhook-service.kueue-system.svc`) and injects its CA into the webhook configurations and the
  CRDs' conversion webhooks itself.

Two things a cluster's nodes do are done by the harness, as no kubelet or kube-proxy runs here. Kueue's certificate
rotation (open-policy-agent/cert-controller) writes its certificate into the Secret and then waits for the Secret's
files to appear in its certificate directory, which in a cluster is the Secret volume the kubelet mounts: `SecretVolume`
keeps the directory in step with the Secret, as that volume does. And the Service `kueue-webhook-service` the webhooks
name is of type ExternalName, `127.0.0.1`, and every webhook's service port is the port this instance's webhook server
listens on. kube-apiserver resolves an ExternalName Service to that host and still verifies the certificate against
the Service's DNS name (k8s.io/apiserver pkg/util/proxy ResolveCluster; pkg/util/webhook/client.go), so the webhook
TLS is checked exactly as in a cluster. (Turning internal certificate management off is not an option here: Kueue then
reads a metrics certificate from the fixed path /etc/kueue/metrics/certs, cmd/kueue/main.go.)

The Configuration (`configuration`) enables only the batch/job integration (the other frameworks' webhooks are served
as no-ops, as Kueue does for disabled integrations), no leader election, no visibility server (VisibilityOnDemand off:
it would serve an aggregated API nobody here asks), metrics off, every port free per instance. Kueue sets up its
ProvisioningRequest admission check only when the ProvisioningRequest API is served when it starts
(cmd/kueue/main.go, provisioning.ServerSupportsProvisioningRequest): install that CRD first.

`start()` returns once /readyz answers (certificates made, webhook server listening) and a dry-run write through the
apiserver has passed Kueue's webhook; each wait is bounded. `stop()` unregisters the webhooks (failurePolicy Fail:
unserved, they would refuse every Job and Pod write).
"""

from __future__ import annotations

import base64
import copy
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import requests
import yaml

from harness import versions
from harness.controlplane import ControlPlane, free_ports
from harness.controlplane import _wait_ready as wait_for_component
from harness.install import (CUSTOM_RESOURCE_DEFINITIONS, RBAC_COLLECTIONS, AdminApi, ManagerProcess, as_installed,
                             yaml_documents)

MANAGER_BINARY = "kueue"
# config/default/kustomization.yaml: every object of the install gets this namespace and name prefix.
NAMESPACE = "kueue-system"
NAME_PREFIX = "kueue-"
SERVICE_ACCOUNT = f"{NAME_PREFIX}controller-manager"
WEBHOOK_SERVICE = f"{NAME_PREFIX}webhook-service"
WEBHOOK_SECRET = f"{NAME_PREFIX}webhook-server-cert"
# The host the ExternalName Service sends the apiserver to (a Service's externalName must be a DNS-1123 subdomain,
# which this address is).
WEBHOOK_HOST = "127.0.0.1"
API = "/apis/kueue.x-k8s.io/v1beta2"
# The admission check controller of Kueue's ProvisioningRequests (pkg/controller/admissionchecks/provisioning).
PROVISIONING_CHECK_CONTROLLER = "kueue.x-k8s.io/provisioning-request"
FRAMEWORKS = ("batch/job",)
FEATURE_GATES = {"VisibilityOnDemand": False}

READY_TIMEOUT_S = 120.0  # certificates made, CA bundles injected, caches synced: slow on a loaded machine
STOP_TIMEOUT_S = 10.0


class KueueError(RuntimeError):
    """Kueue could not be installed, started or reached; the message says why and shows its log's tail."""


@dataclass(frozen=True)
class KueueRelease:
    """The built manager and its release's install files, as hack/build-binaries.sh caches them:
    <cache>/kueue-<version>/{kueue, config/{crd,rbac,webhook,internalcert}}."""

    version: str
    binary: Path
    config: Path

    @classmethod
    def locate(cls, cache_dir: Path) -> "KueueRelease":
        """The pinned release in the binary cache `cache_dir` (the parent of a profile's bin dir)."""
        pins = versions.read_pins(versions.SHARED_PINS)
        version = pins.get("KUEUE_VERSION", "")
        if not version:
            raise KueueError(f"{versions.SHARED_PINS} pins no KUEUE_VERSION")
        folder = Path(cache_dir) / f"kueue-{version}"
        release = cls(version=version, binary=folder / MANAGER_BINARY, config=folder / "config")
        if not os.access(release.binary, os.X_OK):
            raise KueueError(f"no executable {release.binary} (run `bash hack/build-binaries.sh`; it builds Kueue "
                             f"{version} from the Go module proxy)")
        wanted = [release.config / part / "kustomization.yaml" for part in ("crd", "rbac", "webhook", "internalcert")]
        missing = [str(path) for path in wanted if not path.is_file()]
        if missing:
            raise KueueError(f"the Kueue build in {folder} lacks its install files {missing}; delete that folder and "
                             f"run `bash hack/build-binaries.sh` again")
        return release

    def _kustomization(self, part: str) -> dict[str, Any]:
        return yaml.safe_load((self.config / part / "kustomization.yaml").read_text()) or {}

    def crds(self, webhook_port: int) -> list[dict[str, Any]]:
        """config/crd's CRDs, with the conversion webhook each of its patches enables, on the webhook Service."""
        crd_dir = self.config / "crd"
        kustomization = self._kustomization("crd")
        crds = {doc["metadata"]["name"]: doc for entry in kustomization.get("resources", [])
                for doc in yaml_documents(crd_dir / entry)}
        for patch in kustomization.get("patches", []):
            for doc in yaml_documents(crd_dir / patch["path"]):
                name = doc["metadata"]["name"]
                if name not in crds:
                    raise KueueError(f"{crd_dir / patch['path']} patches CRD {name}, which config/crd lacks")
                conversion = copy.deepcopy(doc["spec"]["conversion"])
                _to_local_service(conversion["webhook"]["clientConfig"], webhook_port)
                crds[name]["spec"]["conversion"] = conversion
        return list(crds.values())

    def rbac(self) -> list[dict[str, Any]]:
        """config/rbac's objects as config/default installs them."""
        rbac_dir = self.config / "rbac"
        return [as_installed(doc, NAME_PREFIX, NAMESPACE, KueueError)
                for entry in self._kustomization("rbac").get("resources", [])
                for doc in yaml_documents(rbac_dir / entry)]

    def webhook_secret(self) -> dict[str, Any]:
        """config/internalcert's Secret, which Kueue's certificate rotation fills."""
        [secret] = [doc for entry in self._kustomization("internalcert").get("resources", [])
                    for doc in yaml_documents(self.config / "internalcert" / entry) if doc["kind"] == "Secret"]
        secret["metadata"] = {"name": NAME_PREFIX + secret["metadata"]["name"], "namespace": NAMESPACE}
        return secret

    def webhooks(self, webhook_port: int) -> list[dict[str, Any]]:
        """config/webhook's Mutating- and ValidatingWebhookConfigurations as config/default installs them (names
        prefixed, that kustomization's per-webhook namespaceSelectors merged in), each on the webhook Service."""
        webhook_dir = self.config / "webhook"
        kustomization = self._kustomization("webhook")
        configurations = [doc for entry in kustomization.get("resources", [])
                          for doc in yaml_documents(webhook_dir / entry)
                          if doc["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")]
        for patch in kustomization.get("patches", []):
            _merge_webhook_patch(configurations, yaml.safe_load(patch["patch"]))
        for configuration in configurations:
            configuration["metadata"]["name"] = NAME_PREFIX + configuration["metadata"]["name"]
            for webhook in configuration.get("webhooks", []):
                _to_local_service(webhook["clientConfig"], webhook_port)
        return configurations


def _to_local_service(client_config: dict[str, Any], port: int) -> None:
    """A clientConfig naming config/'s `webhook-service` in `system`, as installed: the prefixed Service in Kueue's
    namespace, on this instance's webhook port."""
    service = client_config["service"]
    service.update(name=WEBHOOK_SERVICE, namespace=NAMESPACE, port=port)


def _merge_webhook_patch(configurations: list[dict[str, Any]], patch: dict[str, Any]) -> None:
    """A strategic-merge patch of config/webhook/kustomization.yaml: webhooks matched by name, their selectors set
    (the only fields those patches touch; anything else is refused rather than ignored)."""
    target = next((c for c in configurations
                   if (c["kind"], c["metadata"]["name"]) == (patch["kind"], patch["metadata"]["name"])), None)
    if target is None:
        raise KueueError(f"config/webhook's kustomization patches {patch['kind']} {patch['metadata']['name']}, "
                         f"which manifests.yaml lacks")
    by_name = {webhook["name"]: webhook for webhook in target.get("webhooks", [])}
    for change in patch.get("webhooks", []):
        unknown = set(change) - {"name", "namespaceSelector", "objectSelector"}
        if unknown or change["name"] not in by_name:
            raise KueueError(f"config/webhook's kustomization patches webhook {change['name']} with {sorted(change)}; "
                             f"the harness merges only namespaceSelector and objectSelector of known webhooks")
        by_name[change["name"]].update({key: value for key, value in change.items() if key != "name"})


_ADMISSION = "admissionregistration.k8s.io/v1"
# Collection paths of the kinds the install creates ({namespace} filled from the object).
COLLECTIONS = {
    **RBAC_COLLECTIONS,
    ("v1", "Namespace"): "/api/v1/namespaces",
    ("v1", "Secret"): "/api/v1/namespaces/{namespace}/secrets",
    ("v1", "Service"): "/api/v1/namespaces/{namespace}/services",
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): CUSTOM_RESOURCE_DEFINITIONS,
    (_ADMISSION, "MutatingWebhookConfiguration"): f"/apis/{_ADMISSION}/mutatingwebhookconfigurations",
    (_ADMISSION, "ValidatingWebhookConfiguration"): f"/apis/{_ADMISSION}/validatingwebhookconfigurations",
}


def webhook_service() -> dict[str, Any]:
    """The Service the webhooks name, pointing the apiserver at this machine (see the module docstring)."""
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": WEBHOOK_SERVICE, "namespace": NAMESPACE},
            "spec": {"type": "ExternalName", "externalName": WEBHOOK_HOST}}


def configuration(webhook_port: int, health_port: int, cert_dir: Path) -> dict[str, Any]:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2) for one local instance."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": webhook_port, "host": WEBHOOK_HOST, "certDir": str(cert_dir)},
        # One instance per control plane: no Lease to wait out after a restart.
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": True, "webhookServiceName": WEBHOOK_SERVICE,
                                   "webhookSecretName": WEBHOOK_SECRET},
        "integrations": {"frameworks": list(FRAMEWORKS)},
        "featureGates": dict(FEATURE_GATES),
    }


class SecretVolume:
    """A Secret's keys as files in a directory, kept in step while it runs: the kubelet's Secret volume, for a
    process that is not in a pod. Polls the Secret (an absent one is waited for); each file is replaced whole."""

    def __init__(self, api: AdminApi, namespace: str, name: str, directory: Path, interval_s: float = 0.5) -> None:
        self.api = api
        self.path = f"/api/v1/namespaces/{namespace}/secrets/{name}"
        self.directory = directory
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"secret-volume-{name}", daemon=True)
        self._written: dict[str, bytes] = {}
        self.error = ""  # the last failed read, for a readiness message

    def start(self) -> "SecretVolume":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.api.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except KueueError as exc:
                self.error = str(exc)
            self._stop.wait(self.interval_s)

    def sync(self) -> None:
        answer = self.api.request("GET", self.path, ok=(200, 404))
        data = (answer.json().get("data") or {}) if answer.status_code == 200 else {}
        for key, encoded in data.items():
            content = base64.b64decode(encoded)
            if self._written.get(key) == content:
                continue
            scratch = self.directory / f".{key}.tmp"
            scratch.write_bytes(content)
            scratch.chmod(0o600)
            scratch.replace(self.directory / key)
            self._written[key] = content


class KueueManager(ManagerProcess):
    """Handle on Kueue's manager process and its install. Use as a context manager, or call start() and stop()."""

    binary = MANAGER_BINARY
    collections = COLLECTIONS
    error = KueueError
    stop_timeout_s = STOP_TIMEOUT_S

    def __init__(self, plane: ControlPlane, *, cache_dir: Optional[Path] = None) -> None:
        super().__init__(plane, KueueRelease.locate(cache_dir or Path(plane.bin_dir).resolve().parent))
        self.workdir = Path(plane.workdir) / "kueue"
        self.kubeconfig = self.workdir / "kubeconfig"
        self.config_path = self.workdir / "configuration.yaml"
        self.cert_dir = self.workdir / "serving-certs"
        self.webhook_port, self.health_port = free_ports(2)
        self._volume: Optional[SecretVolume] = None

    def start(self) -> "KueueManager":
        """Install, start the process; return once it is ready and its webhooks answer through the apiserver."""
        self.install()
        self._launch()
        return self

    def install(self) -> None:
        """CRDs, namespace, RBAC, the webhook Service, Secret and configurations, the manager's kubeconfig and
        Configuration, without starting it. The webhooks are registered first, as `kubectl apply` of Kueue's manifests
        does: Kueue injects its CA into them (it waits for them to exist before it reports ready)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.cert_dir.mkdir(parents=True, exist_ok=True)
        api = self.admin_api()
        crds = self.release.crds(self.webhook_port)
        for crd in crds:
            api.apply(crd)
        for crd in crds:
            api.wait_established(crd["metadata"]["name"])
        api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        for obj in self.release.rbac():
            api.apply(obj)
        api.apply(webhook_service())
        api.apply(self.release.webhook_secret())
        self._webhooks = self.release.webhooks(self.webhook_port)
        for webhook_configuration in self._webhooks:
            api.apply(webhook_configuration)
        document = api.service_account_kubeconfig(NAMESPACE, SERVICE_ACCOUNT, "kueue")
        self.kubeconfig.write_text(yaml.safe_dump(document, sort_keys=False))
        self.kubeconfig.chmod(0o600)
        self.config_path.write_text(yaml.safe_dump(
            configuration(self.webhook_port, self.health_port, self.cert_dir), sort_keys=False))

    def stop(self) -> None:
        """Stop the process and unregister its webhooks, then stop playing the kubelet's part for its certificate
        Secret. The CRDs, RBAC and Kueue's objects stay. Safe to call twice."""
        super().stop()
        if self._volume is not None:
            self._volume.stop()
            self._volume = None

    # -- the process --

    def _argv(self) -> list[str]:
        return [str(self.release.binary), f"--config={self.config_path}"]

    def _env(self) -> dict[str, str]:
        # controller-runtime reads the kubeconfig from $KUBECONFIG; HOME private so no ~/.kube/config is read.
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.workdir),
                "KUBECONFIG": str(self.kubeconfig)}

    def _launch(self) -> None:
        if self._volume is None:
            self._volume = SecretVolume(AdminApi(self.plane, Path(self.plane.workdir) / "pki" / "ca.crt", COLLECTIONS,
                                                 KueueError), NAMESPACE, WEBHOOK_SECRET, self.cert_dir).start()
        super()._launch()

    def _wait_ready(self) -> None:
        # The control plane's wait for its components (exit, deadline, log tail): /readyz, then the webhooks.
        assert self._process is not None
        wait_for_component(self._process, lambda: self._ready() or self._webhooks_answer(), READY_TIMEOUT_S)

    def _ready(self) -> str:
        url = f"http://127.0.0.1:{self.health_port}/readyz"
        try:
            response = requests.get(url, timeout=2, proxies={"http": "", "https": ""})
        except requests.RequestException as exc:
            return f"GET {url}: {type(exc).__name__}"
        if response.status_code == 200:
            return ""
        volume = f"; reading its certificate Secret: {self._volume.error}" if self._volume and self._volume.error else ""
        return f"GET {url}: {response.status_code} {response.text[:200]}{volume}"

    def _webhooks_answer(self) -> str:
        """Kueue's webhooks reached the way every write will reach them: the apiserver resolving the Service and
        verifying the certificate Kueue made against the CA bundle Kueue injected."""
        flavor = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                  "metadata": {"name": "harness-webhook-probe"}, "spec": {}}
        try:
            self.admin_api().request("POST", f"{API}/resourceflavors?dryRun=All", flavor, ok=(201,))
        except KueueError as exc:
            return f"a dry-run ResourceFlavor through the apiserver: {exc}"
        return ""
