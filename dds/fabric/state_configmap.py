"""`FabricStateStore` on a ConfigMap: JSON under key `state.json`, compare-and-swap on the ConfigMap's resourceVersion.

The simulated CDI manager keeps its devices and operations here (settings.simulated_fabric.state_configmap in
settings.namespace), so its state survives a DDS kill -9 the way a real external manager's would. A replace (PUT) carries
metadata.resourceVersion; the apiserver answers 409 Conflict when someone wrote in between, which becomes StateConflict for
the backend to re-read and re-apply. Transient failures (429, 5xx, connection errors) are retried with backoff here.
A ConfigMap holds at most 1 MiB: backends prune finished operations to stay far below that.
"""

from __future__ import annotations

import json
from typing import Optional

from kubernetes import client
from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential

from dds.fabric.state import Document, StateConflict, StateStoreError

DATA_KEY = "state.json"
_TRANSIENT_STATUS = {429, 500, 502, 503, 504}


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, client.ApiException):
        return exc.status in _TRANSIENT_STATUS
    return isinstance(exc, (ConnectionError, TimeoutError, OSError))


_with_retries = retry(retry=retry_if_exception(_transient), stop=stop_after_attempt(5),
                      wait=wait_exponential(multiplier=0.1, max=2.0), reraise=True)


class ConfigMapFabricStateStore:
    def __init__(self, api: client.ApiClient, namespace: str, name: str, component: str = "dds-fabric") -> None:
        self._core = client.CoreV1Api(api)
        self.namespace = namespace
        self.name = name
        self._component = component

    def describe(self) -> str:
        return f"ConfigMap {self.namespace}/{self.name}"

    def load(self) -> tuple[Optional[Document], Optional[str]]:
        try:
            config_map = self._read()
        except client.ApiException as exc:
            if exc.status == 404:
                return None, None
            raise StateStoreError(f"{self.describe()}: read failed: {exc.status} {exc.reason}") from exc
        except OSError as exc:
            raise StateStoreError(f"{self.describe()}: read failed: {exc}") from exc
        raw = (config_map.data or {}).get(DATA_KEY)
        if raw is None:
            return None, config_map.metadata.resource_version
        try:
            document = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise StateStoreError(f"{self.describe()}: data[{DATA_KEY}] is not JSON: {exc}") from exc
        if not isinstance(document, dict):
            raise StateStoreError(f"{self.describe()}: data[{DATA_KEY}] must be a JSON object")
        return document, config_map.metadata.resource_version

    def save(self, document: Document, expected_version: Optional[str]) -> str:
        body = client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace, resource_version=expected_version,
                                         labels={"app.kubernetes.io/name": "dds",
                                                 "app.kubernetes.io/component": self._component}),
            data={DATA_KEY: json.dumps(document, sort_keys=True, separators=(",", ":"))})
        try:
            written = self._create(body) if expected_version is None else self._replace(body)
        except client.ApiException as exc:
            if exc.status == 409:
                raise StateConflict(f"{self.describe()}: changed by another writer") from exc
            raise StateStoreError(f"{self.describe()}: write failed: {exc.status} {exc.reason}") from exc
        except OSError as exc:
            raise StateStoreError(f"{self.describe()}: write failed: {exc}") from exc
        return written.metadata.resource_version

    @_with_retries
    def _read(self) -> client.V1ConfigMap:
        return self._core.read_namespaced_config_map(self.name, self.namespace)

    @_with_retries
    def _create(self, body: client.V1ConfigMap) -> client.V1ConfigMap:
        return self._core.create_namespaced_config_map(self.namespace, body)

    @_with_retries
    def _replace(self, body: client.V1ConfigMap) -> client.V1ConfigMap:
        return self._core.replace_namespaced_config_map(self.name, self.namespace, body)
