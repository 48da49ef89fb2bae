"""Malformed group definitions (MachineSet annotations, the node-groups file) and malformed settings files.

Whatever the value of any annotation DDS or cluster-autoscaler reads, parsing never raises: the group is either
served with a template the apiserver would accept and CA can decode, or dropped with errors that name the annotation;
the other groups keep being served, and the bad one is reported through a log line and an Event.
"""

from __future__ import annotations

import re
from pathlib import Path

import grpc
import pytest
import yaml
from hypothesis import example, given, note
from hypothesis import strategies as st

from dds.commands.serve import UsageError, load_settings
from dds.config import NamespaceGrant, Settings
from dds.kube.machinesets import MachineSetObject
from dds.model import groups as g
from dds.model.groups import SourceRef
from dds.model.quantity import QuantityError, to_int, to_milli
from dds.groups import schema as s
from dds.provider.gen.externalgrpc import externalgrpc_pb2 as pb
from dds.groups.sources import FileSource, MachineSetSource
from dds.groups.schema import GroupInput, parse_group
from dds.groups.catalog import NodeGroupCatalog
from dds.provider.template import build_template_node
from tests.unit.provider.conftest import RecordingEvents, annotations, start_provider
from tests.unit.reliability import figures
from tests.unit.reliability.figures import FUZZ

pytestmark = figures.SOAK_MARKS

GOOD = "MachineSet/default/gpu-workers"
BAD = "MachineSet/default/broken"

# Every annotation a group definition is read from.
NUMBER_KEYS = [g.ANN_CAPI_MIN, g.ANN_CAPI_MAX, s.CAP_MAX_PODS, s.CAP_GPU_COUNT, g.ANN_MAX_GPUS]
QUANTITY_KEYS = [s.CAP_CPU, s.CAP_MEMORY, s.CAP_EPHEMERAL_DISK]
DURATION_KEYS = [g.ANN_GPU_IDLE_COOLDOWN, g.ANN_NODE_IDLE_COOLDOWN, s.OPT_SCALE_DOWN_UNNEEDED,
                 s.OPT_SCALE_DOWN_UNREADY, s.OPT_MAX_NODE_PROVISION]
FRACTION_KEYS = [s.OPT_SCALE_DOWN_UTILIZATION, s.OPT_SCALE_DOWN_GPU_UTILIZATION]
BOOL_KEYS = [g.ANN_FORCE_DETACH, s.OPT_ZERO_OR_MAX, s.OPT_IGNORE_DAEMONSETS]
TEXT_KEYS = [s.CAP_GPU_TYPE, g.ANN_GPU_RESOURCE, g.ANN_GPU_MODELS, g.ANN_FABRIC_POOL, g.ANN_TEMPLATE_MODE,
             s.CAP_LABELS, s.CAP_TAINTS]
ALL_KEYS = NUMBER_KEYS + QUANTITY_KEYS + DURATION_KEYS + FRACTION_KEYS + BOOL_KEYS + TEXT_KEYS
# A cross-field check reports the key the user most likely got wrong, not always the one that changed.
RELATED = {s.CAP_GPU_COUNT: {g.ANN_MAX_GPUS}, g.ANN_CAPI_MAX: {g.ANN_CAPI_MIN}}

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

# Values a person (or a broken controller) could write: garbage, negative, overflow, wrong units, odd spacing.
nasty_numbers = st.sampled_from([
    "-1", "-0", "0", "1.5", "1e3", "1e400", "1e999999", "1e999999999", "NaN", "nan", "inf", "-inf", "Infinity",
    "2147483647", "2147483648", "4294967296", "9223372036854775807", "9223372036854775808", "1" + "0" * 40,
    "9" * 5000, "0x10", "1_000", " 4 ", "4\n", "\t", "", "four", "٣", "4Gi", "16 cores", "64GB", "64gb", "1.5Gi",
    "-64Gi", "0.0001", "500m", "1e-999999999", "10 minutes", "10m", "1h30m", "-10m", "10d", "1y", "0s", "+5m",
    ".5h", "5.", "ms", "1ns", "true", "True", "TRUE", "yes", "1", "false", "spec-fixed", "observed", "SPEC-FIXED",
    "nvidia.com/gpu", "a=b", "a=b:NoSchedule", "=b", "a=", ",,,", "a=b,,c=d", "k=v:", ":NoSchedule",
    "A30,,H100", " A30 , H100 ", "A30 H100", "x" * 300, "a/b/c", "-a", "a_", "ü=ü", "nvidia.com/", "/gpu",
])
values = st.one_of(nasty_numbers, st.text(max_size=30), st.integers(-2**70, 2**70).map(str),
                   st.floats().map(repr), st.from_regex(r"-?[0-9]{1,25}(\.[0-9]{0,5})?(e-?[0-9]{1,7})?(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?",
                                                        fullmatch=True))


