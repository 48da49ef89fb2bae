"""Every snapshot the controller plans on knows the cluster's gangs.

The observer reads pods as they are; which of them form a gang, and how many must run at once, lives in other objects
(coscheduling PodGroups, 1.35 Workloads: dds/kube/podgroups.py). This wraps the observer so the control loop and CA's
RPCs (which observe through the controller) both plan on snapshots with the gangs filled in, and reads those objects
only when a pending pod belongs to a group.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dds.controller.observe import ClusterObserver, Observation
from dds.kube.podgroups import PodGroupReader, namespaces_to_read, snapshot_with_groups


class PodGroupObserver:
    """A ClusterObserver whose `observe()` fills in pod groups; everything else is the wrapped observer's."""

    def __init__(self, observer: ClusterObserver, reader: PodGroupReader) -> None:
        self.wrapped = observer
        self._reader = reader

    def observe(self) -> Observation:
        observation = self.wrapped.observe()
        namespaces = namespaces_to_read(observation.snapshot)
        if not namespaces:
            return observation
        groups = self._reader.read(namespaces)
        return replace(observation, snapshot=snapshot_with_groups(observation.snapshot, groups))

    def __getattr__(self, name: str) -> Any:
        # The rest of the observer (its idle tracker, cache, machines) is used as is by the loop and its tests.
        return getattr(self.wrapped, name)
