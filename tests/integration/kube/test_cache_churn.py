"""The watch cache on the real apiserver: after churn (pods come and go, nodes join and leave, GPU capacity patched,
Machines change, the apiserver restarted under the open watches) it settles to exactly what a fresh LIST returns.
And a resourceVersion the apiserver no longer has (410 Gone) ends in a relist, not in a silently stale store."""

from __future__ import annotations

import base64
import random
import threading
from typing import Any, Iterator

import pytest
import requests
from kubernetes import client

from dds.kube.cache import ClusterCache, Reflector, cluster_cache
from dds.kube.machinesets import CAPI_GROUP
from harness.controlplane import KWOK_NODE_ANNOTATION
from tests.integration.nodes.harness import wait_for

pytestmark = pytest.mark.integration

GPU = "nvidia.com/gpu"


def node_body(name: str, gpus: int) -> dict[str, Any]:
    key, value = KWOK_NODE_ANNOTATION
    resources = {"cpu": "16", "memory": "64Gi", "pods": "110", GPU: str(gpus)}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {key: value}, "labels": {"dds-test/cache": name}},
            "spec": {"providerID": f"kwok://{name}",
                     "taints": [{"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}]},
            "status": {"capacity": resources, "allocatable": resources}}


def pod_body(name: str, gpus: int = 0) -> dict[str, Any]:
    requests = {"cpu": "100m", "memory": "64Mi", **({GPU: str(gpus)} if gpus else {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"churn": "yes"}},
            "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"requests": requests, "limits": {GPU: str(gpus)} if gpus else {}}}],
                     "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}]}}


def machine_body(name: str, node: str) -> dict[str, Any]:
    return {"apiVersion": f"{CAPI_GROUP}/v1beta2", "kind": "Machine",
            "metadata": {"name": name, "ownerReferences": [{"apiVersion": f"{CAPI_GROUP}/v1beta2", "kind": "MachineSet",
                                                            "name": "workers", "uid": "00000000-0000-0000-0000-0000000"
                                                            "00001"}]},
            "spec": {"clusterName": "demo", "bootstrap": {"dataSecretName": "b"}, "providerID": f"kwok://{node}",
                     "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "KwokMachine",
                                           "name": name}}}


def ignore_missing(call: Any, *args: Any, **kwargs: Any) -> None:
    try:
        call(*args, **kwargs)
    except client.ApiException as exc:
        if exc.status not in (404, 409):
            raise


def differences(api: client.ApiClient, reflector: Reflector[Any]) -> list[str]:
    """What the cache holds that a fresh LIST (decoded the same way) does not, and the other way round."""
    fresh = Reflector(api, reflector.resource)
    fresh.relist()
    cached = {k: reflector.get(k) for k in reflector.keys()}
    listed = {k: fresh.get(k) for k in fresh.keys()}
    out = [f"{reflector.resource.name}: {k} only in the cache" for k in cached.keys() - listed.keys()]
    out += [f"{reflector.resource.name}: {k} missing from the cache" for k in listed.keys() - cached.keys()]
    out += [f"{reflector.resource.name}: {k} differs" for k in cached.keys() & listed.keys() if cached[k] != listed[k]]
    # The buckets (pods by node) the store keeps beside its items say the same as a LIST.
    bucket_of = reflector.resource.bucket or (lambda _: "")
    key_of = {id(value): key for key, value in cached.items()}
    buckets = {name: {key_of.get(id(v), "?") for v in items} for name, items in reflector.buckets().items() if items}
    expected: dict[str, set[str]] = {}
    for key, value in listed.items():
        expected.setdefault(bucket_of(value), set()).add(key)
    if buckets != expected:
        out.append(f"{reflector.resource.name}: buckets {sorted(buckets)} differ from a LIST's {sorted(expected)}")
    return out


def settled(api: client.ApiClient, cache: ClusterCache) -> list[str]:
    return [d for r in cache.reflectors() for d in differences(api, r)]


@pytest.fixture
def cache(dds_api: Any, namespace: str) -> Iterator[ClusterCache]:
    """DDS's cache as its ServiceAccount (harness/rbac.py); the churn and the fresh LISTs compared are the admin's."""
    cache = cluster_cache(dds_api, [namespace])
    cache.start()
    try:
        assert cache.wait_synced(60), "the cache never synced"
        yield cache
    finally:
        cache.stop()


class Churn:
    """Random changes of every kind the cache mirrors, in one namespace plus nodes of its own."""

    def __init__(self, api: client.ApiClient, namespace: str, seed: int) -> None:
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.namespace = namespace
        self.rng = random.Random(seed)
        self.nodes: list[str] = []
        self.pods: list[str] = []
        self.machines: list[str] = []
        self._serial = 0

    def name(self, prefix: str) -> str:
        self._serial += 1
        return f"{prefix}-{self.namespace}-{self._serial}"

    def add_node(self) -> None:
        name = self.name("cache-node")
        self.core.create_node(node_body(name, gpus=self.rng.randint(0, 2)))
        self.nodes.append(name)

    def remove_node(self) -> None:
        if self.nodes:
            ignore_missing(self.core.delete_node, self.nodes.pop(self.rng.randrange(len(self.nodes))))

    def patch_gpus(self) -> None:
        if self.nodes:
            gpus = str(self.rng.randint(0, 4))
            ignore_missing(self.core.patch_node_status, self.rng.choice(self.nodes),
                           {"status": {"capacity": {GPU: gpus}, "allocatable": {GPU: gpus}}})

    def add_pod(self) -> None:
        name = self.name("p")
        self.core.create_namespaced_pod(self.namespace, pod_body(name, gpus=self.rng.choice((0, 0, 1))))
        self.pods.append(name)

    def remove_pod(self) -> None:
        if self.pods:
            ignore_missing(self.core.delete_namespaced_pod, self.pods.pop(self.rng.randrange(len(self.pods))),
                           self.namespace, grace_period_seconds=0)

    def add_machine(self) -> None:
        if self.nodes:
            name = self.name("m")
            self.custom.create_namespaced_custom_object(CAPI_GROUP, "v1beta2", self.namespace, "machines",
                                                        machine_body(name, self.rng.choice(self.nodes)))
            self.machines.append(name)

    def mark_machine(self) -> None:
        if self.machines:
            ignore_missing(self.custom.patch_namespaced_custom_object, CAPI_GROUP, "v1beta2", self.namespace,
                           "machines", self.rng.choice(self.machines),
                           {"metadata": {"annotations": {"cluster.x-k8s.io/delete-machine": "yes"}}})

    def step(self) -> None:
        action = self.rng.choice((self.add_node, self.remove_node, self.patch_gpus, self.patch_gpus,
                                  self.add_pod, self.add_pod, self.add_pod, self.remove_pod, self.remove_pod,
                                  self.add_machine, self.mark_machine))
        action()

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step()

    def cleanup(self) -> None:
        for name in self.nodes:
            ignore_missing(self.core.delete_node, name)


def test_after_churn_and_an_apiserver_restart_the_cache_equals_a_fresh_list(control_plane: Any, namespace: str,
                                                                          cache: ClusterCache) -> None:
    api = control_plane.api_client()
    churn = Churn(api, namespace, seed=17)
    try:
        for _ in range(4):
            churn.add_node()
        churn.run(120)
        wait_for("the cache to match a LIST before the restart", lambda: not settled(api, cache), timeout=60)

        # Changes keep coming while the apiserver goes away and comes back: the open watches break mid-stream.
        background = threading.Thread(target=lambda: churn_until_error(churn, 40), daemon=True)
        background.start()
        control_plane.restart_apiserver()
        background.join(120)
        churn.run(120)

        wait_for("the cache to match a LIST after the restart", lambda: not settled(api, cache), timeout=120)
        pods = cache.pods.reflectors[0]
        assert pods.stats.relists_after_error >= 1, pods.stats  # the restart was noticed, and healed by a relist
        # Every reflector lists again after the restart; a quiet one (no change to notice) may do so last.
        wait_for("every reflector synced again", lambda: cache.synced, timeout=60)
        # The cache holds every kind the observer reads, with the churn's own objects in it.
        assert {f"{namespace}/{p}" for p in churn.pods} <= cache.pods.keys()
        assert set(churn.nodes) <= cache.nodes.keys()
        assert cache.machines is not None and {f"{namespace}/{m}" for m in churn.machines} <= cache.machines.keys()
    finally:
        churn.cleanup()


def churn_until_error(churn: Churn, steps: int) -> None:
    """Churn while the apiserver may be down: requests that fail are simply not made (the cache must not care)."""
    for _ in range(steps):
        try:
            churn.step()
        except Exception:  # the apiserver is restarting
            pass


def compact_etcd(control_plane: Any) -> None:
    """Drop etcd's history up to now, as the apiserver's periodic compaction does (every 5 minutes by default)."""
    etcd = f"http://127.0.0.1:{control_plane.ports.etcd_client}"
    key = base64.b64encode(b"/").decode()
    revision = requests.post(f"{etcd}/v3/kv/range", json={"key": key}, timeout=10).json()["header"]["revision"]
    requests.post(f"{etcd}/v3/kv/compaction", json={"revision": revision, "physical": True},
                  timeout=30).raise_for_status()


def test_a_resource_version_the_apiserver_no_longer_has_makes_the_reflector_relist(control_plane: Any,
                                                                                   namespace: str,
                                                                                   dds_api: Any) -> None:
    api = control_plane.api_client()
    core = client.CoreV1Api(api)
    reflector = cluster_cache(dds_api, [namespace]).pods.reflectors[0]
    reflector.relist()
    # While this reflector is away: a pod it never hears of, its history compacted, the apiserver's watch cache
    # rebuilt from now on. Its resourceVersion is then gone (410) and only a relist can continue.
    core.create_namespaced_pod(namespace, pod_body("while-away"))
    compact_etcd(control_plane)
    control_plane.restart_apiserver()
    stop = threading.Event()
    thread = threading.Thread(target=reflector.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for("a relist after 410 Gone", lambda: reflector.stats.relists_after_gone >= 1, timeout=60)
        wait_for("the pod created while away", lambda: reflector.get(f"{namespace}/while-away"), timeout=30)
        wait_for("the reflector to match a LIST", lambda: not differences(api, reflector), timeout=30)
    finally:
        stop.set()
        reflector.close_stream()
        thread.join(10)
