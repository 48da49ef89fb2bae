"""Cluster API's core manager (MachineSet, Machine, Cluster controllers) as a local process on a harness ControlPlane.

It runs as shipped: the binary hack/build-binaries.sh builds from the pinned module (`cluster-api-manager`), and the
install files of the same release, cached beside it under config/ (never kept in this repository):

- its CRDs (config/crd/bases), with the conversion webhook config/crd/kustomization.yaml patches in for each CRD
  (v1beta2 stored, v1beta1 served through the manager's `/convert`), its clientConfig a URL on this machine plus the
  CA of the serving certificate the harness writes (a Service is not reachable from a local apiserver);
- its RBAC (config/rbac) as config/default installs it: namespace `capi-system`, name prefix `capi-`, the manager's
  role aggregated (manager_role_aggregation_patch.yaml) so providers add their groups through ClusterRoles labelled
  `cluster.x-k8s.io/aggregate-to-manager: "true"` (the harness aggregates them itself, as kube-controller-manager's
  clusterrole-aggregation controller would: that controller does not run here); the manager's only credential is a
  TokenRequest token of its ServiceAccount `capi-manager`;
- after its /readyz answers, its admission webhooks (config/webhook/manifests.yaml) with URL clientConfigs: they
  default what DDS reads (a MachineSet's cluster-name label and selector, a Machine's nodeDeletionTimeoutSeconds).

Feature gates: MachinePool and ClusterTopology off (no MachinePools or ClusterClasses here), RuntimeSDK off. Every
port is chosen free per instance, so several control planes on one machine each run their own manager.
While the manager is down, v1beta1 requests fail (no conversion) and, with its webhooks registered, so do writes of
its objects: `stop()` unregisters the webhooks; `kill()` (a crash) leaves them, as a crash would.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import requests
import yaml

from dds import certs
from harness.controlplane import ControlPlane, free_ports
from harness.install import CUSTOM_RESOURCE_DEFINITIONS, RBAC_COLLECTIONS, ManagerProcess, as_installed, yaml_documents

MANAGER_BINARY = "cluster-api-manager"
# config/default/kustomization.yaml: every object of the install gets this namespace and name prefix.
NAMESPACE = "capi-system"
NAME_PREFIX = "capi-"
SERVICE_ACCOUNT = f"{NAME_PREFIX}manager"
FEATURE_GATES = "MachinePool=false,ClusterTopology=false,RuntimeSDK=false"
AGGREGATE_TO_MANAGER = "cluster.x-k8s.io/aggregate-to-manager"
AGGREGATED_ROLE = f"{NAME_PREFIX}aggregated-manager-role"  # config/rbac/aggregated_role.yaml, as installed

READY_TIMEOUT_S = 90.0  # the manager migrates its CRDs' stored versions before it reports ready
STOP_TIMEOUT_S = 10.0
_POLL_S = 0.1


class ClusterApiError(RuntimeError):
    """The manager could not be installed, started or reached; the message says why and shows its log's tail."""


