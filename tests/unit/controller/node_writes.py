"""A NodeWriter (dds/controller/apply.py) over nodes held in memory, for unit tests of what goes through the applier."""

from __future__ import annotations

from typing import Mapping


class NodesInMemory:
    """Taints (key -> (value, effect)), labels and the work on each node, as the apiserver would keep them."""

    def __init__(self, work: Mapping[str, list[str]] | None = None) -> None:
        self.taints: dict[str, dict[str, tuple[str, str]]] = {}
        self.labels: dict[str, dict[str, str]] = {}
        self.work = {node: list(pods) for node, pods in (work or {}).items()}
        self.uncordoned: list[str] = []

    def taint(self, node: str, key: str, value: str, effect: str) -> None:
        self.taints.setdefault(node, {}).setdefault(key, (value, effect))

    def untaint(self, node: str, key: str, *, uncordon_if_cordoned_with_it: bool = False) -> None:
        self.taints.get(node, {}).pop(key, None)
        if uncordon_if_cordoned_with_it:
            self.uncordoned.append(node)

    def label(self, node: str, labels: Mapping[str, str]) -> None:
        self.labels.setdefault(node, {}).update(labels)

    def work_on(self, node: str) -> list[str]:
        return list(self.work.get(node, []))
