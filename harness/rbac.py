"""DDS and cluster-autoscaler on a test control plane under the RBAC manifests/ ships, never the admin credential.

`install(plane, DDS)` renders manifests/dds with the project's kustomize renderer (harness/kustomize.py), applies its
ServiceAccount, ClusterRole/Binding and Role/Binding exactly as rendered (not a copy of the rules), mints a token for
the ServiceAccount with the TokenRequest API (`serviceaccounts/<name>/token`; the apiserver signs it with its
--service-account-signing-key) and writes a kubeconfig for that identity next to the admin one. `AUTOSCALER` does the
same with manifests/cluster-autoscaler. Both are idempotent per control plane.

DDS's namespaced Role (leader Lease, state ConfigMaps) is shipped for `dds-system`; a test that runs DDS with another
`namespace` setting grants it there with `grant_namespace` — the same Role and RoleBinding, only the namespace changed,
as `kustomize edit set namespace` would do for a user installing DDS elsewhere (the subject stays the ServiceAccount).

DDS's grants follow its fabric and features (docs/operations.md "Grants follow features"): manifests/dds ships what all
need, manifests/rbac/<feature> what only one needs, with the ValidatingAdmissionPolicies that narrow a grant to DDS's
own label, taint and driver names (installed too, so the apiserver enforces them in every test). `DDS` holds every
feature (the session's shared control plane runs tests of all of them); `dds_for(fabric, reservations=...)` holds what
one fabric ships with, and is what an e2e stack (harness/stack.py, its own control plane) installs.
"""

from __future__ import annotations

import base64
import copy
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import requests
import yaml
from kubernetes import client

from harness.audit import Grant
from harness.kustomize import render

ROOT = Path(__file__).resolve().parents[1]
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
# What narrows a grant where RBAC cannot (manifests/dds/admission.yaml, manifests/rbac/reservations): installed with it.
ADMISSION_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
NAMESPACED_ROLE_KINDS = ("Role", "RoleBinding")
# TokenRequest's answer is valid this long; a session-scoped control plane lives well under a day.
TOKEN_SECONDS = 24 * 3600


class RbacError(RuntimeError):
    """The RBAC manifests could not be applied or a token minted; the message names the object and the answer."""


@dataclass(frozen=True)
class Identity:
    """A ServiceAccount the manifests ship, and the kustomization that ships it with its roles."""

    name: str
    namespace: str
    manifests: Path
    # manifests/rbac/<feature> directories installed with `manifests` (what a fabric or a feature adds).
    features: tuple[str, ...] = ()

    @property
    def username(self) -> str:
        """The user name the apiserver gives the ServiceAccount's token (what the audit log records)."""
        return f"system:serviceaccount:{self.namespace}:{self.name}"

    def objects(self) -> list[dict[str, Any]]:
        """The rendered ServiceAccount and RBAC objects of `manifests`, in the order the kustomization lists them."""
        rendered = render(self.manifests)
        for feature in self.features:
            rendered += render(FEATURE_MANIFESTS / feature)
        return [obj for obj in rendered if obj["kind"] in RBAC_KINDS + ADMISSION_KINDS]


FEATURE_MANIFESTS = ROOT / "manifests" / "rbac"
# Each fabric's own directory under manifests/rbac (the fabric names of dds/config.py FabricBackend), and the features
# any fabric may add.
FABRIC_FEATURES = ("composability-request", "redfish", "simulated")
OPTIONAL_FEATURES = ("reservations",)
DDS = Identity("dds", "dds-system", ROOT / "manifests" / "dds", FABRIC_FEATURES + OPTIONAL_FEATURES)


def dds_for(fabric: str, *, reservations: bool = False) -> Identity:
    """DDS's ServiceAccount with what `fabric` (and reservations, when on) ships with, nothing of the others."""
    if fabric not in FABRIC_FEATURES:
        raise ValueError(f"no RBAC for fabric {fabric!r} in {FEATURE_MANIFESTS} (one of {FABRIC_FEATURES})")
    return Identity(DDS.name, DDS.namespace, DDS.manifests, (fabric,) + (("reservations",) if reservations else ()))


AUTOSCALER = Identity("cluster-autoscaler", "dds-system", ROOT / "manifests" / "cluster-autoscaler")
# The same ServiceAccount with what --enable-provisioning-requests adds (an overlay of manifests/cluster-autoscaler).
AUTOSCALER_WITH_PROVISIONING_REQUESTS = Identity(AUTOSCALER.name, AUTOSCALER.namespace,
                                                 AUTOSCALER.manifests / "provisioning-requests")