def parse(overrides: dict[str, str]):
    return parse_group(GroupInput(id=BAD, annotations=annotations(overrides), replicas=1,
                                  source=SourceRef(kind="MachineSet", name="broken", namespace="default")))


def assert_valid_for_kubernetes(spec) -> None:
    """What a served group implies: CA can read its sizes (int32) and its template is a Node the apiserver takes."""
    assert 0 <= spec.min_size <= spec.max_size <= INT32_MAX
    pb.NodeGroup(id=spec.id, minSize=spec.min_size, maxSize=spec.max_size)  # raises on int32 overflow
    node = build_template_node(spec, "nvidia.com/gpu.product")
    assert node.SerializeToString()
    for key, value in node.metadata.labels.items():
        assert _qualified_name(key), f"label key {key!r}"
        assert len(value) <= 63 and _NAME.match(value), f"label value {value!r} of {key}"
    for taint in node.spec.taints:
        assert _qualified_name(taint.key) and len(taint.value) <= 63 and _NAME.match(taint.value), taint
    for resource, quantity in node.status.allocatable.items():
        assert _qualified_name(resource), f"resource {resource!r}"
        assert 0 <= int(quantity.string.rstrip("m")) <= INT64_MAX, f"{resource} = {quantity.string}"


def _qualified_name(text: str) -> bool:
    prefix, _, name = text.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_NAME.match(name))


@FUZZ
@given(key=st.sampled_from(ALL_KEYS), value=values)
@example(key=s.CAP_CPU, value="1e999999999")  # decimal.Overflow escaped the parser
@example(key=s.CAP_MEMORY, value="1e999999")  # a million-digit int: ~30 s of CPU per refresh
@example(key=g.ANN_CAPI_MAX, value="3000000000")  # over int32: NodeGroups failed for every group
@example(key=g.ANN_GPU_MODELS, value="A30 PCIe")  # not a label value: an invalid template node
def test_any_single_annotation_value_is_served_or_named(key: str, value: str) -> None:
    figures.count("config", "annotation value")
    spec, errors = parse({key: value})
    note(f"{key}={value!r} -> {spec} {errors}")
    if spec is None:
        assert errors, "a dropped group must say why"
        assert {e.key for e in errors} <= {key} | RELATED.get(key, set()), errors
        assert all(e.message and e.group_id == BAD for e in errors)
    else:
        assert errors == ()
        assert_valid_for_kubernetes(spec)


@FUZZ
@given(text=values)
@example(text="1e999999999")  # decimal.Overflow, an ArithmeticError: escaped every caller's `except ValueError`
def test_a_quantity_parses_or_raises_quantity_error(text: str) -> None:
    """Every caller (annotations, snapshots, traces) catches QuantityError; nothing else may come out."""
    figures.count("config", "quantity")
    for convert in (to_int, to_milli):
        try:
            number = convert(text)
        except QuantityError:
            continue
        assert isinstance(number, int) and abs(number) < 10**45


@FUZZ
@given(overrides=st.dictionaries(st.sampled_from(ALL_KEYS), values, min_size=2, max_size=8))
def test_many_bad_annotations_at_once_are_all_reported(overrides: dict[str, str]) -> None:
    figures.count("config", "annotation set")
    spec, errors = parse(overrides)
    if spec is None:
        related = set(overrides) | set().union(*(RELATED.get(k, set()) for k in overrides))
        assert errors and {e.key for e in errors} <= related, errors
    else:
        assert_valid_for_kubernetes(spec)


