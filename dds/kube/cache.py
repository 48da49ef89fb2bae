"""A watch-fed cache of what DDS reads on every decision: the informer pattern (client-go's Reflector + Store).

    LIST (paged, limit=500) ──► store replaced whole, synced ──► WATCH ?resourceVersion=<list's>&allowWatchBookmarks=true
          ▲                                                         │ ADDED / MODIFIED / DELETED: one key changes
          │                                                         │ BOOKMARK: only the resourceVersion moves
          └── 410 Gone, an ERROR event, or the connection broke ◄───┘ the server ended the watch cleanly: WATCH again

Every object is decoded once, when it arrives, into the lean record the observer needs (dds/kube/decode.py), so a
decision reads dicts of frozen records and sends no request at all. Responses are read raw (`_preload_content=False`)
and parsed with orjson; docs/scale.md says why that and not the client's models.

Staleness is bounded by the watch itself: a reflector that lost its stream is not `synced` until its relist finishes,
and the observer then reads the apiserver directly (dds/controller/observe.py), so no decision is made on a cache
known to have missed events. A relist after a broken connection (not only after 410) is deliberate: an apiserver
restart may come back with etcd compacted, and a relist is the only way to notice deletions missed in between.

Writes never go through the cache: they carry a resourceVersion precondition or re-read the one object they change.
What a write answers can be `assume`d into the cache (client-go's MutationCache does the same), so a decision taken
right after DDS's own write never reads the state before it while the watch event is still on its way.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Iterator, Mapping, Optional, Sequence, TypeVar

import orjson
from kubernetes import client

from dds.kube import decode, raw

log = logging.getLogger(__name__)

T = TypeVar("T")
Obj = dict[str, Any]

PAGE_SIZE = 500
WATCH_TIMEOUT_SECONDS = (240, 360)  # server-side watch length, randomized so reflectors do not renew in lockstep
_READ_SLACK_SECONDS = 60.0  # bookmarks arrive about once a minute; a stream silent for longer than this is dead
_BACKOFF_SECONDS = (0.2, 10.0)


class Gone(Exception):
    """The resourceVersion to watch from is too old (410): only a relist can continue."""


class WatchError(Exception):
    """The apiserver ended a watch with an ERROR event other than 410."""


@dataclass(frozen=True)
class Resource(Generic[T]):
    """One collection to mirror: its URL path, and the decoder that turns an object into what is kept."""

    name: str  # for logs: "pods", "machines in ns-a"
    path: str  # "/api/v1/pods", "/apis/cluster.x-k8s.io/v1beta2/namespaces/ns-a/machines"
    decode: Callable[[Obj], T]
    namespace: Optional[str] = None  # the one namespace the path lists; None: every namespace (or cluster-scoped)
    # Buckets the store also keeps its items in (the informer's indexer): pods by node name, so a reader asking "the
    # pods on each node" gets the same tuple back for every node whose pods did not change (Reflector.buckets).
    bucket: Optional[Callable[[T], str]] = None
    # What stands for an object `decode` fails on (the error as text): a pod refused with it. None: the object is
    # left out. Either way one object DDS cannot read never stops the collection (Reflector.decoded).
    unreadable: Optional[Callable[[Obj, str], T]] = None

    @property
    def kind(self) -> str:
        """The collection's plural ("pods", "resourceclaims"), a metric label."""
        return self.path.rsplit("/", 1)[-1]


@dataclass
class ReflectorStats:
    lists: int = 0
    watches: int = 0
    events: int = 0
    relists_after_gone: int = 0
    relists_after_error: int = 0
    last_error: Optional[str] = None
    last_sync_seconds: float = 0.0


