"""In-flight instances (dds/scaling/instances.py `StateStore`) kept in a ConfigMap, so a restarted DDS lists to CA
exactly what the previous process had promised it.

A hand-edited or truncated ConfigMap must not stop DDS from answering CA: it is logged and overwritten by the next
write, starting from no instances (CA then sees its scale-ups vanish and re-plans: the safe direction).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, MutableMapping

from kubernetes import client

from dds.kube.configmap import DATA_KEY, ConfigMapDocument, CorruptDocument, Document, StateStoreError

__all__ = ["DATA_KEY", "ConfigMapStateStore", "StateStoreError"]

log = logging.getLogger(__name__)


def _start_over(exc: CorruptDocument) -> Document:
    log.error("%s; starting from an empty state", exc)
    return {}


class ConfigMapStateStore:
    """`StateStore` on ConfigMap `namespace/name`, key `state.json`."""

    def __init__(self, api: client.ApiClient, namespace: str, name: str, component: str = "dds") -> None:
        self._document = ConfigMapDocument(api, namespace, name, component)

    def describe(self) -> str:
        return self._document.describe()

    def load(self) -> dict[str, dict[str, Any]]:
        try:
            document, _ = self._document.load()
        except CorruptDocument as exc:
            document = _start_over(exc)
        return document or {}

    def update(self, mutate: Callable[[MutableMapping[str, dict[str, Any]]], None]) -> None:
        self._document.update(mutate, on_corrupt=_start_over)
