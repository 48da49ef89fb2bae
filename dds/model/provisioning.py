"""ProvisioningRequests (autoscaling.x-k8s.io/v1) as DDS plans them: plain data, decoded at the edge
(dds/kube/provisioning.py), planned by dds/planner/provisioning.py.

Kueue's provisioning admission check creates one request per admitted-to-be workload, naming a class and one
PodTemplate per pod set; the job's pods do not exist until the request says `Provisioned=True`. DDS serves the
requests of its own class (`provisioning_class`, default `attach-or-provision.dds.cdi.dev`; docs/kueue.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

from dds.model.snapshot import PodInfo

DEFAULT_CLASS = "attach-or-provision.dds.cdi.dev"
# cluster-autoscaler's own atomic class: CA writes its conditions; its scale-up reaches DDS as a plain IncreaseSize
# with no pod behind it (externalgrpc has no AtomicIncreaseSize), which DDS plans for these requests (docs/kueue.md).
CA_ATOMIC_CLASS = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
API_GROUP = "autoscaling.x-k8s.io"
API_VERSION = "v1"
PLURAL = "provisioningrequests"
# Set by Kueue on the pods of a job admitted through a request (Kueue's podSetUpdates; CA's own constant too).
CONSUME_ANNOTATION = "autoscaling.x-k8s.io/consume-provisioning-request"
# A node whose GPUs are booked for a request: NoSchedule, value the request's uid; its pods get the toleration.
BOOKED_TAINT_KEY = "dds.cdi.dev/booked-for"
BOOKED_EFFECT = "NoSchedule"

# The condition types Kueue reads (autoscaling.x-k8s.io/v1 conditions.go).
ACCEPTED = "Accepted"
PROVISIONED = "Provisioned"
FAILED = "Failed"
BOOKING_EXPIRED = "BookingExpired"
CAPACITY_REVOKED = "CapacityRevoked"
# DDS's reason on `Provisioned=True` once every pod of the request has bound: the booking has served them, nothing is
# held for the request any more (dds/planner/provisioning.py), so its templates need not be read again.
CAPACITY_CONSUMED = "CapacityConsumed"


@dataclass(frozen=True)
class Condition:
    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str
    since: float = 0.0  # lastTransitionTime, epoch seconds


@dataclass(frozen=True)
class PodSet:
    template: PodInfo  # the PodTemplate's pod, as the planner reads a pod (its name is the template's)
    count: int


@dataclass(frozen=True)
class ProvisioningRequest:
    namespace: str
    name: str
    uid: str
    created_at: float
    pod_sets: tuple[PodSet, ...] = ()
    conditions: Mapping[str, Condition] = field(default_factory=dict)
    # Why the request cannot be read (a template missing or malformed, a count out of range): refused, never planned.
    error: Optional[str] = None
    class_name: str = DEFAULT_CLASS  # DDS's class (DDS writes the conditions) or CA_ATOMIC_CLASS (CA writes them)

    @property
    def cluster_autoscalers(self) -> bool:
        """Of cluster-autoscaler's atomic class: CA owns its conditions; DDS plans it only in CA's IncreaseSize."""
        return self.class_name == CA_ATOMIC_CLASS

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def pods(self) -> int:
        return sum(s.count for s in self.pod_sets)

    def is_true(self, kind: str) -> bool:
        condition = self.conditions.get(kind)
        return condition is not None and condition.status == "True"


@dataclass(frozen=True)
class ProvisioningView:
    """The requests of DDS's class and of CA's atomic class, read in one pass. `complete`: every namespace was read,
    so a booked node whose request is not among them belongs to a deleted request (a failed read releases nothing)."""

    requests: tuple[ProvisioningRequest, ...] = ()
    complete: bool = True
