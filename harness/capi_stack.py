"""Cluster API on a harness ControlPlane: its real manager (harness/capi.py) and the kwok infrastructure provider
(harness/kwok_provider.py), started once per control plane and stopped with it, for every test and demo that has
MachineSets.

`cluster_api_on(plane)` starts both on first use and returns the same `ClusterApi` afterwards (the manager's start-up,
its CRD migration and webhook registration, is paid once per control plane). `workload_cluster(namespace, name)` makes
what worker Machines in that namespace need to get nodeRefs (harness/kwok_provider.py `install_cluster`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import pytest

from harness import kwok_provider
from harness.capi import ClusterApiManager
from harness.install import AdminApi
from harness.controlplane import ControlPlane
from harness.kwok_provider import KwokInfrastructureProvider
from harness.pytest_plugin import own_control_plane

DEFAULT_CLUSTER = "kwok"


@dataclass
class ClusterApi:
    manager: ClusterApiManager
    provider: KwokInfrastructureProvider
    api: AdminApi
    _clusters: set[tuple[str, str]] = field(default_factory=set)

    @property
    def version(self) -> str:
        return self.manager.version

    def workload_cluster(self, namespace: str, name: str = DEFAULT_CLUSTER) -> str:
        """The Cluster `name` in `namespace`, made once; returns its name."""
        if (namespace, name) not in self._clusters:
            kwok_provider.install_cluster(self.api, namespace, name)
            self._clusters.add((namespace, name))
        return name

    def machine_template(self, namespace: str, name: str, node: Optional[Mapping[str, Any]] = None) -> None:
        kwok_provider.create_template(self.api, kwok_provider.machine_template(namespace, name, node))


_RUNNING: dict[str, ClusterApi] = {}  # plane workdir -> its Cluster API
_LOCK = threading.Lock()


def cluster_api_on(plane: ControlPlane, *, provisioning_delay_seconds: float = 0.0,
                   manager_args: Sequence[str] = ()) -> ClusterApi:
    """The plane's Cluster API, started on first use (the manager is one of the plane's components: it stops with
    the plane; the provider pauses once the manager is no longer running). `manager_args`: more of the manager's flags
    (harness/capi.py `ClusterApiManager`), on first use only."""
    with _LOCK:
        key = str(plane.workdir)
        if key not in _RUNNING:
            manager = ClusterApiManager(plane, extra_args=manager_args).start()
            api = manager.admin_api()
            kwok_provider.install(api)
            provider = KwokInfrastructureProvider(plane.api_client(),
                                                  provisioning_delay_seconds=provisioning_delay_seconds,
                                                  active=manager.running).start()
            _RUNNING[key] = ClusterApi(manager=manager, provider=provider, api=api)
        return _RUNNING[key]


# A module whose test starts Cluster API in its own way (the kwok provider as a program) imports this fixture: the
# session's plane runs its Cluster API already (harness/pytest_plugin.py).
@pytest.fixture(scope="module")
def control_plane(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of the requesting module's own."""
    yield from own_control_plane(request, tmp_path_factory)
