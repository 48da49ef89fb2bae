"""Who may have node groups and what a MachineSet may ask for (dds/groups/access.py), and unknown keys refused with a
hint (dds/groups/schema.py): each refusal is an InvalidNodeGroup Event naming the key and the setting that would
allow it, counted by reason, and the group is not served; the groups that ask for nothing more are."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dds import metrics
from dds.config import NamespaceGrant, Settings
from dds.groups import access
from dds.groups.catalog import NodeGroupCatalog
from dds.groups.schema import UNKNOWN_KEY, GroupInput, parse_group, unknown_key_message
from dds.groups.sources import FileSource, MachineSetSource
from dds.kube.machinesets import MachineSetObject
from dds.model import groups as g
from dds.model.groups import SourceRef

from .conftest import RecordingEvents, annotations

TEAM_A, TEAM_B = "team-a", "team-b"
GRANTS = {TEAM_A: NamespaceGrant(pools=["pool-a"]),
          TEAM_B: NamespaceGrant(pools=["pool-b"], force_detach=True, min_idle_cooldown_seconds=0)}


class _Lister:
    def __init__(self, machinesets: list[MachineSetObject]) -> None:
        self.machinesets = machinesets

    def list(self) -> list[MachineSetObject]:
        return self.machinesets


def machineset(namespace: str, name: str, **overrides: str) -> MachineSetObject:
    values = annotations({g.ANN_FABRIC_POOL: "pool-a" if namespace == TEAM_A else "pool-b", **overrides})
    return MachineSetObject(namespace=namespace, name=name, api_version="cluster.x-k8s.io/v1beta2",
                            uid=f"uid-{namespace}-{name}", annotations={**values, g.ANN_ENABLED: "true"}, replicas=1)


def served_and_events(*machinesets: MachineSetObject, grants=GRANTS):
    events = RecordingEvents()
    catalog = NodeGroupCatalog(source=MachineSetSource(_Lister(list(machinesets)), grants), events=events)
    assert catalog.refresh()
    return {spec.id for spec in catalog.groups()}, events.events


# --- refusals, one per knob ---

@pytest.mark.parametrize("namespace, overrides, reason, key, fragments", [
    pytest.param("tenant", {}, access.NAMESPACE_NOT_ALLOWED, g.ANN_ENABLED,
                 ("namespace tenant may not have node groups", "node_group_namespaces lists: team-a, team-b"),
                 id="namespace-not-listed"),
    pytest.param(TEAM_A, {g.ANN_FABRIC_POOL: "pool-b"}, access.POOL_NOT_ALLOWED, g.ANN_FABRIC_POOL,
                 ("pool pool-b is not one namespace team-a may draw from", "node_group_namespaces.team-a.pools: pool-a"),
                 id="another-teams-pool"),
    pytest.param(TEAM_A, {g.ANN_FABRIC_POOL: ""}, access.POOL_NOT_ALLOWED, g.ANN_FABRIC_POOL,
                 ("pool default is not one namespace team-a may draw from",), id="the-default-pool-unless-granted"),
    pytest.param(TEAM_A, {g.ANN_FORCE_DETACH: "true"}, access.FORCE_DETACH_NOT_ALLOWED, g.ANN_FORCE_DETACH,
                 ("node_group_namespaces.team-a.force_detach: true",), id="force-detach"),
    pytest.param(TEAM_A, {g.ANN_GPU_IDLE_COOLDOWN: "0"}, access.COOLDOWN_BELOW_FLOOR, g.ANN_GPU_IDLE_COOLDOWN,
                 ("0s is shorter than the 60s namespace team-a may set",
                  "node_group_namespaces.team-a.min_idle_cooldown_seconds"), id="gpu-cooldown-zero"),
    pytest.param(TEAM_A, {g.ANN_NODE_IDLE_COOLDOWN: "59s"}, access.COOLDOWN_BELOW_FLOOR, g.ANN_NODE_IDLE_COOLDOWN,
                 ("59s is shorter than the 60s",), id="node-cooldown-below-floor"),
    pytest.param(TEAM_A, {"dds.cdi.dev/max-gpu-per-node": "4"}, UNKNOWN_KEY, "dds.cdi.dev/max-gpu-per-node",
                 ("unknown key", "did you mean dds.cdi.dev/max-gpus-per-node?"), id="typo-max-gpus"),
    pytest.param(TEAM_A, {"dds.cdi.dev/gpu-idle-cooldwn": "20m"}, UNKNOWN_KEY, "dds.cdi.dev/gpu-idle-cooldwn",
                 ("did you mean dds.cdi.dev/gpu-idle-cooldown?",), id="typo-cooldown"),
    pytest.param(TEAM_A, {"dds.cdi.dev/template_mode": "observed"}, UNKNOWN_KEY, "dds.cdi.dev/template_mode",
                 ("did you mean dds.cdi.dev/template-mode?",), id="typo-underscore"),
    pytest.param(TEAM_A, {"dds.cdi.dev/colour": "blue"}, UNKNOWN_KEY, "dds.cdi.dev/colour",
                 ("docs/configuration.md lists the keys DDS reads",), id="unknown-without-a-near-key"),
    pytest.param(TEAM_A, {g.ANN_OPTIONS_PREFIX + "scaledownunneededtme": "5m"}, UNKNOWN_KEY,
                 g.ANN_OPTIONS_PREFIX + "scaledownunneededtme",
                 (f"did you mean {g.ANN_OPTIONS_PREFIX}scaledownunneededtime?",), id="typo-autoscaling-option"),
])
def test_a_machineset_asking_for_more_is_refused_with_the_reason_and_not_served(namespace, overrides, reason, key,
                                                                                fragments):
    before = metrics.NODE_GROUP_CONFIG_ERRORS.labels("machineset", reason)._value.get()
    refused = machineset(namespace, "steer", **overrides)
    good = machineset(TEAM_B, "gpu")

    served, events = served_and_events(refused, good)

    assert served == {"MachineSet/team-b/gpu"}, "the refused group is not served, the other one is"
    assert len(events) == 1, events
    involved, event_type, event_reason, message = events[0]
    assert (involved.kind, involved.namespace, involved.name) == ("MachineSet", namespace, "steer")
    assert (event_type, event_reason) == ("Warning", "InvalidNodeGroup")
    assert message.startswith(f"{key}: ")
    for fragment in fragments:
        assert fragment in message, message
    assert metrics.NODE_GROUP_CONFIG_ERRORS.labels("machineset", reason)._value.get() == before + 1


@pytest.mark.parametrize("overrides", [
    pytest.param({g.ANN_FORCE_DETACH: "true"}, id="force-detach-granted"),
    pytest.param({g.ANN_GPU_IDLE_COOLDOWN: "0", g.ANN_NODE_IDLE_COOLDOWN: "0s"}, id="cooldown-zero-granted"),
    pytest.param({g.ANN_SCALE_REQUESTS: "[]", g.ANN_OPTIONS_PREFIX + "maxnodestartuptime": "10m"},
                 id="keys-dds-writes-or-ignores"),
])
def test_what_the_grant_allows_is_served(overrides):
    served, events = served_and_events(machineset(TEAM_B, "gpu", **overrides))
    assert served == {"MachineSet/team-b/gpu"} and events == []


def test_a_wildcard_grant_allows_every_pool():
    grants = {TEAM_A: NamespaceGrant(pools=["*"])}
    served, events = served_and_events(machineset(TEAM_A, "gpu", **{g.ANN_FABRIC_POOL: "anything"}), grants=grants)
    assert served == {"MachineSet/team-a/gpu"} and events == []


def test_with_no_grant_no_machineset_is_served_and_each_is_told_why():
    served, events = served_and_events(machineset(TEAM_A, "gpu"), machineset(TEAM_B, "gpu"), grants={})
    assert served == set()
    assert sorted(e[0].namespace for e in events) == [TEAM_A, TEAM_B]
    assert all("node_group_namespaces lists: none" in e[3] for e in events)


def test_every_refusal_of_one_machineset_is_reported():
    _, events = served_and_events(machineset(TEAM_A, "gpu", **{g.ANN_FABRIC_POOL: "pool-b", g.ANN_FORCE_DETACH: "true",
                                                               g.ANN_GPU_IDLE_COOLDOWN: "1s"}))
    assert sorted(e[3].split(":")[0] for e in events) == sorted(
        [g.ANN_FABRIC_POOL, g.ANN_FORCE_DETACH, g.ANN_GPU_IDLE_COOLDOWN])


# --- the file source: the administrator's own, unknown keys refused all the same ---

def test_a_file_group_is_not_limited_by_the_grants_but_its_typos_are_refused(tmp_path):
    path = tmp_path / "groups.yaml"
    path.write_text(
        "nodeGroups:\n"
        "- id: fast\n  annotations:\n" + "".join(f"    {k}: '{v}'\n" for k, v in annotations(
            {g.ANN_FORCE_DETACH: "true", g.ANN_GPU_IDLE_COOLDOWN: "0"}).items()) +
        "- id: typo\n  annotations:\n" + "".join(f"    {k}: '{v}'\n" for k, v in annotations(
            {"dds.cdi.dev/max-gpu-per-node": "8"}).items()))
    read = FileSource(path).read()
    assert [spec.id for spec in read.groups] == ["fast"]
    (error,) = read.errors
    assert (error.group_id, error.key, error.reason) == ("typo", "dds.cdi.dev/max-gpu-per-node", UNKNOWN_KEY)
    assert "did you mean dds.cdi.dev/max-gpus-per-node?" in error.message


def test_a_typo_never_falls_back_to_the_boot_count():
    # Before: max-gpu-per-node was ignored and max GPUs became gpu-count (1), turning vertical scaling off.
    spec, errors = parse_group(GroupInput(id="g", annotations=annotations({"dds.cdi.dev/max-gpu-per-node": "8"}),
                                          source=SourceRef(kind="File", name="f")))
    assert spec is None and [e.reason for e in errors] == [UNKNOWN_KEY]


@pytest.mark.parametrize("key", ["capacity.cluster-autoscaler.kubernetes.io/anything", "example.com/dds.cdi.dev",
                                 "cluster.x-k8s.io/cluster-name", g.ANN_ENABLED])
def test_keys_dds_does_not_own_or_knows_are_not_refused(key):
    assert unknown_key_message(key) is None


# --- the settings ---

def test_grants_are_settings_with_checked_fields():
    settings = Settings(node_group_namespaces={"a": {"pools": ["x"], "force_detach": True}})
    grant = settings.node_group_namespaces["a"]
    assert (grant.pools, grant.force_detach, grant.min_idle_cooldown_seconds) == (["x"], True, 60.0)
    assert Settings().node_group_namespaces == {}, "secure by default: no namespace may have node groups"


@pytest.mark.parametrize("value, fragment", [
    pytest.param({"a": {}}, "pools", id="pools-required"),
    pytest.param({"a": {"pools": []}}, "pools", id="pools-empty"),
    pytest.param({"a": {"pools": ["x"], "force-detach": True}}, "force-detach", id="unknown-key"),
    pytest.param({"a": {"pools": ["x"], "min_idle_cooldown_seconds": -1}}, "min_idle_cooldown_seconds",
                 id="negative-floor"),
])
def test_a_malformed_grant_is_a_settings_error(value, fragment):
    with pytest.raises(ValidationError, match=fragment):
        Settings(node_group_namespaces=value)


def test_a_granted_namespace_that_is_never_read_is_a_settings_error():
    with pytest.raises(ValidationError, match="node_group_namespaces names b, which machineset_namespaces leaves"):
        Settings(machineset_namespaces=["a"], node_group_namespaces={"a": {"pools": ["x"]}, "b": {"pools": ["x"]}})
