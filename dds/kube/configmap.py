"""A JSON document in one ConfigMap (key `state.json`): DDS's state that must outlive a process — in-flight instances
(dds/scaling/instances.py) and the simulated fabric's devices and operations (dds/fabric/state.py).

Writes are compare-and-swap on the ConfigMap's resourceVersion: a replace (PUT) carries `metadata.resourceVersion`, the
apiserver answers 409 Conflict when someone wrote in between, which becomes `StateConflict` (re-read, re-apply, save
again — `update` does that loop). Transient failures (429, 5xx, connection errors) are retried with backoff. A ConfigMap
holds at most 1 MiB: writers keep their documents far below that (finished operations are pruned).
"""

from __future__ import annotations

import json
import logging
from typing import Any, Callable, Optional

from kubernetes import client

from dds.kube.errors import ApiError, retrying

log = logging.getLogger(__name__)

DATA_KEY = "state.json"
# The ConfigMaps DDS keeps state in, named here so the start check (dds/kube/preflight.py) asks RBAC for them by name,
# as manifests/dds/rbac.yaml grants them: the in-flight instances, and the Redfish operation log (the simulated
# fabric's state ConfigMap name with this suffix).
INSTANCES_CONFIGMAP = "dds-instances"
REDFISH_LOG_SUFFIX = "-redfish"
Document = dict[str, Any]
_UPDATE_ATTEMPTS = 10


class StateConflict(Exception):
    """Another writer changed the state since it was read: re-read, re-apply, save again."""


class StateStoreError(Exception):
    """The state could not be read or written (after retries); whatever depended on the write was not done."""


class CorruptDocument(StateStoreError):
    """The ConfigMap exists but its data is not a JSON object (hand-edited, truncated). `version` lets a caller that
    chooses to start over overwrite it."""

    def __init__(self, message: str, version: Optional[str]) -> None:
        super().__init__(message)
        self.version = version


_with_retries = retrying(5)


class ConfigMapDocument:
    def __init__(self, api: client.ApiClient, namespace: str, name: str, component: str = "dds") -> None:
        self._core = client.CoreV1Api(api)
        self.namespace = namespace
        self.name = name
        self._component = component

    def describe(self) -> str:
        return f"ConfigMap {self.namespace}/{self.name}"

    def load(self) -> tuple[Optional[Document], Optional[str]]:
        """The stored document and its version; (None, None) when the ConfigMap does not exist yet."""
        try:
            config_map = self._read()
        except client.ApiException as exc:
            if exc.status == 404:
                return None, None
            raise StateStoreError(f"{self.describe()}: read failed: {_answer(exc)}") from exc
        except OSError as exc:
            raise StateStoreError(f"{self.describe()}: read failed: {exc}") from exc
        version = config_map.metadata.resource_version
        raw = (config_map.data or {}).get(DATA_KEY)
        if raw is None:
            return None, version
        try:
            document = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise CorruptDocument(f"{self.describe()}: data[{DATA_KEY}] is not JSON: {exc}", version) from exc
        if not isinstance(document, dict):
            raise CorruptDocument(f"{self.describe()}: data[{DATA_KEY}] must be a JSON object", version)
        return document, version

    def save(self, document: Document, expected_version: Optional[str]) -> str:
        """Store `document` if the stored version is still `expected_version` (None: create). Returns the new version."""
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
            raise StateStoreError(f"{self.describe()}: write failed: {_answer(exc)}") from exc
        except OSError as exc:
            raise StateStoreError(f"{self.describe()}: write failed: {exc}") from exc
        return written.metadata.resource_version

    def update(self, mutate: Callable[[Document], None],
               on_corrupt: Optional[Callable[[CorruptDocument], Document]] = None) -> Document:
        """Read, `mutate` in place, save; again on a conflict. `on_corrupt` decides what a corrupt document becomes
        (default: the error propagates)."""
        for _ in range(_UPDATE_ATTEMPTS):
            try:
                document, version = self.load()
            except CorruptDocument as exc:
                if on_corrupt is None:
                    raise
                document, version = on_corrupt(exc), exc.version
            document = document if document is not None else {}
            mutate(document)
            try:
                self.save(document, version)
                return document
            except StateConflict:
                continue
        raise StateStoreError(f"{self.describe()}: {_UPDATE_ATTEMPTS} writers in a row got in first; giving up")

    @_with_retries
    def _read(self) -> client.V1ConfigMap:
        return self._core.read_namespaced_config_map(self.name, self.namespace)

    @_with_retries
    def _create(self, body: client.V1ConfigMap) -> client.V1ConfigMap:
        return self._core.create_namespaced_config_map(self.namespace, body)

    @_with_retries
    def _replace(self, body: client.V1ConfigMap) -> client.V1ConfigMap:
        return self._core.replace_namespaced_config_map(self.name, self.namespace, body)


def _answer(exc: client.ApiException) -> str:
    """The status, and the apiserver's own words when it sent them (a 422 says which limit the ConfigMap broke)."""
    said = ApiError.of(exc).message
    return f"{exc.status} {exc.reason}" + (f": {said}" if said else "")
