"""Two DDS replicas, each built by `build_app` as `dds serve` builds it, on the real apiserver with leader election,
as DDS's ServiceAccount: every replica is Ready once it can serve (not only the leader), so a Deployment's rolling
update and a PodDisruptionBudget work; the leader alone carries the label dds.cdi.dev/leader=true on its Pod, which the
Service selects (manifests/dds/service.yaml), so cluster-autoscaler reaches the leader; when the leader stops (SIGTERM
during an upgrade) the label moves to the other replica at once, well within the lease duration, and the other replica
stays Ready throughout.

No kubelet runs here: the Pods are API objects the replicas are told they run in (POD_NAME), which is all the label
needs; the readiness a kubelet would probe is each replica's /readyz.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from kubernetes import client

from dds.app import App, build_app
from dds.kube.leader_label import LEADER_LABEL, LEADER_VALUE, LeaderPodLabel
from tests.integration.controller.harness import settings_for
from tests.integration.ops.test_leader_election_apiserver import wait_for

pytestmark = pytest.mark.integration

LEASE, RENEW, RETRY = 4.0, 3.0, 0.5
# Lease duration + retry period, with room for the candidates' retry jitter (x2.2) and a slow API call.
ELECTED_BOUND = LEASE + RETRY * 2.2 + 2.0
READY_BOUND = 60.0  # the cache's first LIST and the planner's first pass on a loaded machine
IDENTITIES = ("dds-a", "dds-b")


def ready(app: App) -> bool:
    return ready_at(app.ops.port)


def ready_at(port: int) -> bool:
    """The kubelet's readiness probe of a replica's /readyz (a replica that stopped refuses the connection)."""
    try:
        return requests.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def create_pod(admin: client.CoreV1Api, namespace: str, name: str) -> None:
    """A DDS replica's Pod as the API holds it; a scheduler nobody runs, so nothing but DDS's label changes it."""
    admin.create_namespaced_pod(namespace, {
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "dds"}},
        "spec": {"schedulerName": "nobody", "containers": [{"name": "dds", "image": "example.com/dds:1"}]}})


@pytest.fixture
def replicas(control_plane: Any, namespace: str, dds_api: client.ApiClient) -> Iterator[dict[str, App]]:
    admin = client.CoreV1Api(control_plane.api_client())
    apps: dict[str, App] = {}
    for identity in IDENTITIES:
        create_pod(admin, namespace, identity)
        settings = settings_for(namespace).model_copy(update={
            "leader_election": True, "identity": identity, "lease_duration_seconds": LEASE,
            "renew_deadline_seconds": RENEW, "retry_period_seconds": RETRY})
        apps[identity] = build_app(settings, dds_api, pod_name=identity)
    starters = [threading.Thread(target=app.start, name=f"start-{name}") for name, app in apps.items()]
    for starter in starters:
        starter.start()
    for starter in starters:
        starter.join(READY_BOUND)
    try:
        yield apps
    finally:
        for app in apps.values():
            app.stop()


def labelled(admin: client.CoreV1Api, namespace: str) -> set[str]:
    """The Pods the Service's selector picks (app.kubernetes.io/name=dds, dds.cdi.dev/leader=true)."""
    pods = admin.list_namespaced_pod(namespace, label_selector=f"app.kubernetes.io/name=dds,{LEADER_LABEL}={LEADER_VALUE}")
    return {p.metadata.name for p in pods.items}


def test_both_replicas_are_ready_and_the_service_selects_the_leader_alone(control_plane: Any, namespace: str,
                                                                         replicas: dict[str, App]) -> None:
    admin = client.CoreV1Api(control_plane.api_client())
    assert wait_for(lambda: all(ready(app) for app in replicas.values()), READY_BOUND), \
        {name: requests.get(f"http://127.0.0.1:{app.ops.port}/readyz?verbose", timeout=2).text
         for name, app in replicas.items()}
    assert wait_for(lambda: len(labelled(admin, namespace)) == 1, ELECTED_BOUND)
    [leader] = [name for name, app in replicas.items() if app.is_leader]
    assert labelled(admin, namespace) == {leader}
    # Several renewals later, still one leader, still labelled alone, both still Ready.
    time.sleep(3 * RETRY * 2.2)
    assert [name for name, app in replicas.items() if app.is_leader] == [leader]
    assert labelled(admin, namespace) == {leader} and all(ready(app) for app in replicas.values())


def test_stopping_the_leader_moves_the_label_within_the_lease_duration(control_plane: Any, namespace: str,
                                                                      replicas: dict[str, App]) -> None:
    """What `helm upgrade` does to the leader's pod (SIGTERM: App.stop releases the Lease): the Service has no leader
    to route to for the handover only, measured here, and the other replica never stops being Ready."""
    admin = client.CoreV1Api(control_plane.api_client())
    assert wait_for(lambda: all(ready(app) for app in replicas.values()), READY_BOUND)
    assert wait_for(lambda: len(labelled(admin, namespace)) == 1, ELECTED_BOUND)
    [old] = labelled(admin, namespace)
    [new] = [name for name in IDENTITIES if name != old]

    stopped_at = time.monotonic()
    leaving = replicas.pop(old)  # stopped here, not again by the fixture
    leaving_port = leaving.ops.port
    leaving.stop()
    assert old not in labelled(admin, namespace)  # cleared before stop() returned
    standby_unready = []

    def handed_over() -> bool:
        if not ready(replicas[new]):
            standby_unready.append(time.monotonic() - stopped_at)
        return labelled(admin, namespace) == {new}

    assert wait_for(handed_over, ELECTED_BOUND), labelled(admin, namespace)
    handover = time.monotonic() - stopped_at
    print(f"leader {old} stopped; {new} labelled after {handover:.2f}s (lease duration {LEASE}s)")
    assert handover < LEASE, f"the handover took {handover:.2f}s, not under the lease duration ({LEASE}s)"
    assert standby_unready == [], f"{new} was not Ready during the handover at {standby_unready}"
    assert replicas[new].is_leader and not ready_at(leaving_port)


def test_a_label_the_apiserver_refused_is_written_by_the_next_pass(control_plane: Any, namespace: str,
                                                                   dds_api: client.ApiClient) -> None:
    """A leader whose label could not be written (here: its Pod not there yet, a 404) is not left unreachable until
    the next election: the control loop's next pass writes it (App wires retry_failed as a loop listener)."""
    admin = client.CoreV1Api(control_plane.api_client())
    label = LeaderPodLabel(dds_api, namespace, "dds-late", request_timeout=10.0)
    assert not label.mark(True)
    create_pod(admin, namespace, "dds-late")
    label.retry_failed()
    assert labelled(admin, namespace) == {"dds-late"}
    label.retry_failed()  # written: nothing more to do
    assert labelled(admin, namespace) == {"dds-late"}