@FUZZ
@given(broken=st.dictionaries(st.sampled_from(ALL_KEYS), values, min_size=1, max_size=4))
def test_a_bad_machineset_does_not_stop_the_good_ones(broken: dict[str, str]) -> None:
    """MachineSets as the lister returns them: the good group is always served; a bad one is reported once."""
    figures.count("config", "MachineSet list")
    good = _machineset("gpu-workers", annotations())
    bad = _machineset("broken", annotations(broken))
    events = RecordingEvents()
    catalog = NodeGroupCatalog(source=MachineSetSource(_Lister([good, bad]), GRANTS), events=events)
    assert catalog.refresh()
    served = {spec.id for spec in catalog.groups()}
    assert GOOD in served
    if BAD not in served:
        assert events.events and all(ref.name == "broken" and reason == "InvalidNodeGroup"
                                     for ref, _, reason, _ in events.events)
        assert all(any(key in message for key in broken) or "max-gpus-per-node" in message
                   or "min-size" in message for _, _, _, message in events.events), events.events
    reported = len(events.events)
    catalog.refresh()
    assert len(events.events) == reported, "the same problem is reported once, not every refresh"


def test_served_groups_answer_over_grpc_next_to_a_dropped_one() -> None:
    bad = _machineset("broken", annotations({g.ANN_CAPI_MAX: "3000000000", s.CAP_CPU: "1e999999999"}))
    events = RecordingEvents()
    catalog = NodeGroupCatalog(source=MachineSetSource(_Lister([_machineset("gpu-workers", annotations()), bad]),
                                                       GRANTS), events=events)
    catalog.refresh()
    provider = start_provider(list(catalog.groups()))
    try:
        groups = provider.stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5).nodeGroups
        assert [x.id for x in groups] == [GOOD]
        with pytest.raises(grpc.RpcError) as info:
            provider.stub.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id=BAD), timeout=5)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        provider.channel.close()
        provider.server.stop(grace_seconds=0)
    keys = {message.split(":")[0] for _, _, _, message in events.events}
    assert keys == {g.ANN_CAPI_MAX, s.CAP_CPU}


# Namespace default may ask for anything the annotations can say: these tests are about malformed values, and
# dds/groups/access.py's refusals have tests of their own (tests/unit/groups/test_access.py).
GRANTS = {"default": NamespaceGrant(pools=["*"], force_detach=True, min_idle_cooldown_seconds=0)}


class _Lister:
    """A MachineSetLister answer: what the apiserver returned."""

    def __init__(self, machinesets: list[MachineSetObject]) -> None:
        self._machinesets = machinesets

    def list(self) -> list[MachineSetObject]:
        return self._machinesets


def _machineset(name: str, values: dict[str, str]) -> MachineSetObject:
    return MachineSetObject(namespace="default", name=name, api_version="cluster.x-k8s.io/v1beta2", uid=f"uid-{name}",
                            annotations={**values, g.ANN_ENABLED: "true"}, replicas=1)


# --- the node-groups file ---

yaml_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40), st.floats(allow_nan=False),
                         st.text(max_size=20), values)
yaml_entries = st.one_of(
    st.fixed_dictionaries({"id": st.one_of(st.just(BAD), yaml_scalars),
                           "annotations": st.dictionaries(st.sampled_from(ALL_KEYS), yaml_scalars, max_size=5)},
                          optional={"replicas": yaml_scalars, "unknown": yaml_scalars}),
    yaml_scalars, st.lists(yaml_scalars, max_size=3))


@FUZZ
@given(extra=st.lists(yaml_entries, max_size=4))
def test_node_groups_file_with_broken_entries_keeps_the_good_group(tmp_path_factory, extra) -> None:
    figures.count("config", "node-groups file")
    path = tmp_path_factory.mktemp("groups") / "groups.yaml"
    good = {"id": GOOD, "replicas": 1, "annotations": annotations()}
    path.write_text(yaml.safe_dump({"nodeGroups": [good, *extra]}, allow_unicode=True))
    catalog = NodeGroupCatalog(source=FileSource(path), events=RecordingEvents())
    assert catalog.refresh(), catalog.last_error
    assert GOOD in {spec.id for spec in catalog.groups()}
    for spec in catalog.groups():
        assert_valid_for_kubernetes(spec)


