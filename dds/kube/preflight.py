"""Can DDS work with this cluster? Asked once before `dds serve` builds anything, and by `dds check-config`.

Each failure DDS meets first on a new cluster becomes one `ClusterProblem`: a sentence saying what is wrong and one
saying what to do, instead of the client library's traceback (a connection refused is 149 lines of urllib3 retries).
The questions cost a few requests every user may make: GET /version, SelfSubjectAccessReviews (the apiserver's
system:basic-user role lets everyone ask about themselves) and API discovery (system:discovery).
"""

from __future__ import annotations

import json
import logging
import ssl
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import urllib3
import yaml
from kubernetes import client
from kubernetes.config.config_exception import ConfigException

from dds.config import (CLUSTER_API_GROUP, MACHINE_API_FIX, MACHINE_API_REFUSAL, OPENSHIFT_MACHINE_API_GROUP,
                        FabricBackend, Settings)
from dds.kube import client as kube_client  # dds/kube/client.py stays the one way to build a client
from dds.kube.configmap import INSTANCES_CONFIGMAP, REDFISH_LOG_SUFFIX
from dds.kube.raw import send

log = logging.getLogger(__name__)

CHECK_TIMEOUT_SECONDS = 15.0


class ProblemKind(str, Enum):
    KUBECONFIG = "kubeconfig"  # the file is missing or not a kubeconfig
    NOT_IN_POD = "not-in-pod"  # --in-cluster where no ServiceAccount is mounted
    UNREACHABLE = "unreachable"  # no answer: address, network, TLS
    CREDENTIALS = "credentials"  # answered 401: the token or certificate is not accepted
    PERMISSION = "permission"  # authenticated, but RBAC refuses what DDS needs
    MISSING_API = "missing-api"  # a CRD DDS reads is not installed


@dataclass(frozen=True)
class ClusterProblem:
    kind: ProblemKind
    message: str
    fix: str


class ClusterUnusable(Exception):
    """The cluster cannot be used as configured; `problem` says why and what to do."""

    def __init__(self, problem: ClusterProblem) -> None:
        super().__init__(problem.message)
        self.problem = problem


@dataclass(frozen=True)
class Access:
    """One request DDS makes: `verb` on `resource` (`group` "" for the core API), in `namespace` (None: all)."""

    verb: str
    resource: str
    group: str = ""
    namespace: Optional[str] = None
    name: Optional[str] = None
    subresource: str = ""

    def describe(self) -> str:
        what = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        what = f"{what}.{self.group}" if self.group else what
        where = f" in namespace {self.namespace}" if self.namespace else " in all namespaces"
        return f"{self.verb} {what}{f' {self.name}' if self.name else ''}{where}"


@dataclass(frozen=True)
class ServedKind:
    """A custom resource DDS reads: served in one of `versions` of `group`, installed by `crd_source`."""

    group: str
    versions: tuple[str, ...]
    resource: str
    crd_source: str


def connect(kubeconfig: Optional[Path], in_cluster: bool) -> client.ApiClient:
    """The API client for a kubeconfig or the pod's ServiceAccount; a missing or unreadable file, or --in-cluster
    outside a pod, raises ClusterUnusable (no request is made yet)."""
    if in_cluster:
        try:
            return kube_client.api_client(None, in_cluster=True)
        except ConfigException as exc:
            raise ClusterUnusable(ClusterProblem(
                ProblemKind.NOT_IN_POD, f"--in-cluster, but this is not a pod with a ServiceAccount ({exc})",
                "run DDS in its Deployment (manifests/, charts/dds), or pass --kubeconfig FILE instead")) from exc
    if kubeconfig is None:
        raise ClusterUnusable(ClusterProblem(ProblemKind.KUBECONFIG, "no cluster given",
                                             "pass --kubeconfig FILE or --in-cluster"))
    if not Path(kubeconfig).is_file():
        raise ClusterUnusable(ClusterProblem(
            ProblemKind.KUBECONFIG, f"kubeconfig {kubeconfig} does not exist or is not a file",
            "pass the path of your cluster's kubeconfig (often ~/.kube/config; `kubectl config view` shows it)"))
    try:
        return kube_client.api_client(Path(kubeconfig))
    except (ConfigException, yaml.YAMLError, TypeError, AttributeError, KeyError, ValueError, OSError) as exc:
        # A file that is not a kubeconfig mapping fails inside the loader with whatever it tripped on first.
        why = _one_line(exc) if isinstance(exc, (ConfigException, yaml.YAMLError, OSError)) else \
            "expected a YAML mapping with clusters, contexts, users and current-context"
        raise ClusterUnusable(ClusterProblem(
            ProblemKind.KUBECONFIG, f"kubeconfig {kubeconfig} is not a usable kubeconfig: {why}",
            f"check it with `kubectl --kubeconfig {kubeconfig} version`")) from exc