IDENTITIES = (DDS, AUTOSCALER)


def autoscaler_for(*, provisioning_requests: bool = False) -> Identity:
    """cluster-autoscaler's ServiceAccount, with the grants of --enable-provisioning-requests when it runs with it."""
    return AUTOSCALER_WITH_PROVISIONING_REQUESTS if provisioning_requests else AUTOSCALER


# --- applying what the manifests render ---

_PATHS: dict[str, tuple[str, str]] = {  # kind -> (API prefix, collection)
    "ServiceAccount": ("/api/v1", "serviceaccounts"),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles"),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings"),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    "Namespace": ("/api/v1", "namespaces"),
    "ValidatingAdmissionPolicy": ("/apis/admissionregistration.k8s.io/v1", "validatingadmissionpolicies"),
    "ValidatingAdmissionPolicyBinding": ("/apis/admissionregistration.k8s.io/v1",
                                         "validatingadmissionpolicybindings"),
}


def _collection(obj: dict[str, Any]) -> str:
    prefix, plural = _PATHS[obj["kind"]]
    namespace = obj["metadata"].get("namespace")
    return f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"


class _AdminSession:
    """JSON requests as the control plane's admin (the tests' own setup credential), verified against its CA."""

    def __init__(self, plane: Any) -> None:
        self.server = plane.server
        self._ca_file = Path(plane.workdir) / "pki" / "ca.crt"
        self._session = requests.Session()
        self._session.trust_env = False  # loopback: no proxy, no REQUESTS_CA_BUNDLE override
        self._session.verify = str(self._ca_file)
        self._session.headers["Authorization"] = f"Bearer {plane.token}"

    def __enter__(self) -> "_AdminSession":
        return self

    def __exit__(self, *_exc: object) -> None:
        self._session.close()

    @property
    def ca_pem(self) -> bytes:
        return self._ca_file.read_bytes()

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        response = self._session.request(method, f"{self.server}{path}", json=body, timeout=30)
        try:
            return response.status_code, response.json()
        except ValueError:
            return response.status_code, response.text