@pytest.mark.parametrize("content, fragment", [
    pytest.param("nodeGroups: [", "not valid YAML", id="bad-yaml"),
    pytest.param("- a\n- b\n", "`nodeGroups` list", id="top-level-list"),
    pytest.param("nodeGroups: {a: 1}\n", "`nodeGroups` list", id="node-groups-not-a-list"),
    pytest.param("\x00\x01binary", "not valid YAML", id="binary"),
    pytest.param("a: &x [*x]\n", "`nodeGroups` list", id="recursive-alias"),
])
def test_unusable_node_groups_file_is_refused_with_the_reason(tmp_path: Path, content: str, fragment: str) -> None:
    path = tmp_path / "groups.yaml"
    path.write_text(content)
    catalog = NodeGroupCatalog(source=FileSource(path), events=RecordingEvents())
    assert not catalog.refresh()
    assert fragment in catalog.last_error and str(path) in catalog.last_error


# --- settings files (dds serve --config) ---

def _load(tmp_path: Path, content: str) -> str:
    """What `dds serve --config FILE` prints for this file (its UsageError), or "" when it loads."""
    path = tmp_path / "dds.yaml"
    path.write_text(content)
    import argparse

    args = argparse.Namespace(config=path, listen=None, node_groups_file=None, insecure=None, tls_cert=None,
                              tls_key=None, tls_ca=None, gpu_label=None, log_level=None)
    try:
        load_settings(args)
    except UsageError as exc:
        return str(exc)
    return ""


@pytest.mark.parametrize("content, fragments", [
    pytest.param("listen: [", ["cannot load settings", "dds.yaml"], id="bad-yaml"),
    pytest.param("- listen\n", ["top level must be a mapping"], id="not-a-mapping"),
    pytest.param("lissten: 127.0.0.1:1\n", ["lissten", "Extra inputs are not permitted"], id="unknown-key"),
    pytest.param("insecure: maybe\n", ["insecure", "bool"], id="wrong-type-bool"),
    pytest.param("loop_interval_seconds: -5\n", ["loop_interval_seconds", "greater than 0"], id="negative"),
    pytest.param("loop_interval_seconds: ten\n", ["loop_interval_seconds"], id="wrong-type-number"),
    pytest.param("policy: fastest\n", ["policy", "unknown policy 'fastest'"], id="bad-enum-validator"),
    pytest.param("fabric: quantum\n", ["fabric", "simulated"], id="bad-enum"),
    pytest.param("simulated_fabric: {faults: {attach_error: 2}}\n", ["simulated_fabric.faults.attach_error"],
                 id="nested-out-of-range"),
    pytest.param("redfish: {password_file: [1, 2]}\n", ["redfish.password_file"], id="nested-wrong-type"),
    pytest.param("simulated_fabric: {pools: [{name: p}]}\n", ["simulated_fabric.pools.0.devices", "required"],
                 id="nested-missing"),
    pytest.param("redfish: {pasword_file: /x}\n", ["redfish.pasword_file"], id="nested-unknown-key"),
    pytest.param("\x00", ["cannot load settings"], id="binary"),
    pytest.param("listen: !!python/object/apply:os.system ['true']\n", ["cannot load settings"], id="unsafe-tag"),
])
def test_malformed_settings_file_is_a_usage_error_naming_the_field(tmp_path: Path, content: str,
                                                                   fragments: list[str]) -> None:
    message = _load(tmp_path, content)
    assert message, "the file was accepted"
    for fragment in fragments:
        assert fragment in message, message


settings_values = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20),
                            st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=5), st.integers(),
                                                                                 max_size=2))


@FUZZ
@given(data=st.dictionaries(st.sampled_from(sorted(Settings.model_fields) + ["nope", "redfish.x"]), settings_values,
                            max_size=4))
def test_any_settings_file_loads_or_names_the_field(tmp_path_factory, data: dict) -> None:
    figures.count("config", "settings file")
    content = yaml.safe_dump(data)
    message = _load(tmp_path_factory.mktemp("settings"), content)
    if message:
        assert message.startswith(("invalid settings: ", "cannot load settings: ")), message
        if message.startswith("invalid settings: "):
            assert any(name in message for name in data), message


def test_bad_log_level_is_named() -> None:
    from dds.commands.serve import _configure_logging

    with pytest.raises(UsageError, match="log_level 'LOUD'"):
        _configure_logging(Settings(log_level="LOUD"))