def explain(exc: BaseException, server: str = "the apiserver") -> Optional[ClusterProblem]:
    """The problem an exception from a request to the apiserver stands for, None when it is none of the known ones."""
    if isinstance(exc, ClusterUnusable):
        return exc.problem
    if isinstance(exc, client.ApiException):
        return _problem_of_status(exc.status, server, _status_message(exc.body))
    if isinstance(exc, (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError, ssl.SSLError)):
        return _unreachable(server, exc)
    return None


def check_reachable(api: client.ApiClient) -> None:
    """GET /version: raises ClusterUnusable when nothing answers or the credentials are refused."""
    server = api.configuration.host
    retries = logging.getLogger("urllib3.connectionpool")
    level = retries.level
    retries.setLevel(logging.ERROR)  # its WARNING per retry would bury the one line that says what is wrong
    try:
        answer = send(api, "GET", "/version", read_timeout=CHECK_TIMEOUT_SECONDS)
    except Exception as exc:
        raise ClusterUnusable(explain(exc, server) or _unreachable(server, exc)) from exc
    finally:
        retries.setLevel(level)
    if answer.status >= 400:
        raise ClusterUnusable(_problem_of_status(answer.status, server, _status_message(answer.data)))


def denied(api: client.ApiClient, wanted: Iterable[Access]) -> list[Access]:
    """The requests of `wanted` RBAC refuses the caller, asked with SelfSubjectAccessReviews."""
    out = []
    for access in wanted:
        attributes = {"verb": access.verb, "resource": access.resource, "group": access.group}
        attributes.update({k: v for k, v in (("namespace", access.namespace), ("name", access.name),
                                             ("subresource", access.subresource)) if v})
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": attributes}}
        answer = send(api, "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body=body,
                      read_timeout=CHECK_TIMEOUT_SECONDS)
        if answer.status >= 400:
            raise ClusterUnusable(_problem_of_status(answer.status, api.configuration.host,
                                                     _status_message(answer.data)))
        if not json.loads(answer.data).get("status", {}).get("allowed", False):
            out.append(access)
    return out


def missing_kinds(api: client.ApiClient, wanted: Iterable[ServedKind]) -> list[ServedKind]:
    """The kinds of `wanted` the apiserver serves in none of their versions (API discovery)."""
    out = []
    for kind in wanted:
        if not any(_serves(api, kind.group, version, kind.resource) for version in kind.versions):
            out.append(kind)
    return out


def require(api: client.ApiClient, access: Sequence[Access], kinds: Sequence[ServedKind],
            subject: str = "DDS's credentials") -> None:
    """Reachable, authenticated, allowed every request of `access`, serving every kind of `kinds`; else
    ClusterUnusable naming all that is missing and what to do."""
    check_reachable(api)
    missing = missing_kinds(api, kinds)
    if missing:
        raise ClusterUnusable(crds_problem(api, missing))
    refused = denied(api, access)
    if refused:
        raise ClusterUnusable(permission_problem(refused, subject))


def missing_kinds_problem(missing: Sequence[ServedKind]) -> ClusterProblem:
    names = ", ".join(f"{k.resource}.{k.group}" for k in missing)
    sources = " and ".join(dict.fromkeys(k.crd_source for k in missing))
    return ClusterProblem(ProblemKind.MISSING_API, f"the cluster does not serve {names} (CRD not installed)",
                          f"install the CRDs: kubectl apply -k {sources}")


def crds_problem(api: client.ApiClient, missing: Sequence[ServedKind]) -> ClusterProblem:
    """What `missing` (kinds DDS needs that the cluster does not serve) means on this cluster."""
    return machine_api_problem(api, missing) or missing_kinds_problem(missing)


