"""A standby replica answers UNAVAILABLE, naming the leader, to every CloudProvider RPC; the leader answers normally."""

import grpc
import pytest

from dds.provider.gen.externalgrpc import externalgrpc_pb2 as pb
from dds.provider.leadership import LeaderGate

from .conftest import make_group


class Leadership:
    def __init__(self) -> None:
        self.leading = False
        self.holder = "dds-7f9c_12"


@pytest.fixture
def standby(provider_factory):
    leadership = Leadership()
    gate = LeaderGate(lambda: leadership.leading, lambda: leadership.holder)
    return leadership, provider_factory([make_group()], interceptors=[gate])


def test_standby_refuses_every_rpc_with_the_leaders_name(standby):
    _, provider = standby
    calls = [
        (provider.stub.NodeGroups, pb.NodeGroupsRequest()),
        (provider.stub.Refresh, pb.RefreshRequest()),
        (provider.stub.NodeGroupTargetSize, pb.NodeGroupTargetSizeRequest(id="MachineSet/default/gpu-workers")),
        (provider.stub.NodeGroupIncreaseSize, pb.NodeGroupIncreaseSizeRequest(id="MachineSet/default/gpu-workers",
                                                                               delta=1)),
    ]
    for method, request in calls:
        with pytest.raises(grpc.RpcError) as error:
            method(request, timeout=5)
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "not the leader; the leader is dds-7f9c_12" in error.value.details()
    assert provider.tracker.list() == ()  # the refused IncreaseSize recorded nothing


def test_leader_serves_and_a_standby_without_observed_leader_says_so(standby):
    leadership, provider = standby
    leadership.leading = True
    groups = provider.stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5)
    assert [g.id for g in groups.nodeGroups] == ["MachineSet/default/gpu-workers"]
    leadership.leading, leadership.holder = False, ""
    with pytest.raises(grpc.RpcError) as error:
        provider.stub.NodeGroups(pb.NodeGroupsRequest(), timeout=5)
    assert "no lease holder observed yet" in error.value.details()


def test_health_service_is_not_gated(standby):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    _, provider = standby
    provider.server.set_serving(False)
    reply = health_pb2_grpc.HealthStub(provider.channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