class Reflector(Generic[T]):
    """Mirrors one collection into a dict keyed by namespace/name. Thread-safe reads; one writer thread."""

    def __init__(self, api: client.ApiClient, resource: Resource[T], *, page_size: int = PAGE_SIZE,
                 watch_timeout_seconds: tuple[int, int] = WATCH_TIMEOUT_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._api = api
        self.resource = resource
        self._page_size = page_size
        self._watch_timeout = watch_timeout_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._items: dict[str, T] = {}
        self._values: Optional[tuple[T, ...]] = None  # items as a tuple, kept until the next change
        self._buckets: dict[str, dict[str, T]] = {}  # Resource.bucket of the items -> their items
        self._bucket_values: dict[str, tuple[T, ...]] = {}  # a bucket's items as a tuple, until the bucket changes
        self._resource_version = ""
        self._assumed: dict[str, int] = {}  # key -> resourceVersion of DDS's own write the watch has not shown yet
        self._synced = threading.Event()
        self.generation = 0  # bumped on every change: readers may keep derived data until it moves
        self.stats = ReflectorStats()
        self._response: Any = None  # the open watch, closed by stop()

    # --- reads ---
    @property
    def synced(self) -> bool:
        """The store holds a LIST and every event after it, with the watch open (or being renewed cleanly)."""
        return self._synced.is_set()

    def wait_synced(self, timeout: Optional[float] = None) -> bool:
        return self._synced.wait(timeout)

    def values(self) -> tuple[T, ...]:
        with self._lock:
            if self._values is None:
                self._values = tuple(self._items.values())
            return self._values

    def buckets(self) -> dict[str, tuple[T, ...]]:
        """The items by Resource.bucket (no bucket function: one bucket, ""). A bucket's tuple is the same object
        from call to call until one of its items changes, so readers can keep what they derive from it by identity."""
        with self._lock:
            if self.resource.bucket is None:
                return {"": self._values if self._values is not None else tuple(self._items.values())}
            made = self._bucket_values
            for name, items in self._buckets.items():
                if name not in made:
                    made[name] = tuple(items.values())
            return dict(made)

    def get(self, key: str) -> Optional[T]:
        with self._lock:
            return self._items.get(key)

    def keys(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._items)

    @property
    def resource_version(self) -> str:
        return self._resource_version

    def assume(self, obj: Obj) -> None:
        """Keep the object a write of DDS's just answered until the watch shows that write (or a later change). Events
        older than it are not applied to that key meanwhile: they would bring back the state before the write.
        resourceVersions are compared as numbers, which etcd-backed apiservers give; an object whose version is not a
        number is not assumed (the watch brings it, as without this)."""
        version = _version_number(decode.resource_version(obj))
        if version is None:
            return
        key, value = decode.object_key(obj), self.resource.decode(obj)
        with self._lock:
            seen = _version_number(self._resource_version)
            if seen is not None and version <= seen:
                return  # the watch has passed it: the store holds this write or something newer
            self._put(key, value)
            self._assumed[key] = version
            self._values = None
            self.generation += 1

    # --- the loop ---
    def run(self, stop: threading.Event) -> None:
        """LIST (unless the store is already synced), then WATCH until `stop`; relist whenever the watch cannot
        continue from where it was."""
        delay = _BACKOFF_SECONDS[0]
        need_list = not self.synced
        while not stop.is_set():
            try:
                if need_list:
                    self.relist()
                    need_list = False
                self.watch_once(stop)
                delay = _BACKOFF_SECONDS[0]  # a clean end: renew the watch from the last resourceVersion
            except Gone:
                self.stats.relists_after_gone += 1
                log.info("%s: resourceVersion %s is too old (410 Gone): relisting", self.resource.name,
                         self._resource_version)
                self._synced.clear()
                need_list = True
            except Exception as exc:  # connection refused/reset, apiserver restart, a 5xx, an ERROR event
                if stop.is_set():
                    break
                self.stats.relists_after_error += 1
                self.stats.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("%s: watch lost (%s): relisting in %.1fs", self.resource.name, self.stats.last_error,
                            delay)
                self._synced.clear()
                need_list = True
                stop.wait(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, _BACKOFF_SECONDS[1])

    def close_stream(self) -> None:
        response = self._response
        if response is not None:
            try:
                response.shutdown() if hasattr(response, "shutdown") else response.close()
            except Exception:  # already closed
                pass

    def relist(self) -> None:
        """Read the whole collection (in pages) and replace the store with it."""
        started = self._clock()
        self.stats.lists += 1
        items: dict[str, T] = {}
        version = ""
        continue_token = ""
        while True:
            query: list[tuple[str, Any]] = [("limit", self._page_size)]
            if continue_token:
                query.append(("continue", continue_token))
            body = orjson.loads(self._get(query).data)
            for obj in body.get("items") or ():
                value = self.decoded(obj)
                if value is not None:
                    items[decode.object_key(obj)] = value
            meta = body.get("metadata") or {}
            version = meta.get("resourceVersion") or version
            continue_token = meta.get("continue") or ""
            if not continue_token:
                break
        listed = _version_number(version)
        with self._lock:
            for key, assumed in list(self._assumed.items()):  # a write newer than the list stays visible
                if listed is not None and assumed <= listed:
                    del self._assumed[key]
                elif key in self._items:
                    items[key] = self._items[key]
            self._replace_all(items)
            self._resource_version = version
            self.generation += 1
        self.stats.last_sync_seconds = self._clock() - started
        self._synced.set()
        log.debug("%s: listed %d at resourceVersion %s in %.2fs", self.resource.name, len(items), version,
                  self.stats.last_sync_seconds)

    def watch_once(self, stop: threading.Event) -> None:
        """One WATCH from the current resourceVersion, applying events until the server ends it."""
        timeout = random.randint(*self._watch_timeout)
        query = [("watch", "true"), ("allowWatchBookmarks", "true"), ("resourceVersion", self._resource_version),
                 ("timeoutSeconds", timeout)]
        response = self._get(query, read_timeout=timeout + _READ_SLACK_SECONDS)
        self._response = response
        self.stats.watches += 1
        try:
            for line in _lines(response):
                if stop.is_set():
                    return
                self.apply(orjson.loads(line))
        finally:
            self._response = None
            response.release_conn()

    def apply(self, event: Mapping[str, Any]) -> None:
        """One watch event into the store."""
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone(obj.get("message", "410 Gone"))
            raise WatchError(f"{obj.get('code')} {obj.get('reason')}: {obj.get('message')}")
        version = decode.resource_version(obj)
        self.stats.events += 1
        if kind == "BOOKMARK":
            self._resource_version = version or self._resource_version
            return
        key = decode.object_key(obj)
        value = self.decoded(obj) if kind in ("ADDED", "MODIFIED") else None
        if value is None and kind in ("ADDED", "MODIFIED"):  # unreadable: the store keeps what it had of it
            self._resource_version = version or self._resource_version
            return
        with self._lock:
            assumed = self._assumed.pop(key, None)
            if assumed is not None and kind != "DELETED":
                number = _version_number(version)
                if number is not None and number < assumed:
                    self._assumed[key] = assumed
                    self._resource_version = version or self._resource_version
                    return  # older than DDS's own write to it, which the store already shows
            if kind == "DELETED":
                self._remove(key)
            elif value is not None:
                self._put(key, value)
            else:
                log.warning("%s: ignoring watch event of type %r", self.resource.name, kind)
                return
            self._values = None
            self._resource_version = version or self._resource_version
            self.generation += 1

    def decoded(self, obj: Obj) -> Optional[T]:
        """The object as the store keeps it. An object DDS cannot read (a decoder's error on what a tenant wrote) is
        that object's problem alone: the resource's `unreadable` record stands for it, else it is left out (a watch
        keeps the version it had); logged and counted, and the rest of the collection is read as usual."""
        try:
            return self.resource.decode(obj)
        except Exception as exc:  # any decoder error: one object's, never the collection's
            standing_in = self.resource.unreadable
            error = decode.noted_unreadable(self.resource.kind, decode.object_key(obj), exc, "refused with the error"
                                            if standing_in else "left out, the rest is read")
            return standing_in(obj, error) if standing_in is not None else None

    # --- the store's writes (under the lock): the items and their buckets together ---
    def _put(self, key: str, value: T) -> None:
        bucket_of = self.resource.bucket
        if bucket_of is not None:
            old = self._items.get(key)
            if old is not None:
                self._unbucket(key, bucket_of(old))
            name = bucket_of(value)
            self._buckets.setdefault(name, {})[key] = value
            self._bucket_values.pop(name, None)
        self._items[key] = value

    def _remove(self, key: str) -> None:
        old = self._items.pop(key, None)
        if old is not None and self.resource.bucket is not None:
            self._unbucket(key, self.resource.bucket(old))

    def _unbucket(self, key: str, name: str) -> None:
        items = self._buckets.get(name)
        if items is not None and items.pop(key, None) is not None:
            self._bucket_values.pop(name, None)
            if not items:
                del self._buckets[name]

    def _replace_all(self, items: dict[str, T]) -> None:
        self._items = items
        self._values = None
        self._buckets, self._bucket_values = {}, {}
        bucket_of = self.resource.bucket
        if bucket_of is not None:
            for key, value in items.items():
                self._buckets.setdefault(bucket_of(value), {})[key] = value

    def _get(self, query: list[tuple[str, Any]], read_timeout: float = 60.0) -> Any:
        """A GET of the collection, answered as the raw urllib3 response (nothing decoded by the client)."""
        try:
            response = raw.send(self._api, "GET", self.resource.path, query=query, read_timeout=read_timeout)
        except client.ApiException as exc:
            if exc.status == 410:
                raise Gone(str(exc.reason)) from exc
            raise
        if response.status == 410:
            raise Gone(response.data.decode(errors="replace")[:300])
        if response.status >= 300:
            raise client.ApiException(status=response.status, reason=f"{response.reason}: "
                                      f"{response.data.decode(errors='replace')[:300]}")
        return response


def _version_number(version: str) -> Optional[int]:
    try:
        return int(version)
    except ValueError:
        return None


def _lines(response: Any) -> Iterator[bytes]:
    """The newline-delimited JSON events of a watch response, as they arrive."""
    pending = b""
    for chunk in response.stream(amt=None, decode_content=False):
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if line.strip():
                yield line
    if pending.strip():
        yield pending


# --- the collections DDS reads ---

def pods() -> Resource[decode.PodRecord]:
    return Resource("pods", "/api/v1/pods", decode.pod_record, bucket=pod_bucket,
                    unreadable=decode.unreadable_pod_record)


def pod_bucket(record: decode.PodRecord) -> str:
    """Pods are kept by node: "" holds the pods not bound yet."""
    return record.info.node_name or ""


def nodes() -> Resource[decode.NodeRecord]:
    return Resource("nodes", "/api/v1/nodes", decode.node_record)


DRA_API = "/apis/resource.k8s.io/v1"


def dra_resources() -> dict[str, Resource[Any]]:
    """Dynamic Resource Allocation objects the planner reads (dds/planner/dra.py), by collection name."""
    return {"resourceclaims": Resource("resourceclaims", f"{DRA_API}/resourceclaims", decode.resource_claim),
            "resourceclaimtemplates": Resource("resourceclaimtemplates", f"{DRA_API}/resourceclaimtemplates",
                                               decode.resource_claim_template),
            "resourceslices": Resource("resourceslices", f"{DRA_API}/resourceslices", decode.resource_slice),
            "deviceclasses": Resource("deviceclasses", f"{DRA_API}/deviceclasses", decode.device_class)}


def custom_objects(group: str, version: str, plural: str, namespaces: Sequence[str] = ()) -> list[Resource[Obj]]:
    """One Resource per namespace (all namespaces when none are given), kept as lean dicts."""
    if not namespaces:
        return [Resource(plural, f"/apis/{group}/{version}/{plural}", decode.lean_object)]
    return [Resource(f"{plural} in {ns}", f"/apis/{group}/{version}/namespaces/{ns}/{plural}", decode.lean_object,
                     namespace=ns) for ns in namespaces]


class Collection(Generic[T]):
    """Several reflectors read as one (a custom resource watched in a few namespaces)."""

    def __init__(self, reflectors: Sequence[Reflector[T]]) -> None:
        self.reflectors = tuple(reflectors)

    @property
    def synced(self) -> bool:
        return all(r.synced for r in self.reflectors)

    def values(self) -> tuple[T, ...]:
        if len(self.reflectors) == 1:
            return self.reflectors[0].values()
        return tuple(v for r in self.reflectors for v in r.values())

    def buckets(self) -> dict[str, tuple[T, ...]]:
        """`Reflector.buckets` of the one reflector; of several, merged (then rebuilt on every call)."""
        if len(self.reflectors) == 1:
            return self.reflectors[0].buckets()
        merged: dict[str, list[T]] = {}
        for reflector in self.reflectors:
            for name, items in reflector.buckets().items():
                merged.setdefault(name, []).extend(items)
        return {name: tuple(items) for name, items in merged.items()}

    def keys(self) -> frozenset[str]:
        return frozenset(k for r in self.reflectors for k in r.keys())

    @property
    def generation(self) -> tuple[int, ...]:
        return tuple(r.generation for r in self.reflectors)

    def assume(self, obj: Obj) -> None:
        """`Reflector.assume` on the reflector whose collection holds the object."""
        namespace = (obj.get("metadata") or {}).get("namespace")
        for reflector in self.reflectors:
            if reflector.resource.namespace in (None, namespace):
                reflector.assume(obj)


@dataclass
class ClusterCache:
    """Pods, Nodes, and (when Cluster API is served) Machines and MachineSets, each fed by its own watch."""

    pods: Collection[decode.PodRecord]
    nodes: Collection[decode.NodeRecord]
    machines: Optional[Collection[Obj]] = None  # None: Cluster API not served when the cache started
    machinesets: Optional[Collection[Obj]] = None
    machinedeployments: Optional[Collection[Obj]] = None  # None also where only MachineSets are served
    # resource.k8s.io/v1 collections by name (dra_resources), present when the apiserver serves that API.
    dra: Optional[dict[str, Collection[Any]]] = None
    # The CDI operator's ComposabilityRequests and ComposableResources by plural, when that fabric backend is in use.
    composability: Optional[dict[str, Collection[Obj]]] = None
    # Gang objects (dds/kube/podgroups.py: Workloads, PodGroups) by kind, for the kinds served when the cache started.
    gangs: Optional[dict[Any, Collection[Obj]]] = None
    # ProvisioningRequests (every namespace), when their API is served at start and DDS serves a class of them.
    provisioning: Optional[Collection[Obj]] = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    @classmethod
    def for_cluster(cls, api: client.ApiClient, *, capi_version: Optional[str], machineset_namespaces: Sequence[str] = (),
                    deployments: bool = False, dra: bool = False, composability: Sequence[tuple[str, str, str]] = (),
                    gangs: Sequence[Any] = (), provisioning: bool = False, **options: Any) -> "ClusterCache":
        """`composability`: (group, version, plural) of cluster-scoped fabric objects to watch."""
        """`capi_version`: the served cluster.x-k8s.io version, or None when Cluster API is not installed."""
        from dds.kube.machinesets import CAPI_GROUP

        def collection(resources: Sequence[Resource[Any]]) -> Collection[Any]:
            return Collection([Reflector(api, r, **options) for r in resources])

        machines = machinesets = machinedeployments = None
        if capi_version is not None:
            machines = collection(custom_objects(CAPI_GROUP, capi_version, "machines", machineset_namespaces))
            machinesets = collection(custom_objects(CAPI_GROUP, capi_version, "machinesets", machineset_namespaces))
            if deployments:
                machinedeployments = collection(custom_objects(CAPI_GROUP, capi_version, "machinedeployments",
                                                               machineset_namespaces))
        dra_collections = {name: collection([r]) for name, r in dra_resources().items()} if dra else None
        fabric = {plural: collection(custom_objects(group, version, plural))
                  for group, version, plural in composability} or None
        # `gangs`: podgroups.GangApi, watched in every namespace, named in full (two kinds are "podgroups").
        gang_collections = {kind: collection([Resource(kind.name, f"/apis/{kind.group}/{kind.version}/{kind.plural}",
                                                       decode.lean_object)]) for kind in gangs} or None
        requests = None
        if provisioning:
            from dds.model.provisioning import API_GROUP, API_VERSION, PLURAL
            requests = collection(custom_objects(API_GROUP, API_VERSION, PLURAL))
        return cls(pods=collection([pods()]), nodes=collection([nodes()]), machines=machines, machinesets=machinesets,
                   machinedeployments=machinedeployments, dra=dra_collections, composability=fabric, gangs=gang_collections,
                   provisioning=requests)

    def assume(self, obj: Mapping[str, Any]) -> None:
        """A Machine or MachineSet a write of DDS's answered, read back at once (`Reflector.assume`)."""
        collection = {"Machine": self.machines, "MachineSet": self.machinesets,
                      "MachineDeployment": self.machinedeployments}.get(str(obj.get("kind")))
        if collection is not None:
            collection.assume(dict(obj))

    def collections(self) -> tuple[Collection[Any], ...]:
        extra = tuple(self.dra.values()) if self.dra else ()
        extra += tuple(self.composability.values()) if self.composability else ()
        extra += tuple(self.gangs.values()) if self.gangs else ()
        extra += (self.provisioning,) if self.provisioning is not None else ()
        capi_collections = (self.machines, self.machinesets, self.machinedeployments)
        return tuple(c for c in (self.pods, self.nodes, *capi_collections) if c is not None) + extra

    def reflectors(self) -> tuple[Reflector[Any], ...]:
        return tuple(r for c in self.collections() for r in c.reflectors)

    @property
    def synced(self) -> bool:
        return all(c.synced for c in self.collections())

    def start(self) -> None:
        """One daemon thread per reflector. Idempotent."""
        if self._threads:
            return
        for reflector in self.reflectors():
            thread = threading.Thread(target=reflector.run, args=(self._stop,), daemon=True,
                                      name=f"dds-cache-{reflector.resource.name}")
            thread.start()
            self._threads.append(thread)

    def list_once(self) -> None:
        """Fill every store with one LIST in this thread, without watching (a one-shot reader: `dds plan`)."""
        for reflector in self.reflectors():
            reflector.relist()

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for reflector in self.reflectors():
            if not reflector.wait_synced(max(0.0, deadline - time.monotonic())):
                return False
        return True

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        for reflector in self.reflectors():
            reflector.close_stream()
        for thread in self._threads:
            thread.join(timeout)


def cluster_cache(api: client.ApiClient, machineset_namespaces: Sequence[str] = (),
                  composability: Sequence[tuple[str, str, str]] = (), provisioning: bool = False,
                  **options: Any) -> ClusterCache:
    """A ClusterCache for this cluster, Machines and MachineSets included when Cluster API is served now;
    `provisioning`: ProvisioningRequests watched too (when DDS serves a class of them and their API is served now)."""
    from dds.kube.capi import MACHINEDEPLOYMENTS, CapiNotInstalled, CapiObjects

    deployments = False
    try:
        namespace = machineset_namespaces[0] if machineset_namespaces else None
        version: Optional[str] = CapiObjects(api).version(namespace)
        deployments = CapiObjects(api).serves(MACHINEDEPLOYMENTS, version, namespace)
    except CapiNotInstalled:
        version = None  # the observer lists (and finds nothing) should Cluster API be installed later
    except Exception as exc:  # the apiserver is unreachable right now: pods and nodes are still watched
        log.warning("cannot tell which Cluster API version is served (%s): Machines and MachineSets are listed per "
                    "decision instead of watched", exc)
        version = None
    from dds.kube.podgroups import served_gang_apis

    return ClusterCache.for_cluster(api, capi_version=version, machineset_namespaces=machineset_namespaces,
                                    deployments=deployments, dra=dra_served(api), composability=composability, gangs=served_gang_apis(api),
                                    provisioning=provisioning and provisioning_served(api), **options)


def provisioning_served(api: client.ApiClient) -> bool:
    """Whether the apiserver serves autoscaling.x-k8s.io/v1 (the ProvisioningRequest CRD): only then are they watched;
    otherwise the reader lists them per pass (and finds none while the API is not served)."""
    from dds.model.provisioning import API_GROUP, API_VERSION

    return group_version_served(api, API_GROUP, API_VERSION, "ProvisioningRequests are listed per pass")


def dra_served(api: client.ApiClient) -> bool:
    """Whether the apiserver serves resource.k8s.io/v1 (GA since 1.34): only then are its collections watched."""
    return group_version_served(api, "resource.k8s.io", "v1", "DRA objects are listed per decision")


def group_version_served(api: client.ApiClient, group: str, version: str, otherwise: str) -> bool:
    """Whether the apiserver serves `group`/`version` now (one discovery GET). Unreachable: False, with a warning that
    says what happens instead (`otherwise`)."""
    try:
        groups = client.ApisApi(api).get_api_versions().groups or ()
    except Exception as exc:
        log.warning("cannot tell whether %s/%s is served (%s): %s", group, version, exc, otherwise)
        return False
    return any(g.name == group and any(v.version == version for v in g.versions or ()) for g in groups)


class CachedMachineSetLister:
    """MachineSetLister's interface over the cache: the node-group catalog's refresh (every loop pass and every CA
    Refresh) reads the watched MachineSets instead of listing them; until the cache is synced it lists."""

    def __init__(self, cache: ClusterCache, fallback: Any) -> None:
        self._cache = cache
        self._fallback = fallback

    def list(self) -> list[Any]:
        from dds.kube.machinesets import machineset_from_object

        cached, deployments = self._cache.machinesets, self._cache.machinedeployments
        if cached is None or not cached.synced or (deployments is not None and not deployments.synced):
            return self._fallback.list()
        items = (*cached.values(), *(dict(d, kind="MachineDeployment") for d in
                                     (deployments.values() if deployments is not None else ())))
        return [machineset_from_object(item) for item in items]
