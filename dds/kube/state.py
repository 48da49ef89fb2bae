"""A small JSON document kept in a ConfigMap, for state that must outlive a DDS process (in-flight instances).

Writes are read-modify-write with the ConfigMap's resourceVersion (optimistic concurrency): a concurrent writer makes
the replace fail with 409 Conflict, and the whole update is retried on a fresh read, so no change is lost.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Callable, MutableMapping

from kubernetes import client
from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential

log = logging.getLogger(__name__)

DATA_KEY = "state.json"
_RETRYABLE_STATUS = {409, 429, 500, 502, 503, 504}


class StateStoreError(Exception):
    """The ConfigMap could not be read or written (after retries)."""


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, client.ApiException):
        return exc.status in _RETRYABLE_STATUS
    return isinstance(exc, (ConnectionError, TimeoutError, OSError))


_with_retries = retry(retry=retry_if_exception(_retryable), stop=stop_after_attempt(5),
                      wait=wait_exponential(multiplier=0.1, max=2.0), reraise=True)


class ConfigMapStateStore:
    """`StateStore` (dds/provider/instances.py) on ConfigMap `namespace/name`, key `state.json`."""

    def __init__(self, api: client.ApiClient, namespace: str, name: str, component: str = "dds") -> None:
        self._core = client.CoreV1Api(api)
        self.namespace = namespace
        self.name = name
        self._component = component

    def describe(self) -> str:
        return f"ConfigMap {self.namespace}/{self.name}"

    def load(self) -> dict[str, dict[str, Any]]:
        try:
            document, _ = self._read()
        except client.ApiException as exc:
            raise StateStoreError(f"{self.describe()}: read failed: {exc.status} {exc.reason}") from exc
        return document

    def update(self, mutate: Callable[[MutableMapping[str, dict[str, Any]]], None]) -> None:
        try:
            self._update_once(mutate)
        except client.ApiException as exc:
            raise StateStoreError(f"{self.describe()}: write failed: {exc.status} {exc.reason}") from exc

    @_with_retries
    def _update_once(self, mutate: Callable[[MutableMapping[str, dict[str, Any]]], None]) -> None:
        document, resource_version = self._read()
        mutate(document)
        body = self._body(document, resource_version)
        if resource_version is None:
            self._core.create_namespaced_config_map(self.namespace, body)
        else:
            # replace (PUT) carries metadata.resourceVersion: the apiserver answers 409 if someone wrote in between.
            self._core.replace_namespaced_config_map(self.name, self.namespace, body)

    @_with_retries
    def _read(self) -> tuple[dict[str, dict[str, Any]], str | None]:
        try:
            config_map = self._core.read_namespaced_config_map(self.name, self.namespace)
        except client.ApiException as exc:
            if exc.status == 404:
                return {}, None
            raise
        raw = (config_map.data or {}).get(DATA_KEY, "") or "{}"
        try:
            document = json.loads(raw)
        except json.JSONDecodeError as exc:
            # A hand-edited or truncated ConfigMap must not stop DDS: start empty and overwrite it on the next write.
            log.error("%s: key %s is not JSON (%s); starting from an empty state", self.describe(), DATA_KEY, exc)
            document = {}
        if not isinstance(document, dict):
            log.error("%s: key %s is not a JSON object; starting from an empty state", self.describe(), DATA_KEY)
            document = {}
        return document, config_map.metadata.resource_version

    def _body(self, document: dict[str, dict[str, Any]], resource_version: str | None) -> client.V1ConfigMap:
        return client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace, resource_version=resource_version,
                                         labels={"app.kubernetes.io/managed-by": self._component}),
            data={DATA_KEY: json.dumps(document, sort_keys=True, indent=1)})
