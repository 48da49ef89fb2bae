"""Node group definitions: MachineSet annotations and the YAML file, malformed groups reported and skipped."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client

from dds import metrics
from dds.config import NamespaceGrant
from dds.kube.machinesets import MachineSetLister, machineset_from_object
from dds.model.groups import SourceRef, TemplateMode
from dds.groups.sources import FileSource, MachineSetSource, SourceRead, SourceUnavailable
from dds.groups.schema import GroupInput, parse_duration, parse_group
from dds.groups.catalog import NodeGroupCatalog

from .conftest import RecordingEvents, StaticSource, annotations, make_group

CAP = "capacity.cluster-autoscaler.kubernetes.io/"
MIN = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size"
MAX = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size"


def parse(overrides=None, remove=(), replicas=1, taints=()):
    values = annotations(overrides)
    for key in remove:
        values.pop(key)
    return parse_group(GroupInput(id="MachineSet/default/gpu-workers", annotations=values, replicas=replicas,
                                  source=SourceRef(kind="MachineSet", name="gpu-workers", namespace="default"),
                                  template_taints=taints))


def test_demo_group_from_annotations():
    spec, errors = parse()
    assert errors == ()
    assert (spec.min_size, spec.max_size, spec.replicas, spec.milli_cpu, spec.memory) == (1, 4, 1, 16000, 64 * 2**30)
    assert (spec.initial_gpus, spec.max_gpus_per_node, spec.gpu_models, spec.fabric_pool) == (1, 4, ("A30",), "default")
    assert spec.template_mode == TemplateMode.SPEC_FIXED and spec.gpu_resource == "nvidia.com/gpu"


@pytest.mark.parametrize("overrides, remove, key, fragment", [
    pytest.param({MAX: "four"}, (), MAX, "'four' is not a whole number", id="bad-number"),
    pytest.param({MIN: "5"}, (), MIN, "min size 5 is above max size 4", id="min-above-max"),
    pytest.param({"dds.cdi.dev/template-mode": "elastic"}, (), "dds.cdi.dev/template-mode", "not a template mode",
                 id="unknown-template-mode"),
    pytest.param({}, (MAX,), MAX, "missing", id="missing-max"),
    pytest.param({CAP + "cpu": "lots"}, (), CAP + "cpu", "not a positive CPU quantity", id="bad-cpu"),
    pytest.param({CAP + "memory": "0"}, (), CAP + "memory", "not a positive memory quantity", id="zero-memory"),
    pytest.param({CAP + "gpu-count": "6"}, (), "dds.cdi.dev/max-gpus-per-node", "below the GPUs a new node boots with",
                 id="initial-above-max-gpus"),
    pytest.param({CAP + "taints": "dedicated=gpu:Sometimes"}, (), CAP + "taints", "key=value:Effect",
                 id="bad-taint-effect"),
    pytest.param({CAP + "labels": "tier"}, (), CAP + "labels", "key=value", id="bad-label"),
    pytest.param({"dds.cdi.dev/force-detach": "yes"}, (), "dds.cdi.dev/force-detach", "true or false", id="bad-bool"),
    pytest.param({"dds.cdi.dev/gpu-idle-cooldown": "soon"}, (), "dds.cdi.dev/gpu-idle-cooldown", "duration",
                 id="bad-cooldown"),
    pytest.param({"cluster.x-k8s.io/autoscaling-options-scaledowngpuutilizationthreshold": "1.5"}, (),
                 "cluster.x-k8s.io/autoscaling-options-scaledowngpuutilizationthreshold", "0..1",
                 id="threshold-out-of-range"),
])
def test_malformed_definitions_name_the_key(overrides, remove, key, fragment):
    spec, errors = parse(overrides, remove)
    assert spec is None
    assert any(e.key == key and fragment in e.message for e in errors), errors


def test_every_error_of_a_group_is_reported_at_once():
    _, errors = parse({MAX: "x", CAP + "cpu": "y"})
    assert {e.key for e in errors} == {MAX, CAP + "cpu"}


@pytest.mark.parametrize("text, seconds", [("10m0s", 600), ("1h30m", 5400), ("90s", 90), ("500ms", 0.5),
                                           ("600", 600), ("1.5h", 5400)])
def test_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "10 minutes", "-5m", "5x", "m"])
def test_bad_durations(text):
    with pytest.raises(ValueError):
        parse_duration(text)


def test_options_and_gpu_type_fallback():
    spec, _ = parse({"cluster.x-k8s.io/autoscaling-options-scaledownunneededtime": "5m",
                     "cluster.x-k8s.io/autoscaling-options-maxnodeprovisiontime": "20m0s",
                     "cluster.x-k8s.io/autoscaling-options-maxnodestartuptime": "20m0s",  # no wire field: ignored
                     CAP + "gpu-type": "amd.com/gpu"})
    assert spec.options.scale_down_unneeded_seconds == 300 and spec.options.max_node_provision_seconds == 1200
    assert spec.options.scale_down_utilization_threshold is None
    assert spec.gpu_resource == "amd.com/gpu"
    ours, _ = parse({CAP + "gpu-type": "amd.com/gpu", "dds.cdi.dev/gpu-resource": "nvidia.com/a30"})
    assert ours.gpu_resource == "nvidia.com/a30"


def test_annotation_taint_replaces_spec_taint_with_same_key_and_effect():
    spec, _ = parse({CAP + "taints": "dedicated=gpu:NoSchedule"},
                    taints=({"key": "dedicated", "value": "old", "effect": "NoSchedule"},
                            {"key": "zone", "value": "a", "effect": "NoExecute"}))
    assert [(t.key, t.value, t.effect) for t in spec.taints] == [("zone", "a", "NoExecute"),
                                                                 ("dedicated", "gpu", "NoSchedule")]


# --- the catalog ---

def test_malformed_group_is_reported_once_and_skipped_while_others_work():
    good = make_group()
    _, errors = parse({MIN: "9"})
    source = StaticSource()
    source.result = SourceRead((good,), errors)
    events = RecordingEvents()
    catalog = NodeGroupCatalog(source=source, events=events)
    before = metrics.NODE_GROUP_CONFIG_ERRORS.labels("file", "malformed")._value.get()

    catalog.refresh()
    catalog.refresh()  # CA refreshes every 10 s: the same problem is not reported again

    assert [g.id for g in catalog.groups()] == [good.id]
    assert len(events.events) == 1
    involved, event_type, reason, message = events.events[0]
    assert (involved.kind, involved.namespace, involved.name, event_type, reason) == (
        "MachineSet", "default", "gpu-workers", "Warning", "InvalidNodeGroup")
    assert MIN in message and "min size 9 is above max size 4" in message
    assert metrics.NODE_GROUP_CONFIG_ERRORS.labels("file", "malformed")._value.get() == before + 1


def test_transient_read_error_keeps_the_last_good_groups():
    source = StaticSource([make_group()])
    catalog = NodeGroupCatalog(source=source, events=RecordingEvents())
    assert catalog.refresh()
    source.result = SourceUnavailable("apiserver: connection refused")
    assert not catalog.refresh()
    assert [g.id for g in catalog.groups()] == ["MachineSet/default/gpu-workers"]
    assert "connection refused" in catalog.last_error


# --- the YAML file ---

def test_example_file_has_the_demo_group():
    result = FileSource(Path(__file__).resolve().parents[3] / "examples" / "node-groups.yaml").read()
    assert result.errors == ()
    (group,) = result.groups
    assert group.id == "MachineSet/default/gpu-workers"
    assert (group.min_size, group.max_size, group.milli_cpu, group.memory) == (1, 4, 16000, 64 * 2**30)
    assert (group.max_gpus_per_node, group.initial_gpus, group.gpu_models, group.fabric_pool) == (4, 1, ("A30",),
                                                                                                 "default")


@pytest.mark.parametrize("content, fragment", [
    pytest.param("nodeGroups: [", "not valid YAML", id="not-yaml"),
    pytest.param("groups: []", "`nodeGroups` list", id="wrong-top-level"),
])
def test_unreadable_file_is_a_source_error(tmp_path, content, fragment):
    path = tmp_path / "groups.yaml"
    path.write_text(content)
    with pytest.raises(SourceUnavailable, match=fragment.replace("[", r"\[")):
        FileSource(path).read()


def test_bad_entries_in_a_file_are_skipped(tmp_path):
    path = tmp_path / "groups.yaml"
    path.write_text(f"""
