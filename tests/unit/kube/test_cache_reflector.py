"""The reflector's rules, on a scripted apiserver: LIST in pages, WATCH from the list's resourceVersion with bookmarks,
apply events by key, relist on 410 Gone and after a lost connection (the store then holds the LIST, nothing older)."""

from __future__ import annotations

import threading
from typing import Any, Iterator, Optional

import orjson
import pytest

from dds.kube import decode
from dds.kube.cache import Gone, Reflector, Resource, WatchError
from dds.kube.cache import pods as pods_resource
from dds.kube.requests import verb_of


def pod(name: str, rv: str, node: Optional[str] = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}, "spec": spec}


def page(items: list[dict[str, Any]], rv: str, cont: str = "") -> dict[str, Any]:
    return {"kind": "PodList", "metadata": {"resourceVersion": rv, "continue": cont}, "items": items}


def event(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": obj}


class Response:
    def __init__(self, body: Any = None, events: Optional[list[Any]] = None, status: int = 200) -> None:
        self.status, self.reason = status, "OK" if status == 200 else "Error"
        self.data = orjson.dumps(body) if body is not None else b""
        self._events = events or []

    def stream(self, amt: Any = None, decode_content: bool = False) -> Iterator[bytes]:
        for item in self._events:
            if isinstance(item, BaseException):
                raise item
            text = orjson.dumps(item) + b"\n"
            yield text[:7]  # events split across chunks, as a network delivers them
            yield text[7:]

    def release_conn(self) -> None:
        pass


class ScriptedApi:
    """Answers each GET with the next scripted response; sets `done` once the script is used up."""

    def __init__(self, script: list[Any]) -> None:
        self.script = list(script)
        self.requests: list[dict[str, Any]] = []
        self.done = threading.Event()

    def call_api(self, path: str, method: str, query_params: list[tuple[str, Any]], **_: Any) -> Any:
        self.requests.append(dict(query_params))
        if not self.script:
            self.done.set()
            raise ConnectionError("script over")
        answer = self.script.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


def reflector(api: ScriptedApi) -> Reflector[decode.PodRecord]:
    return Reflector(api, Resource("pods", "/api/v1/pods", decode.pod_record), page_size=2)  # type: ignore[arg-type]


def run_script(api: ScriptedApi, r: Reflector[Any]) -> None:
    stop = threading.Event()
    thread = threading.Thread(target=r.run, args=(stop,), daemon=True)
    thread.start()
    assert api.done.wait(10), "the reflector stopped before the script ended"
    stop.set()
    thread.join(10)


def test_a_list_in_pages_fills_the_store_at_the_lists_resource_version() -> None:
    api = ScriptedApi([Response(page([pod("a", "1"), pod("b", "2")], "5", cont="next")),
                       Response(page([pod("c", "3")], "5"))])
    r = reflector(api)
    r.relist()
    assert r.keys() == {"ns/a", "ns/b", "ns/c"} and r.resource_version == "5" and r.synced
    assert api.requests == [{"limit": 2}, {"limit": 2, "continue": "next"}]


def test_events_change_one_key_and_bookmarks_only_the_resource_version() -> None:
    r = reflector(ScriptedApi([Response(page([pod("a", "1")], "1"))]))
    r.relist()
    before = r.generation
    r.apply(event("ADDED", pod("b", "2")))
    r.apply(event("MODIFIED", pod("a", "3", node="worker-1")))
    r.apply(event("DELETED", pod("b", "4")))
    assert r.keys() == {"ns/a"} and r.get("ns/a").info.node_name == "worker-1"
    assert r.resource_version == "4" and r.generation == before + 3
    values = r.values()
    r.apply(event("BOOKMARK", {"metadata": {"resourceVersion": "9"}}))
    assert r.resource_version == "9" and r.values() is values  # nothing changed: the same tuple is served


@pytest.mark.parametrize("status, error", [(410, Gone), (500, WatchError)])
def test_an_error_event_stops_the_watch(status: int, error: type) -> None:
    r = reflector(ScriptedApi([]))
    with pytest.raises(error):
        r.apply(event("ERROR", {"kind": "Status", "code": status, "reason": "Expired", "message": "too old"}))


def test_the_watch_starts_at_the_lists_resource_version_with_bookmarks() -> None:
    api = ScriptedApi([Response(page([pod("a", "1")], "10")), Response(events=[event("ADDED", pod("b", "11"))])])
    r = reflector(api)
    run_script(api, r)
    watch = api.requests[1]
    assert watch["watch"] == "true" and watch["allowWatchBookmarks"] == "true" and watch["resourceVersion"] == "10"
    assert r.keys() >= {"ns/a", "ns/b"}


def test_a_clean_end_of_the_watch_renews_it_from_the_last_resource_version() -> None:
    api = ScriptedApi([Response(page([pod("a", "1")], "10")),
                       Response(events=[event("BOOKMARK", {"metadata": {"resourceVersion": "20"}})]),
                       Response(events=[])])
    run_script(api, reflector(api))
    assert [q.get("resourceVersion") for q in api.requests[1:3]] == ["10", "20"]
    assert sum(1 for q in api.requests if "watch" not in q) == 1  # a single LIST


def test_410_gone_relists_and_the_store_forgets_what_was_deleted_meanwhile() -> None:
    gone = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version"}
    api = ScriptedApi([Response(page([pod("a", "1"), pod("b", "2")], "10")),
                       Response(events=[event("ERROR", gone)]),
                       Response(page([pod("b", "2"), pod("c", "30")], "31"))])  # a deleted, c added while away
    r = reflector(api)
    run_script(api, r)
    assert r.keys() == {"ns/b", "ns/c"} and r.stats.relists_after_gone == 1 and r.stats.lists == 2


def test_a_410_answer_to_the_watch_request_relists_too() -> None:
    api = ScriptedApi([Response(page([pod("a", "1")], "10")),
                       Response({"kind": "Status", "code": 410, "reason": "Expired"}, status=410),
                       Response(page([pod("b", "2")], "12"))])
    r = reflector(api)
    run_script(api, r)
    assert r.keys() == {"ns/b"} and r.stats.relists_after_gone == 1


def test_a_lost_connection_relists_instead_of_watching_from_the_old_version() -> None:
    api = ScriptedApi([Response(page([pod("a", "1")], "10")),
                       Response(events=[event("ADDED", pod("b", "11")), ConnectionResetError("apiserver restarted")]),
                       ConnectionRefusedError("apiserver down"),
                       Response(page([pod("c", "40")], "41"))])
    r = reflector(api)
    run_script(api, r)
    assert r.keys() == {"ns/c"} and r.stats.relists_after_error >= 2
    # LIST, WATCH (broken), LIST (refused: retried after a backoff), LIST: never a watch from the old version
    assert ["watch" in q for q in api.requests[:4]] == [False, True, False, False]


@pytest.mark.parametrize("method, url, query, verb", [
    ("GET", "https://h/api/v1/pods", [("limit", 500)], "LIST"),
    ("GET", "https://h/api/v1/pods", [("watch", "true")], "WATCH"),
    ("GET", "https://h/api/v1/namespaces/ns/pods", [], "LIST"),
    ("GET", "https://h/api/v1/namespaces/ns/pods/p", [], "GET"),
    ("GET", "https://h/api/v1/namespaces/ns", [], "GET"),
    ("GET", "https://h/api/v1/nodes/worker-1", [], "GET"),
    ("GET", "https://h/api/v1/pods?fieldSelector=spec.nodeName%3Dw", None, "LIST"),
    ("GET", "https://h/apis/cluster.x-k8s.io/v1beta2/machines", [], "LIST"),
    ("GET", "https://h/apis/cluster.x-k8s.io/v1beta2/namespaces/ns/machines/m", [], "GET"),
    ("GET", "https://h/apis/cluster.x-k8s.io/v1beta2", [], "GET"),
    ("PATCH", "https://h/api/v1/nodes/worker-1/status", [], "PATCH"),
    ("PUT", "https://h/api/v1/namespaces/ns/configmaps/c", [], "UPDATE"),
])
def test_requests_are_counted_by_the_apiservers_verb(method: str, url: str, query: Any, verb: str) -> None:
    assert verb_of(method, url, query) == verb


def test_dds_own_write_is_read_back_before_its_watch_event_and_older_events_do_not_undo_it() -> None:
    r = reflector(ScriptedApi([Response(page([pod("a", "1")], "1"))]))
    r.relist()
    r.assume(pod("a", "7", node="worker-1"))  # what the apiserver answered to DDS's write
    assert r.get("ns/a").info.node_name == "worker-1"

    r.apply(event("MODIFIED", pod("a", "5")))  # a change from before the write, still on its way
    assert r.get("ns/a").info.node_name == "worker-1" and r.resource_version == "5"

    r.apply(event("MODIFIED", pod("a", "8", node="worker-2")))  # the watch caught up: it is the truth again
    assert r.get("ns/a").info.node_name == "worker-2"
    r.apply(event("MODIFIED", pod("a", "9")))
    assert r.get("ns/a").info.node_name is None


def test_a_write_the_watch_has_already_shown_is_not_assumed_back_over_newer_state() -> None:
    r = reflector(ScriptedApi([Response(page([pod("a", "6", node="worker-2")], "6"))]))
    r.relist()
    r.assume(pod("a", "4", node="worker-1"))
    assert r.get("ns/a").info.node_name == "worker-2"


def bucketed(api: ScriptedApi) -> Reflector[decode.PodRecord]:
    return Reflector(api, pods_resource(), page_size=2)  # type: ignore[arg-type]


def keys_by_bucket(r: Reflector[decode.PodRecord]) -> dict[str, set[str]]:
    return {name: {p.key for p in items} for name, items in r.buckets().items()}


def test_pods_are_kept_by_node_and_a_nodes_tuple_is_the_same_object_until_its_pods_change() -> None:
    r = bucketed(ScriptedApi([Response(page([pod("a", "1", node="w1"), pod("b", "2", node="w2"), pod("c", "3")],
                                            "3"))]))
    r.relist()
    assert keys_by_bucket(r) == {"w1": {"ns/a"}, "w2": {"ns/b"}, "": {"ns/c"}}
    before = r.buckets()
    r.apply(event("MODIFIED", pod("c", "4", node="w1")))  # bound: it leaves the pending bucket
    r.apply(event("DELETED", pod("b", "5", node="w2")))  # w2's last pod: its bucket goes
    after = r.buckets()
    assert keys_by_bucket(r) == {"w1": {"ns/a", "ns/c"}}
    assert after["w1"] is not before["w1"]
    r.apply(event("ADDED", pod("d", "6", node="w3")))
    assert r.buckets()["w1"] is after["w1"]  # w1's pods did not change: the same tuple is served


def test_a_relist_rebuilds_the_buckets_from_the_list_alone() -> None:
    r = bucketed(ScriptedApi([Response(page([pod("a", "1", node="w1")], "1")),
                              Response(page([pod("b", "2", node="w2")], "2"))]))
    r.relist()
    r.relist()
    assert keys_by_bucket(r) == {"w2": {"ns/b"}}


# --- an object DDS cannot read is that object's problem (issue 37) --------------------------------------------------

def hostile_pod(name: str, rv: str) -> dict[str, Any]:
    broken = pod(name, rv)
    broken["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "1e999"  # no Kubernetes quantity
    return broken


def test_a_pod_that_cannot_be_read_is_refused_with_the_error_and_the_rest_is_listed_and_watched() -> None:
    r = Reflector(ScriptedApi([Response(page([hostile_pod("bad", "1"), pod("a", "2")], "5"))]), pods_resource())
    r.relist()
    assert r.synced and r.keys() == {"ns/a", "ns/bad"}
    bad = r.get("ns/bad").info
    assert bad.dra_refusal_reason == "CannotReadObject" and "quantity too large" in bad.dra_refusal
    assert bad.unsupported == (bad.dra_refusal,)  # never promised a fit
    r.apply(event("ADDED", hostile_pod("bad-2", "6")))
    r.apply(event("ADDED", pod("b", "7")))
    assert r.keys() == {"ns/a", "ns/b", "ns/bad", "ns/bad-2"} and r.resource_version == "7"


def test_an_object_without_a_stand_in_is_left_out_and_a_watch_keeps_what_it_had_of_it() -> None:
    def strict(obj: dict[str, Any]) -> decode.PodRecord:
        if "broken" in (obj["metadata"].get("labels") or {}):
            raise ValueError("unreadable")
        return decode.pod_record(obj)

    def broken(name: str, rv: str) -> dict[str, Any]:
        obj = pod(name, rv)
        obj["metadata"]["labels"] = {"broken": "yes"}
        return obj

    r = Reflector(ScriptedApi([Response(page([broken("bad", "1"), pod("a", "2")], "5"))]),
                  Resource("pods", "/api/v1/pods", strict))
    r.relist()
    assert r.synced and r.keys() == {"ns/a"}
    r.apply(event("MODIFIED", pod("a", "6", node="worker-1")))
    a = r.get("ns/a")
    r.apply(event("MODIFIED", broken("a", "7")))
    assert r.get("ns/a") is a and r.resource_version == "7"


def test_a_pod_asking_for_more_than_the_planner_can_count_in_all_is_refused() -> None:
    # Each quantity is a valid one (2^63-1); two containers' sum is more than a signed 64-bit count holds.
    greedy = pod("greedy", "1")
    greedy["spec"]["containers"] = [{"name": n, "resources": {"requests": {"nvidia.com/gpu": str(2**63 - 1)}}}
                                    for n in ("a", "b")]
    r = Reflector(ScriptedApi([Response(page([greedy, pod("a", "2")], "5"))]), pods_resource())
    r.relist()
    refused = r.get("ns/greedy").info
    assert refused.dra_refusal_reason == "CannotReadObject"
    assert "asks for more nvidia.com/gpu in all than 9223372036854775807" in refused.dra_refusal
    assert r.get("ns/a").info.dra_refusal is None