def machine_api_problem(api: client.ApiClient, missing: Sequence[ServedKind]) -> Optional[ClusterProblem]:
    """On a cluster that serves OpenShift's Machine API where Cluster API's MachineSets are missing, the problem is not
    a CRD to install (Cluster API's CRDs would not make those MachineSets node groups): it says so, and why."""
    if not any(k.group == CLUSTER_API_GROUP for k in missing) or missing_kinds(api, (OPENSHIFT_MACHINESETS,)):
        return None
    return ClusterProblem(ProblemKind.MISSING_API,
                          f"the cluster serves {OPENSHIFT_MACHINESETS.resource}.{OPENSHIFT_MACHINE_API_GROUP}, not "
                          f"Cluster API's {OPENSHIFT_MACHINESETS.resource}.{CLUSTER_API_GROUP}: {MACHINE_API_REFUSAL}",
                          MACHINE_API_FIX)


def note_machine_api(api: client.ApiClient) -> None:
    """Log, once at start, that this cluster's OpenShift Machine API MachineSets are no node groups (DDS serves its
    Cluster API ones), so an opted-in machine.openshift.io MachineSet is not left unexplained."""
    if not missing_kinds(api, (OPENSHIFT_MACHINESETS,)):
        log.warning("this cluster also serves %s.%s: those MachineSets are no node groups, DDS reads %s only. %s",
                    OPENSHIFT_MACHINESETS.resource, OPENSHIFT_MACHINE_API_GROUP, CLUSTER_API_GROUP,
                    MACHINE_API_REFUSAL)


def permission_problem(refused: Sequence[Access], subject: str) -> ClusterProblem:
    shown = "; ".join(a.describe() for a in refused[:6]) + (f"; and {len(refused) - 6} more" if len(refused) > 6 else "")
    return ClusterProblem(ProblemKind.PERMISSION, f"{subject} may not: {shown}",
                          "apply DDS's RBAC (manifests/dds/rbac.yaml; its Role must be in the `namespace` setting's "
                          "namespace) and run as its ServiceAccount; `kubectl auth can-i --list` shows what you may do")


def _serves(api: client.ApiClient, group: str, version: str, resource: str) -> bool:
    answer = send(api, "GET", f"/apis/{group}/{version}", read_timeout=CHECK_TIMEOUT_SECONDS)
    if answer.status == 404:
        return False
    if answer.status >= 400:
        raise ClusterUnusable(_problem_of_status(answer.status, api.configuration.host, _status_message(answer.data)))
    return any(r.get("name") == resource for r in json.loads(answer.data).get("resources", []))


def _problem_of_status(status: Optional[int], server: str, message: str) -> ClusterProblem:
    said = f": {message}" if message else ""
    if status == 401:
        return ClusterProblem(ProblemKind.CREDENTIALS, f"{server} refused the credentials (401 Unauthorized{said})",
                              "the token or client certificate is expired or wrong: renew the kubeconfig's user, "
                              "and check it with `kubectl auth whoami`")
    if status == 403:
        return ClusterProblem(ProblemKind.PERMISSION, f"{server} denied a request (403 Forbidden{said})",
                              "apply DDS's RBAC (manifests/dds/rbac.yaml) and run as its ServiceAccount")
    if status == 404:
        return ClusterProblem(ProblemKind.MISSING_API, f"{server} does not serve what DDS asked for (404{said})",
                              "install the Cluster API CRDs (manifests/crds/cluster-api) and, for fabric "
                              "composability-request, the operator's (manifests/crds/composability)")
    return ClusterProblem(ProblemKind.UNREACHABLE, f"{server} answered {status}{said}",
                          "check the apiserver's health (`kubectl get --raw /readyz?verbose`) and try again")


def _unreachable(server: str, exc: BaseException) -> ClusterProblem:
    return ClusterProblem(ProblemKind.UNREACHABLE, f"cannot reach the apiserver at {server}: {_root_cause(exc)}",
                          "check the kubeconfig's server address, the network and the apiserver's certificate "
                          "(`kubectl cluster-info` uses the same kubeconfig)")


def _root_cause(exc: BaseException) -> str:
    """urllib3 wraps the cause a few layers deep (MaxRetryError -> NewConnectionError -> ConnectionRefusedError)."""
    reason: Any = exc
    while isinstance(reason, urllib3.exceptions.MaxRetryError) and reason.reason is not None:
        reason = reason.reason
    return _one_line(reason)


