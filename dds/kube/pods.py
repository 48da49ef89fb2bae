"""Changes DDS makes to a pod: only ever adding a toleration (a reservation's, dds/controller/reservations.py), and
the node taints that go with it.

Kubernetes lets a running or pending pod gain tolerations (never lose them), so this is an update the apiserver
accepts on any pod; the owner's template (Job, Deployment) is not touched and a recreated pod starts without it.
"""

from __future__ import annotations

from kubernetes import client

from dds.kube.errors import api_errors
from dds.kube.nodes import add_taint, remove_taint
from dds.model.snapshot import Toleration


def _as_api(toleration: Toleration) -> dict[str, str]:
    body = {"key": toleration.key, "operator": toleration.operator, "effect": toleration.effect}
    if toleration.operator == "Equal":
        body["value"] = toleration.value
    return body


def add_toleration(api: client.ApiClient, namespace: str, name: str, toleration: Toleration) -> bool:
    """Add the toleration unless the pod has it. Re-reads the pod and patches with its resourceVersion, so a change
    made meanwhile is never overwritten (a conflict raises; the next pass tries again). Returns whether it added."""
    core = client.CoreV1Api(api)
    pod = core.read_namespaced_pod(name, namespace)
    current = [api.sanitize_for_serialization(t) for t in pod.spec.tolerations or []]
    wanted = _as_api(toleration)
    if any(all(t.get(k, "") == v for k, v in wanted.items()) for t in current):
        return False
    core.patch_namespaced_pod(name, namespace, {"metadata": {"resourceVersion": pod.metadata.resource_version},
                                                "spec": {"tolerations": current + [wanted]}})
    return True


class ReservationWrites:
    """What a reservation writes to the cluster; every refusal is raised as dds.kube.errors.ApiError."""

    def __init__(self, api: client.ApiClient) -> None:
        self._api = api

    def tolerate(self, namespace: str, name: str, toleration: Toleration) -> None:
        with api_errors():
            add_toleration(self._api, namespace, name, toleration)

    def taint(self, node: str, key: str, value: str, effect: str) -> None:
        with api_errors():
            add_taint(self._api, node, key, value, effect)

    def untaint(self, node: str, key: str) -> None:
        with api_errors():
            remove_taint(self._api, node, key)