@dataclass(frozen=True)
class ClusterApiRelease:
    """The built manager and its release's install files, as hack/build-binaries.sh caches them:
    <cache>/cluster-api-<version>/{cluster-api-manager, config/{crd,rbac,webhook,default}}."""

    binary: Path
    config: Path

    @property
    def version(self) -> str:
        """"v1.14.2", from the cache folder's name (the build names it after the pinned version)."""
        return self.binary.parent.name.removeprefix("cluster-api-")

    @classmethod
    def locate(cls, bin_dir: Path) -> "ClusterApiRelease":
        link = bin_dir / MANAGER_BINARY
        if not os.access(link, os.X_OK):
            raise ClusterApiError(f"{bin_dir}: no executable {MANAGER_BINARY} (run `bash hack/build-binaries.sh`; it "
                                  f"builds Cluster API's manager from the Go module proxy)")
        binary = link.resolve()  # once: a concurrent build re-creates the bin dir's symlinks
        release = cls(binary=binary, config=binary.parent / "config")
        wanted = (release.config / "crd" / "kustomization.yaml", release.config / "rbac" / "kustomization.yaml",
                  release.config / "webhook" / "manifests.yaml",
                  release.config / "default" / "manager_role_aggregation_patch.yaml")
        missing = [str(path) for path in wanted if not path.exists()]
        if missing:
            raise ClusterApiError(f"the Cluster API build in {binary.parent} lacks its install files {missing}; "
                                  f"delete that folder and run `bash hack/build-binaries.sh` again")
        return release

    def crds(self, webhook_url: str, ca_pem: bytes) -> list[dict[str, Any]]:
        """config/crd's CRDs, each conversion webhook its patch enables sent to `webhook_url`/convert."""
        crd_dir = self.config / "crd"
        kustomization = yaml.safe_load((crd_dir / "kustomization.yaml").read_text()) or {}
        crds = {doc["metadata"]["name"]: doc for entry in kustomization.get("resources", [])
                for doc in yaml_documents(crd_dir / entry)}
        for patch in kustomization.get("patches", []):
            for doc in yaml_documents(crd_dir / patch["path"]):
                name = doc["metadata"]["name"]
                if name not in crds:
                    raise ClusterApiError(f"{crd_dir / patch['path']} patches CRD {name}, which config/crd lacks")
                conversion = copy.deepcopy(doc["spec"]["conversion"])
                service = conversion["webhook"]["clientConfig"]["service"]
                conversion["webhook"]["clientConfig"] = {"url": f"{webhook_url}{service.get('path', '/convert')}",
                                                         "caBundle": base64.b64encode(ca_pem).decode()}
                crds[name]["spec"]["conversion"] = conversion
        return list(crds.values())

    def rbac(self) -> list[dict[str, Any]]:
        """config/rbac's objects as config/default installs them."""
        rbac_dir = self.config / "rbac"
        kustomization = yaml.safe_load((rbac_dir / "kustomization.yaml").read_text()) or {}
        objects = [doc for entry in kustomization.get("resources", []) for doc in yaml_documents(rbac_dir / entry)]
        patches = yaml_documents(self.config / "default" / "manager_role_aggregation_patch.yaml")
        for patch in patches:  # a strategic merge of metadata.labels and roleRef, the two things it sets
            target = next((o for o in objects if (o["kind"], o["metadata"]["name"]) ==
                           (patch["kind"], patch["metadata"]["name"])), None)
            if target is None:
                raise ClusterApiError(f"config/default's role aggregation patches {patch['kind']} "
                                      f"{patch['metadata']['name']}, which config/rbac lacks")
            target["metadata"].setdefault("labels", {}).update(patch["metadata"].get("labels") or {})
            if "roleRef" in patch:
                target["roleRef"] = patch["roleRef"]
        return [as_installed(obj, NAME_PREFIX, NAMESPACE, ClusterApiError) for obj in objects]

    def webhooks(self, webhook_url: str, ca_pem: bytes) -> list[dict[str, Any]]:
        """config/webhook's Mutating- and ValidatingWebhookConfigurations, each webhook sent to `webhook_url`."""
        configurations = []
        for doc in yaml_documents(self.config / "webhook" / "manifests.yaml"):
            doc["metadata"]["name"] = NAME_PREFIX + doc["metadata"]["name"]
            for webhook in doc.get("webhooks", []):
                path = webhook["clientConfig"]["service"].get("path", "/")
                webhook["clientConfig"] = {"url": f"{webhook_url}{path}",
                                           "caBundle": base64.b64encode(ca_pem).decode()}
            configurations.append(doc)
        return configurations


_ADMISSION = "admissionregistration.k8s.io/v1"
# Collection paths of the kinds the install creates ({namespace} filled from the object).
COLLECTIONS = {
    **RBAC_COLLECTIONS,
    ("v1", "Namespace"): "/api/v1/namespaces",
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): CUSTOM_RESOURCE_DEFINITIONS,
    (_ADMISSION, "MutatingWebhookConfiguration"): f"/apis/{_ADMISSION}/mutatingwebhookconfigurations",
    (_ADMISSION, "ValidatingWebhookConfiguration"): f"/apis/{_ADMISSION}/validatingwebhookconfigurations",
}


