"""Our Node protos (protos/k8s, the encoding of externalgrpc's NodeGroupTemplateNodeInfo) against a real apiserver:
a Node read as protobuf decodes with dds/provider/gen to what the JSON view says, and a Node we encode is accepted
and reads back as meant. The wrapper is Kubernetes' envelope: the bytes `k8s\\x00`, then a runtime.Unknown holding the
TypeMeta and the object's own bytes (`raw`)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from kubernetes import client

from dds.provider.gen.k8s import core_v1_pb2
from harness.controlplane import ControlPlane

pytestmark = pytest.mark.integration

PROTOBUF = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"
GPU = "nvidia.com/gpu"


def _envelope_classes() -> tuple[type, type]:
    """runtime.Unknown and runtime.TypeMeta (k8s.io/apimachinery/pkg/runtime/generated.proto), built at run time:
    they are not among the messages DDS generates, and only this test needs them."""
    proto = descriptor_pb2.FileDescriptorProto(name="dds_test_runtime.proto", package="k8s.io.apimachinery.pkg.runtime",
                                               syntax="proto2")
    string, message, bytes_ = (descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                               descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
                               descriptor_pb2.FieldDescriptorProto.TYPE_BYTES)
    optional = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
    type_meta = proto.message_type.add(name="TypeMeta")
    type_meta.field.add(name="apiVersion", number=1, type=string, label=optional)
    type_meta.field.add(name="kind", number=2, type=string, label=optional)
    unknown = proto.message_type.add(name="Unknown")
    unknown.field.add(name="typeMeta", number=1, type=message, label=optional,
                      type_name=".k8s.io.apimachinery.pkg.runtime.TypeMeta")
    unknown.field.add(name="raw", number=2, type=bytes_, label=optional)
    unknown.field.add(name="contentEncoding", number=3, type=string, label=optional)
    unknown.field.add(name="contentType", number=4, type=string, label=optional)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return (message_factory.GetMessageClass(pool.FindMessageTypeByName("k8s.io.apimachinery.pkg.runtime.Unknown")),
            message_factory.GetMessageClass(pool.FindMessageTypeByName("k8s.io.apimachinery.pkg.runtime.TypeMeta")))


Unknown, TypeMeta = _envelope_classes()


@pytest.fixture
def http(control_plane: ControlPlane) -> Iterator[requests.Session]:
    session = requests.Session()
    session.trust_env = False  # REQUESTS_CA_BUNDLE would replace the control plane's CA
    session.headers["Authorization"] = f"Bearer {control_plane.token}"
    with control_plane.api_client() as api:
        session.verify = api.configuration.ssl_ca_cert
        yield session
    session.close()


@pytest.fixture
def core(control_plane: ControlPlane) -> Iterator[client.CoreV1Api]:
    with control_plane.api_client() as api:
        yield client.CoreV1Api(api)


@pytest.fixture
def node_name(core: client.CoreV1Api) -> Iterator[str]:
    name = f"proto-{uuid.uuid4().hex[:6]}"
    yield name
    try:
        core.delete_node(name)
    except client.ApiException as exc:
        if exc.status != 404:
            raise


def unwrap(body: bytes) -> Any:
    assert body[:4] == MAGIC, f"not the protobuf envelope: {body[:16]!r}"
    return Unknown.FromString(body[4:])


def json_view(core: client.CoreV1Api, name: str) -> dict[str, Any]:
    return core.api_client.sanitize_for_serialization(core.read_node(name))


def test_a_node_read_as_protobuf_decodes_with_our_messages_to_its_json_view(
        control_plane: ControlPlane, core: client.CoreV1Api, http: requests.Session, node_name: str) -> None:
    resources = {"cpu": "16", "memory": "64Gi", "pods": "110", GPU: "4", "ephemeral-storage": "100Gi"}
    core.create_node(client.V1Node(
        metadata=client.V1ObjectMeta(name=node_name, labels={"nvidia.com/gpu.product": "A30",
                                                             "node.kubernetes.io/instance-type": "cdi-16c64g"}),
        spec=client.V1NodeSpec(provider_id=f"kwok://{node_name}", taints=[
            client.V1Taint(key="dds.cdi.dev/attaching", value="true", effect="NoSchedule"),
            client.V1Taint(key="example.com/dedicated", effect="NoExecute")])))
    core.patch_node_status(node_name, {"status": {"capacity": resources, "allocatable": resources}})

    response = http.get(f"{control_plane.server}/api/v1/nodes/{node_name}", headers={"Accept": PROTOBUF})
    assert response.status_code == 200 and response.headers["Content-Type"] == PROTOBUF
    envelope = unwrap(response.content)
    assert (envelope.typeMeta.apiVersion, envelope.typeMeta.kind) == ("v1", "Node")
    assert envelope.contentEncoding == "" and envelope.contentType == ""  # raw is plain protobuf
    node = core_v1_pb2.Node.FromString(envelope.raw)

    expected = json_view(core, node_name)
    assert node.metadata.name == expected["metadata"]["name"]
    assert node.metadata.uid == expected["metadata"]["uid"]
    assert dict(node.metadata.labels) == expected["metadata"]["labels"]
    assert node.spec.providerID == expected["spec"]["providerID"]
    assert [(t.key, t.value, t.effect) for t in node.spec.taints] == [
        (t["key"], t.get("value", ""), t["effect"]) for t in expected["spec"]["taints"]]
    assert {k: q.string for k, q in node.status.capacity.items()} == expected["status"]["capacity"]
    assert {k: q.string for k, q in node.status.allocatable.items()} == expected["status"]["allocatable"]


def test_a_node_we_encode_is_accepted_and_reads_back_as_meant(
        control_plane: ControlPlane, core: client.CoreV1Api, http: requests.Session, node_name: str) -> None:
    """The direction cluster-autoscaler relies on: bytes DDS produces, decoded by Kubernetes' own code."""
    node = core_v1_pb2.Node()
    node.metadata.name = node_name
    node.metadata.labels.update({"nvidia.com/gpu.product": "A30", "dds.cdi.dev/template": "true"})
    node.spec.providerID = f"dds://{node_name}"
    taint = node.spec.taints.add()
    taint.key, taint.value, taint.effect = "dds.cdi.dev/template", "true", "NoSchedule"
    envelope = Unknown(typeMeta=TypeMeta(apiVersion="v1", kind="Node"), raw=node.SerializeToString())

    response = http.post(f"{control_plane.server}/api/v1/nodes", data=MAGIC + envelope.SerializeToString(),
                         headers={"Content-Type": PROTOBUF, "Accept": "application/json"})
    assert response.status_code == 201, response.text

    stored = json_view(core, node_name)
    assert stored["metadata"]["labels"] == {"nvidia.com/gpu.product": "A30", "dds.cdi.dev/template": "true"}
    assert stored["spec"]["providerID"] == f"dds://{node_name}"
    assert stored["spec"]["taints"] == [{"key": "dds.cdi.dev/template", "value": "true", "effect": "NoSchedule"}]

    # Status is a subresource: capacity written as protobuf through /status, then read back as JSON.
    for key, value in {"cpu": "16", "memory": "64Gi", GPU: "4"}.items():
        node.status.capacity[key].string = value
        node.status.allocatable[key].string = value
    current = unwrap(http.get(f"{control_plane.server}/api/v1/nodes/{node_name}",
                              headers={"Accept": PROTOBUF}).content)
    node.metadata.resourceVersion = core_v1_pb2.Node.FromString(current.raw).metadata.resourceVersion
    envelope.raw = node.SerializeToString()
    response = http.put(f"{control_plane.server}/api/v1/nodes/{node_name}/status",
                        data=MAGIC + envelope.SerializeToString(),
                        headers={"Content-Type": PROTOBUF, "Accept": "application/json"})
    assert response.status_code == 200, response.text
    assert json_view(core, node_name)["status"]["capacity"] == {"cpu": "16", "memory": "64Gi", GPU: "4"}
