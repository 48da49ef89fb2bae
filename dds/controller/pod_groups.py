"""Every snapshot the controller plans on knows the cluster's gangs.

The observer reads pods as they are; which of them form a gang, and how many must run at once, lives in other objects
(coscheduling PodGroups, 1.35 Workloads, 1.36 PodGroups: dds/kube/podgroups.py). This wraps the observer so the
control loop and CA's RPCs (which observe through the controller) both plan on snapshots with the gangs filled in, and
reads those objects only when a pending pod belongs to a group: from the watch cache for the kinds it watches.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dds.controller.observe import ClusterObserver, Observation
from dds.kube.podgroups import GangApi, PodGroupReader, kinds_to_read, namespaces_to_read, snapshot_with_groups


def watched_gangs(observer: Any) -> dict[GangApi, Any]:
    """The observer's watch-cache collections of gang objects, by kind ({} without a cache or gang APIs)."""
    cache = getattr(observer, "cache", None)
    return dict(getattr(cache, "gangs", None) or {})


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
        groups = self._reader.read(namespaces, kinds_to_read(observation.snapshot))
        return replace(observation, snapshot=snapshot_with_groups(observation.snapshot, groups))

    def __getattr__(self, name: str) -> Any:
        # The rest of the observer (its idle tracker, cache, machines) is used as is by the loop and its tests.
        return getattr(self.wrapped, name)