nodeGroups:
  - id: MachineSet/default/good
    annotations: {{"{MAX}": 2, "{CAP}cpu": 4, "{CAP}memory": 8Gi}}
  - id: MachineSet/default/typo
    replicas: -1
    annotations: {{}}
  - id: MachineSet/default/good
    annotations: {{"{MAX}": 2, "{CAP}cpu": 4, "{CAP}memory": 8Gi}}
  - just a string
""")
    result = FileSource(path).read()
    assert [g.id for g in result.groups] == ["MachineSet/default/good"]
    assert sorted(e.key for e in result.errors) == ["id", "nodeGroups[1].replicas", "nodeGroups[3]"]


# --- MachineSets ---

def machineset(name, version="v1beta1", enabled="true", replicas=2, taints=None, kind="MachineSet", **extra):
    item = {"apiVersion": f"cluster.x-k8s.io/{version}", "kind": kind,
            "metadata": {"name": name, "namespace": "capi", "uid": f"uid-{name}",
                         "annotations": {**annotations(), "dds.cdi.dev/enabled": enabled, **extra}},
            "spec": {"template": {"spec": {}}}}
    if replicas is not None:
        item["spec"]["replicas"] = replicas
    if taints:
        item["spec"]["template"]["spec"]["taints"] = taints
    return item


class FakeCustomObjects:
    def __init__(self, served: dict[str, list[dict]], error: Exception | None = None) -> None:
        self.served = served
        self.error = error
        self.calls: list[tuple] = []

    def list_cluster_custom_object(self, group, version, plural, **_options):
        self.calls.append((group, version, plural))
        if self.error:
            raise self.error
        if version not in self.served:
            raise client.ApiException(status=404, reason="Not Found")
        kind = {"machinesets": "MachineSet", "machinedeployments": "MachineDeployment"}[plural]
        return {"items": [i for i in self.served[version] if i["kind"] == kind]}

    def list_namespaced_custom_object(self, group, version, namespace, plural, **_options):
        items = self.list_cluster_custom_object(group, version, plural)["items"]
        return {"items": [i for i in items if i["metadata"]["namespace"] == namespace]}


# The MachineSets of these tests live in namespace capi, granted every pool.
GRANTS = {"capi": NamespaceGrant(pools=["*"])}


def lister(fake, namespaces=()):
    result = MachineSetLister(client.ApiClient(), namespaces)
    result._capi._custom = fake
    return result


def test_machinesets_opted_in_become_groups_v1beta2_first():
    fake = FakeCustomObjects({"v1beta2": [machineset("gpu", "v1beta2", replicas=None),
                                          machineset("plain", "v1beta2", enabled="false")]})
    source = MachineSetSource(lister(fake), GRANTS)
    (group,) = source.read().groups
    assert group.id == "MachineSet/capi/gpu"
    assert group.replicas == 1  # v1beta2 with replicas unset: what Cluster API defaulting gives (min size)
    assert group.source.api_version == "cluster.x-k8s.io/v1beta2" and group.source.uid == "uid-gpu"
    assert fake.calls[0][1] == "v1beta2"


def test_machinesets_v1beta1_with_spec_taints():
    fake = FakeCustomObjects({"v1beta1": [machineset("gpu", taints=[{"key": "k", "value": "v",
                                                                      "effect": "NoSchedule"}])]})
    (group,) = MachineSetSource(lister(fake), GRANTS).read().groups
    assert group.replicas == 2 and [(t.key, t.effect) for t in group.taints] == [("k", "NoSchedule")]
    assert [c[1] for c in fake.calls][:2] == ["v1beta2", "v1beta1"]  # newest first, then the one served


def test_no_cluster_api_installed_means_no_groups():
    assert MachineSetSource(lister(FakeCustomObjects({})), GRANTS).read().groups == ()


def test_apiserver_errors_are_transient():
    fake = FakeCustomObjects({}, error=client.ApiException(status=503, reason="Service Unavailable"))
    with pytest.raises(SourceUnavailable, match="503"):
        MachineSetSource(lister(fake), GRANTS).read()


def test_configured_namespaces_only():
    other = machineset("elsewhere")
    other["metadata"]["namespace"] = "other"
    fake = FakeCustomObjects({"v1beta1": [machineset("gpu"), other]})
    groups = MachineSetSource(lister(fake, namespaces=["capi"]), GRANTS).read().groups
    assert [g.id for g in groups] == ["MachineSet/capi/gpu"]


def test_machineset_object_fields():
    obj = machineset_from_object(machineset("gpu", replicas=3))
    assert (obj.group_id, obj.replicas, obj.api_version) == ("MachineSet/capi/gpu", 3, "cluster.x-k8s.io/v1beta1")


def test_a_machineset_a_machinedeployment_owns_is_refused_with_the_reason():
    owned = machineset("md-0-abcde", "v1beta2")
    owned["metadata"]["ownerReferences"] = [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
                                              "name": "md-0", "uid": "uid-md-0"}]
    fake = FakeCustomObjects({"v1beta2": [owned, machineset("gpu", "v1beta2")]})

    read = MachineSetSource(lister(fake), GRANTS).read()

    assert [g.id for g in read.groups] == ["MachineSet/capi/gpu"]
    (error,) = read.errors
    assert (error.group_id, error.key) == ("MachineSet/capi/md-0-abcde", "dds.cdi.dev/enabled")
    assert "owned by MachineDeployment capi/md-0" in error.message and "would be undone" in error.message
    assert "on MachineDeployment capi/md-0 instead" in error.message


def owned_by_deployment(item, deployment):
    item["metadata"]["ownerReferences"] = [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
                                             "name": deployment, "uid": f"uid-{deployment}"}]
    return item


def test_an_opted_in_machinedeployment_is_a_group_and_its_machinesets_are_passed_over():
    # Cluster API copies the MachineDeployment's annotations to its MachineSets: they carry the opt-in too.
    deployment = machineset("md-0", "v1beta2", kind="MachineDeployment", replicas=1)
    owned = owned_by_deployment(machineset("md-0-abcde", "v1beta2"), "md-0")
    fake = FakeCustomObjects({"v1beta2": [deployment, owned]})

    read = MachineSetSource(lister(fake), GRANTS).read()

    (group,) = read.groups
    assert read.errors == ()
    assert (group.id, group.source.kind, group.source.name, group.source.namespace) == (
        "MachineDeployment/capi/md-0", "MachineDeployment", "md-0", "capi")


def test_no_machinedeployments_served_means_machinesets_only():
    class MachineSetsOnly(FakeCustomObjects):
        def list_cluster_custom_object(self, group, version, plural, **options):
            if plural == "machinedeployments":
                raise client.ApiException(status=404, reason="Not Found")
            return super().list_cluster_custom_object(group, version, plural, **options)

    read = MachineSetSource(lister(MachineSetsOnly({"v1beta2": [machineset("gpu", "v1beta2")]})), GRANTS).read()
    assert [g.id for g in read.groups] == ["MachineSet/capi/gpu"]