class ClusterApiManager(ManagerProcess):
    """Handle on the manager process and its install. Use as a context manager, or call start() and stop()."""

    binary = MANAGER_BINARY
    collections = COLLECTIONS
    error = ClusterApiError
    stop_timeout_s = STOP_TIMEOUT_S

    def __init__(self, plane: ControlPlane, *, bin_dir: Optional[Path] = None, extra_args: Sequence[str] = ()) -> None:
        """`extra_args`: more of the manager's flags, e.g. `--kube-api-qps=…` (a benchmark's; the tests run it as
        shipped)."""
        super().__init__(plane, ClusterApiRelease.locate(bin_dir or plane.bin_dir))
        self.extra_args = tuple(extra_args)
        self.workdir = Path(plane.workdir) / "cluster-api"
        self.kubeconfig = self.workdir / "kubeconfig"
        self.cert_dir = self.workdir / "serving-certs"
        self.webhook_port, self.health_port, self.diagnostics_port = free_ports(3)
        self.webhook_url = f"https://127.0.0.1:{self.webhook_port}"
        self._ca_pem = b""

    def start(self) -> "ClusterApiManager":
        """Install, start the process, register the webhooks; return once all answer."""
        self.install()
        self._launch()
        self._register_webhooks()
        return self

    def install(self) -> None:
        """The CRDs, the RBAC, the serving certificate and the manager's kubeconfig, without starting it."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        api = self.admin_api()
        self._write_serving_certificate()
        crds = self.release.crds(self.webhook_url, self._ca_pem)
        for crd in crds:
            api.apply(crd)
        for crd in crds:
            api.wait_established(crd["metadata"]["name"])
        api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        for obj in self.release.rbac():
            api.apply(obj)
        api.aggregate_cluster_role(AGGREGATED_ROLE)
        document = api.service_account_kubeconfig(NAMESPACE, SERVICE_ACCOUNT, "cluster-api")
        self.kubeconfig.write_text(yaml.safe_dump(document, sort_keys=False))
        self.kubeconfig.chmod(0o600)

    def kill(self) -> None:
        """SIGKILL the manager (a crash) and reap it; `restart()` brings it back. Its webhooks stay registered."""
        if self._process is None or self._process.pid is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, signal.SIGKILL)
        self._process.wait_or_kill(time.monotonic() + STOP_TIMEOUT_S)

    def restart(self) -> None:
        if self.running():
            assert self._process is not None
            self._process.stop(STOP_TIMEOUT_S)
        self._launch()

    # -- install --

    def _write_serving_certificate(self) -> None:
        bundle = certs.generate_bundle(dns_names=["localhost"], ip_addresses=["127.0.0.1"], days=30)
        self.cert_dir.mkdir(parents=True, exist_ok=True)
        (self.cert_dir / "tls.crt").write_bytes(bundle.server.cert_pem)
        key = self.cert_dir / "tls.key"
        key.write_bytes(bundle.server.key_pem)
        key.chmod(0o600)
        self._ca_pem = bundle.ca.cert_pem
        (self.workdir / "webhook-ca.crt").write_bytes(self._ca_pem)

    def _register_webhooks(self) -> None:
        self._webhooks = self.release.webhooks(self.webhook_url, self._ca_pem)
        for configuration in self._webhooks:
            self.admin_api().apply(configuration)

    # -- the process --

    def _argv(self) -> list[str]:
        return [str(self.release.binary), f"--kubeconfig={self.kubeconfig}",
                f"--webhook-port={self.webhook_port}", f"--webhook-cert-dir={self.cert_dir}",
                f"--health-addr=127.0.0.1:{self.health_port}",
                f"--diagnostics-address=127.0.0.1:{self.diagnostics_port}",
                f"--feature-gates={FEATURE_GATES}",
                # One instance per control plane: no Lease to wait out after a restart.
                "--leader-elect=false", *self.extra_args]

    def _env(self) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.workdir),
                "POD_NAMESPACE": NAMESPACE, "POD_NAME": "capi-controller-manager"}

    def _wait_ready(self) -> None:
        assert self._process is not None
        session = requests.Session()
        session.trust_env = False
        checks = [_probe(session, f"http://127.0.0.1:{self.health_port}/readyz", None),
                  _probe(session, f"{self.webhook_url}/convert", str(self.workdir / "webhook-ca.crt"))]
        deadline = time.monotonic() + READY_TIMEOUT_S
        try:
            while True:
                code = self._process.exit_code()
                if code is not None:
                    raise ClusterApiError(f"{MANAGER_BINARY} exited with code {code} while starting; last lines of "
                                          f"{self.log_path}:\n{self.log_tail()}")
                why = next((reason for reason in (check() for check in checks) if reason), "")
                if not why:
                    return
                if time.monotonic() > deadline:
                    raise ClusterApiError(f"{MANAGER_BINARY} not ready after {READY_TIMEOUT_S:.0f} s ({why}); last "
                                          f"lines of {self.log_path}:\n{self.log_tail()}")
                time.sleep(_POLL_S)
        finally:
            session.close()


def _probe(session: requests.Session, url: str, ca_file: Optional[str]) -> Callable[[], str]:
    """Ready: a 200 from a plain probe; for the webhook server (`ca_file`), any answer over TLS with that CA."""
    def check() -> str:
        try:
            response = session.get(url, timeout=2, verify=ca_file or True)
        except requests.RequestException as exc:
            return f"GET {url}: {type(exc).__name__}"
        if ca_file is None and response.status_code != 200:
            return f"GET {url}: {response.status_code} {response.text[:200]}"
        return ""
    return check
