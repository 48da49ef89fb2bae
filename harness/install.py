"""Installing a controller's shipped files on a harness ControlPlane with the admin token: what the CDI operator
(harness/cdi_operator.py), Cluster API's manager (harness/capi.py) and Kueue's (harness/kueue.py) need.

- `yaml_documents`: a manifest file's objects;
- `as_installed`: a kustomize `namespace:` and `namePrefix:` applied to RBAC objects (references included);
- `AdminApi`: create-or-replace by kind, delete, a CRD waited for until Established, a TokenRequest kubeconfig for a
  ServiceAccount, and the rules of an aggregated ClusterRole filled in (the harness runs no
  clusterrole-aggregation controller). Errors are raised as the caller's own error type, naming the request;
- `ManagerProcess`: a controller manager run as a process of the control plane, its webhooks unregistered when it
  stops (Cluster API's and Kueue's).
"""

from __future__ import annotations

import base64
import contextlib
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar, Mapping, Optional

import requests
import yaml

TOKEN_LIFETIME_S = 24 * 3600
_CRD_TIMEOUT_S = 30.0
_REQUEST_TIMEOUT_S = 30.0
_POLL_S = 0.1

CUSTOM_RESOURCE_DEFINITIONS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
CLUSTER_ROLES = "/apis/rbac.authorization.k8s.io/v1/clusterroles"
_NAMESPACED_RBAC = {"ServiceAccount", "Role", "RoleBinding"}
_RBAC = "rbac.authorization.k8s.io/v1"
# `AdminApi` collections of a ServiceAccount and its RBAC, which every shipped install has ({namespace} from the object).
RBAC_COLLECTIONS = {
    ("v1", "ServiceAccount"): "/api/v1/namespaces/{namespace}/serviceaccounts",
    (_RBAC, "ClusterRole"): f"/apis/{_RBAC}/clusterroles",
    (_RBAC, "ClusterRoleBinding"): f"/apis/{_RBAC}/clusterrolebindings",
    (_RBAC, "Role"): f"/apis/{_RBAC}/namespaces/{{namespace}}/roles",
    (_RBAC, "RoleBinding"): f"/apis/{_RBAC}/namespaces/{{namespace}}/rolebindings",
}


def yaml_documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def as_installed(obj: dict[str, Any], name_prefix: str, namespace: str, error: type[Exception]) -> dict[str, Any]:
    """kustomize's `namespace:` and `namePrefix:` as they apply to RBAC objects (references included)."""
    obj["metadata"]["name"] = name_prefix + obj["metadata"]["name"]
    if obj["kind"] in _NAMESPACED_RBAC:
        obj["metadata"]["namespace"] = namespace
    elif obj["kind"] not in {"ClusterRole", "ClusterRoleBinding"}:
        raise error(f"config/rbac holds a {obj['kind']} the harness does not know how to install")
    if "roleRef" in obj:
        obj["roleRef"]["name"] = name_prefix + obj["roleRef"]["name"]
    for subject in obj.get("subjects") or []:
        if subject.get("kind") == "ServiceAccount":
            subject["name"] = name_prefix + subject["name"]
            subject["namespace"] = namespace
    return obj