def _status_message(body: Any) -> str:
    try:
        text = body.decode(errors="replace") if isinstance(body, bytes) else str(body or "")
        return str(json.loads(text).get("message", ""))
    except (ValueError, AttributeError):
        return ""


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


CLUSTER_API_KINDS = (ServedKind("cluster.x-k8s.io", ("v1beta2", "v1beta1"), "machinesets", "manifests/crds/cluster-api"),
                     ServedKind("cluster.x-k8s.io", ("v1beta2", "v1beta1"), "machines", "manifests/crds/cluster-api"))
# Discovery only (system:discovery lets every user ask): DDS never reads these objects.
OPENSHIFT_MACHINESETS = ServedKind(OPENSHIFT_MACHINE_API_GROUP, ("v1beta1",), "machinesets", "")
COMPOSABILITY_KINDS = (
    ServedKind("cro.hpsys.ibm.ie.com", ("v1alpha1",), "composabilityrequests", "manifests/crds/composability"),
    ServedKind("cro.hpsys.ibm.ie.com", ("v1alpha1",), "composableresources", "manifests/crds/composability"))


def needed_kinds(settings: Settings) -> tuple[ServedKind, ...]:
    """The CRDs `dds serve` cannot start without: Cluster API's, and the CDI operator's for its fabric."""
    composability = settings.fabric == FabricBackend.COMPOSABILITY_REQUEST
    return CLUSTER_API_KINDS + (COMPOSABILITY_KINDS if composability else ())


def needed_access(settings: Settings) -> tuple[Access, ...]:
    """What DDS does in every setup with these settings (manifests/dds/rbac.yaml grants it; a unit test keeps this a
    subset of it). Optional features (reservations, gangs, DRA) ask for theirs when used and say so in Events."""
    capi = "cluster.x-k8s.io"
    scopes: Sequence[Optional[str]] = settings.machineset_namespaces or [None]
    out = [Access(verb, resource, capi, scope) for scope in scopes
           for resource, verbs in (("machinesets", ("list", "watch", "patch")), ("machines", ("list", "watch", "patch")),
                                   ("machinedeployments", ("list", "watch", "patch")))
           for verb in verbs]
    out += [Access(verb, "nodes") for verb in ("get", "list", "watch", "patch")]
    out += [Access(verb, "pods") for verb in ("list", "watch")]
    out += [Access("create", "events", namespace=settings.namespace)]
    # ConfigMaps are granted by name (get, update) except `create`, which RBAC cannot limit by name: asked the same
    # way, or a cluster set up as shipped would fail the check.
    out += [Access("create", "configmaps", namespace=settings.namespace)]
    out += [Access(verb, "configmaps", namespace=settings.namespace, name=name)
            for name in state_configmaps(settings) for verb in ("get", "update")]
    if settings.leader_election:
        out += [Access("create", "leases", "coordination.k8s.io", settings.namespace)]
        out += [Access(verb, "leases", "coordination.k8s.io", settings.namespace, settings.lease_name)
                for verb in ("get", "update")]
    if settings.fabric == FabricBackend.SIMULATED:
        out += [Access("patch", "nodes", subresource="status")]
    if settings.fabric == FabricBackend.COMPOSABILITY_REQUEST:
        cro = "cro.hpsys.ibm.ie.com"
        out += [Access(verb, "composabilityrequests", cro) for verb in ("get", "list", "watch", "create", "update")]
        out += [Access(verb, "composableresources", cro) for verb in ("list", "watch", "patch")]
    return tuple(out)


def state_configmaps(settings: Settings) -> tuple[str, ...]:
    """The ConfigMaps DDS keeps its state in with these settings (the in-flight instances; the simulated fabric's
    state; the Redfish backend's operation log)."""
    names = [INSTANCES_CONFIGMAP]
    if settings.fabric == FabricBackend.SIMULATED:
        names.append(settings.simulated_fabric.state_configmap)
    if settings.fabric == FabricBackend.REDFISH:
        names.append(settings.simulated_fabric.state_configmap + REDFISH_LOG_SUFFIX)
    return tuple(names)


def require_for_serving(api: client.ApiClient, settings: Settings) -> None:
    """Everything `dds serve` needs of the cluster before it builds anything; ClusterUnusable otherwise."""
    require(api, needed_access(settings), needed_kinds(settings))
    note_machine_api(api)