def apply(admin: _AdminSession, obj: dict[str, Any]) -> None:
    """Create `obj`, or replace it when it exists (a rerun, or the manifests changed while a plane was up)."""
    collection = _collection(obj)
    what = f"{obj['kind']} {obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}"
    status, answer = admin.call("POST", collection, obj)
    if status == 201:
        return
    if status != 409:
        raise RbacError(f"creating {what}: {status} {answer}")
    if obj["kind"] in ("ServiceAccount", "Namespace"):
        return  # nothing of theirs the manifests set needs replacing (labels only)
    path = f"{collection}/{obj['metadata']['name']}"
    status, current = admin.call("GET", path)
    if status != 200:
        raise RbacError(f"reading {what}: {status} {current}")
    replacement = copy.deepcopy(obj)
    replacement["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    status, answer = admin.call("PUT", path, replacement)
    if status != 200:
        raise RbacError(f"replacing {what}: {status} {answer}")


def _ensure_namespace(admin: _AdminSession, name: str) -> None:
    apply(admin, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


# --- tokens and kubeconfigs ---

def mint_token(admin: _AdminSession, identity: Identity, seconds: int = TOKEN_SECONDS) -> str:
    """A token for the ServiceAccount from the TokenRequest API (bound to the ServiceAccount object)."""
    path = f"/api/v1/namespaces/{identity.namespace}/serviceaccounts/{identity.name}/token"
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": seconds}}
    status, answer = admin.call("POST", path, body)
    if status != 201:
        raise RbacError(f"TokenRequest for {identity.username}: {status} {answer}")
    return answer["status"]["token"]


def kubeconfig_document(server: str, ca_pem: bytes, identity: Identity, token: str) -> dict[str, Any]:
    user = identity.username
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": identity.name,
        "clusters": [{"name": "dds-test", "cluster": {
            "server": server, "certificate-authority-data": base64.b64encode(ca_pem).decode()}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": identity.name, "context": {"cluster": "dds-test", "user": user}}],
    }


_INSTALLED: dict[tuple[str, str], Path] = {}  # (plane workdir, identity name) -> its kubeconfig
_DDS_FEATURES: dict[str, tuple[str, ...]] = {}  # plane workdir -> the features DDS's ServiceAccount has there
_LOCK = threading.Lock()


def dds_features_of(audit_log: Path) -> Optional[tuple[str, ...]]:
    """The features (manifests/rbac/<feature>) DDS's ServiceAccount was installed with on the control plane writing
    `audit_log` (workdir/logs/audit.log, harness/controlplane.py); None when DDS was not installed there."""
    with _LOCK:
        return _DDS_FEATURES.get(str(audit_log.parent.parent))


def install(plane: Any, identity: Identity) -> Path:
    """Apply `identity`'s rendered RBAC to `plane` (a harness.controlplane.ControlPlane) and return the path of a
    kubeconfig for its ServiceAccount (once per plane; later calls return the same file)."""
    key = (str(plane.workdir), identity.name)
    with _LOCK:
        if key in _INSTALLED:
            return _INSTALLED[key]
        with _AdminSession(plane) as admin:
            _ensure_namespace(admin, identity.namespace)
            for obj in identity.objects():
                apply(admin, obj)
            token = mint_token(admin, identity)
            document = kubeconfig_document(plane.server, admin.ca_pem, identity, token)
        path = Path(plane.workdir) / f"kubeconfig-{identity.name}"
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        path.chmod(0o600)
        _INSTALLED[key] = path
        if identity.name == DDS.name and identity.namespace == DDS.namespace:
            _DDS_FEATURES[str(plane.workdir)] = identity.features
        return path


def namespaced_objects(identity: Identity, namespace: str) -> list[dict[str, Any]]:
    """`identity`'s Roles and RoleBindings moved to `namespace` (subjects unchanged: the same ServiceAccount)."""
    out = []
    for obj in identity.objects():
        if obj["kind"] in NAMESPACED_ROLE_KINDS:
            moved = copy.deepcopy(obj)
            moved["metadata"]["namespace"] = namespace
            out.append(moved)
    return out


def grant_namespace(plane: Any, identity: Identity, namespace: str) -> None:
    """Give `identity` its shipped namespaced Role in `namespace` too (DDS run with `namespace: <namespace>`)."""
    install(plane, identity)
    with _AdminSession(plane) as admin:
        for obj in namespaced_objects(identity, namespace):
            apply(admin, obj)


def api_client(kubeconfig: Path, configure: Optional[Callable[[client.Configuration], None]] = None
               ) -> client.ApiClient:
    """A kubernetes ApiClient for a ServiceAccount kubeconfig from `install`."""
    from kubernetes import config

    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    if configure is not None:
        configure(configuration)
    return client.ApiClient(configuration)


# --- what the roles grant (the suite's audit comparison, tests/integration/ops/test_rbac_audit.py) ---

# What the apiserver's default ClusterRole system:basic-user lets every authenticated user do (asking about itself):
# allowed without any role of DDS's, so not part of the comparison.
EVERY_USER = frozenset({Grant("create", "selfsubjectaccessreviews", "", "authorization.k8s.io"),
                        Grant("create", "selfsubjectrulesreviews", "", "authorization.k8s.io"),
                        Grant("create", "selfsubjectreviews", "", "authentication.k8s.io")})


def rule_grants(rule: dict[str, Any]) -> set[Grant]:
    """Every (verb, resource, subresource, apiGroup) one PolicyRule allows (`resourceNames` narrow a rule to some
    objects; the comparison is per kind of request, so they are not part of the key)."""
    out = set()
    for group in rule.get("apiGroups", []):
        for entry in rule.get("resources", []):
            resource, _, subresource = entry.partition("/")
            for verb in rule.get("verbs", []):
                out.add(Grant(verb, resource, subresource, group))
    return out


def granted(identity: Identity) -> set[Grant]:
    """What the ClusterRoles and Roles bound to `identity` in its manifests allow."""
    return grants_of(identity.objects(), identity.name, identity.namespace)


def grants_of(objects: list[dict[str, Any]], name: str, namespace: str) -> set[Grant]:
    """What the ClusterRoles and Roles among `objects` bound (by `objects`' bindings) to ServiceAccount
    `namespace/name` allow (also for what the chart renders: tests/integration/chart/test_chart.py)."""
    bound = {(b["roleRef"]["kind"], b["roleRef"]["name"]) for b in objects
             if b["kind"] in ("ClusterRoleBinding", "RoleBinding")
             and any(s.get("kind") == "ServiceAccount" and s.get("name") == name
                     and s.get("namespace") == namespace for s in b.get("subjects", []))}
    out: set[Grant] = set()
    for role in objects:
        if role["kind"] in ("ClusterRole", "Role") and (role["kind"], role["metadata"]["name"]) in bound:
            for rule in role.get("rules", []):
                out |= rule_grants(rule)
    return out