class AdminApi:
    """JSON requests as the control plane's admin. `collections`: the collection URL of each (apiVersion, kind) that
    `apply` and `delete` find by kind ({namespace} filled from the object)."""

    def __init__(self, plane: Any, ca_file: Path, collections: Mapping[tuple[str, str], str],
                 error: type[Exception]) -> None:
        self.server = plane.server
        self.ca_pem = Path(ca_file).read_bytes()
        self.collections = collections
        self.error = error
        self.session = requests.Session()
        self.session.trust_env = False  # no proxy for loopback, no REQUESTS_CA_BUNDLE overriding the CA
        self.session.verify = str(ca_file)
        self.session.headers["Authorization"] = f"Bearer {plane.token}"

    def apply(self, obj: dict[str, Any], collection: Optional[str] = None) -> dict[str, Any]:
        """Create `obj` in `collection` (default: by its kind), or replace it when it exists."""
        path = f"{collection}/{obj['metadata']['name']}" if collection else self.object_path(obj)
        collection = path.rsplit("/", 1)[0]
        response = self.request("POST", collection, obj, ok=(201, 409))
        if response.status_code == 201:
            return response.json()
        current = self.request("GET", path).json()
        replacement = {**obj, "metadata": {**obj["metadata"],
                                           "resourceVersion": current["metadata"]["resourceVersion"]}}
        return self.request("PUT", path, replacement).json()

    def delete(self, obj: dict[str, Any]) -> None:
        self.request("DELETE", self.object_path(obj), ok=(200, 202, 404))

    def object_path(self, obj: dict[str, Any]) -> str:
        key = (obj["apiVersion"], obj["kind"])
        if key not in self.collections:
            raise self.error(f"the harness does not know where to create a {key[1]} ({key[0]})")
        collection = self.collections[key].format(namespace=obj["metadata"].get("namespace", ""))
        return f"{collection}/{obj['metadata']['name']}"

    def merge_patch(self, path: str, body: Any) -> requests.Response:
        return self.request("PATCH", path, body, headers={"Content-Type": "application/merge-patch+json"})

    def request(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200, 201),
                headers: Optional[dict[str, str]] = None) -> requests.Response:
        try:
            response = self.session.request(method, f"{self.server}{path}", json=body, headers=headers,
                                            timeout=_REQUEST_TIMEOUT_S)
        except requests.RequestException as exc:
            raise self.error(f"{method} {path}: {exc}") from exc
        if response.status_code not in ok:
            raise self.error(f"{method} {path}: {response.status_code} {response.text[:500]}")
        return response

    def wait_established(self, crd_name: str) -> None:
        path = f"{CUSTOM_RESOURCE_DEFINITIONS}/{crd_name}"
        deadline = time.monotonic() + _CRD_TIMEOUT_S
        while True:
            conditions = self.request("GET", path).json().get("status", {}).get("conditions") or []
            if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                return
            if time.monotonic() > deadline:
                raise self.error(f"CRD {crd_name} not Established after {_CRD_TIMEOUT_S:.0f} s: {conditions}")
            time.sleep(_POLL_S)

    def service_account_kubeconfig(self, namespace: str, name: str, context: str) -> dict[str, Any]:
        """A kubeconfig holding a TokenRequest token of that ServiceAccount: no admin rights."""
        answer = self.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                              {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                               "spec": {"expirationSeconds": TOKEN_LIFETIME_S}}).json()
        user = f"system:serviceaccount:{namespace}:{name}"
        return {
            "apiVersion": "v1", "kind": "Config", "current-context": context,
            "clusters": [{"name": "dds-test", "cluster": {
                "server": self.server, "certificate-authority-data": base64.b64encode(self.ca_pem).decode()}}],
            "users": [{"name": user, "user": {"token": answer["status"]["token"]}}],
            "contexts": [{"name": context, "context": {"cluster": "dds-test", "user": user}}],
        }

    def aggregate_cluster_role(self, name: str) -> None:
        """Fill ClusterRole `name`'s rules from the ClusterRoles its aggregationRule selects: the work of
        kube-controller-manager's clusterrole-aggregation controller, which the harness control plane does not run.
        Called again whenever a ClusterRole it selects is added."""
        path = f"{CLUSTER_ROLES}/{name}"
        role = self.request("GET", path).json()
        rules: list[dict[str, Any]] = []
        for selector in (role.get("aggregationRule") or {}).get("clusterRoleSelectors") or []:
            labels = ",".join(f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items())
            for selected in self.request("GET", f"{CLUSTER_ROLES}?labelSelector={labels}").json()["items"]:
                rules += [rule for rule in selected.get("rules") or [] if rule not in rules]
        role["rules"] = rules
        self.request("PUT", path, role)

    def close(self) -> None:
        self.session.close()


class ManagerProcess(ABC):
    """A controller manager as a process of `plane`, installed as shipped. A subclass names its binary, the
    collections of its objects and its error type (class attributes), gives `_argv`, `_env` and `_wait_ready`, and
    registers what it serves in `_webhooks`. Use as a context manager, or call start() and stop()."""

    binary: ClassVar[str]
    collections: ClassVar[Mapping[tuple[str, str], str]]
    error: ClassVar[type[Exception]]
    stop_timeout_s: ClassVar[float] = 10.0

    def __init__(self, plane: Any, release: Any) -> None:
        self.plane = plane
        self.release = release
        self._process: Optional[Any] = None  # harness.controlplane.ManagedProcess, once launched
        self._api: Optional[AdminApi] = None
        self._webhooks: list[dict[str, Any]] = []

    @property
    def version(self) -> str:
        return self.release.version

    @property
    def pid(self) -> Optional[int]:
        return self._process.pid if self._process else None

    @property
    def log_path(self) -> Path:
        return self.plane.logs / f"{self.binary}.log"

    def running(self) -> bool:
        return self._process is not None and self._process.running()

    def log_tail(self, lines: int = 40) -> str:
        return self._process.tail(lines) if self._process else "(not started)"

    def admin_api(self) -> AdminApi:
        if self._api is None:
            self._api = AdminApi(self.plane, Path(self.plane.workdir) / "pki" / "ca.crt", self.collections, self.error)
        return self._api

    @abstractmethod
    def start(self) -> Any:
        """Install, launch, register its webhooks (each manager in its own order); return self once it serves."""

    def stop(self) -> None:
        """Stop the process and unregister its webhooks (failurePolicy Fail: unserved, they would refuse every write
        of the objects they guard). CRDs and RBAC stay. Safe to call twice."""
        if self._process is not None and self._process.running():
            self._process.stop(self.stop_timeout_s)
        if self._api is not None:
            with contextlib.suppress(self.error):  # the control plane may be down already
                for configuration in self._webhooks:
                    self._api.delete(configuration)
            self._api.close()
            self._api = None

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.version}, pid={self.pid}, log={str(self.log_path)!r})"

    @abstractmethod
    def _argv(self) -> list[str]:
        """The manager's command line."""

    @abstractmethod
    def _env(self) -> dict[str, str]:
        """The manager's whole environment (nothing inherited: no ~/.kube/config read by accident)."""

    @abstractmethod
    def _wait_ready(self) -> None:
        """Return once the manager serves; raise (the process's exit, a deadline) otherwise."""

    def _launch(self) -> None:
        """Start the process (made once, restarted as the same component) and wait until it is ready; a process that
        is not ready by then is stopped."""
        if self._process is None:
            self._process = self.plane.add_component(self.binary, self._argv(), env=self._env())
        self._process.start()
        try:
            self._wait_ready()
        except BaseException:
            if self._process.running():
                self._process.stop(self.stop_timeout_s)
            raise
