"""The planner-backed IncreaseSize (dds/controller/ca_requests.py) refuses with the servicer's ScaleUpRefused, so CA gets
RESOURCE_EXHAUSTED and backs the group off. It once had a class of its own, answered INTERNAL ("failed inside DDS") with a
traceback in DDS's log for every ordinary "nothing to add" — seen in the outage e2e when CA asked a group at its max."""

from __future__ import annotations

import grpc

from dds.controller.ca_requests import ScaleUpRefused
from dds.provider.servicer import status_for


def test_a_planner_refusal_is_resource_exhausted_for_ca():
    refusal = ScaleUpRefused("DDS cannot add capacity to MachineSet/default/gpu-workers: group at its max size 4")
    assert status_for(refusal) == grpc.StatusCode.RESOURCE_EXHAUSTED
