"""Kueue in a simulation: jobs admitted through ProvisioningRequests (docs/kueue.md), and cluster-autoscaler's own
best-effort-atomic class standing in for "CA adding nodes only".

A scenario with a `KueueQueue` runs every job the way a Kueue cluster does: a job (a gang of the trace, or a pod on
its own) is a Workload; in arrival order, a Workload that fits the ClusterQueue's GPU quota takes it (Kueue's
BestEffortFIFO: one that does not fit does not hold back smaller ones behind it) and gets a ProvisioningRequest, one
pod set per distinct pod shape. No pod exists until the request is `Provisioned=True`; then Kueue admits the job and
all of its pods are created at once, annotated as the request's consumers. A `Failed=True` request gives its quota
back and is tried again, as Kueue's default retry strategy does (kueue v0.17.0,
apis/kueue/v1beta2/provisioningrequestconfig_types.go: up to 3 retries after 60 s, 120 s, 240 s, at most 1800 s;
then the Workload is deactivated and never runs). The quota is held until every pod of the job has ended.

Who serves the request is the policy's:

- DDS's class (`attach-or-provision.dds.cdi.dev`): the attach-first policies hand the requests to the control loop's
  own pass (`plan_pass` with `PassInputs.provisioning`, dds/planner/provisioning.py) and carry its plan out as
  dds/controller/provisioning.py does: bookings (taints), tolerations, attaches, new nodes, conditions.
- `node-only`: cluster-autoscaler's `best-effort-atomic-scale-up.autoscaling.x-k8s.io`, as CA 1.36.1 runs it
  (provisioningrequest/besteffortatomic/provisioning_class.go): one request per loop, its pods that fit the nodes
  as they are (live and on their way, after the capacity CA books for the requests provisioned in the last 10
  minutes: their pods as CA injects them into its simulation, whether or not the real pods run already,
  processors/provreq/processor.go) need nothing, the rest get whole new nodes in one atomic scale-up. `Provisioned=True` is written as soon as the scale-up is asked for (not
  when the nodes are up: the pods then wait for them); when the nodes cannot all be had, `Provisioned=False` and
  the request is tried again after 1 minute, doubling up to 10 (`--provisioning-request-max-backoff-time`). CA books
  nothing on the nodes: kube-scheduler may give a new node to any pod that fits it first.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Optional, Sequence

from dds.model.plan import PlannerConfig, ScaleUpPlan
from dds.model.provisioning import (ACCEPTED, FAILED, PROVISIONED, Condition, PodSet, ProvisioningRequest,
                                    ProvisioningView)
from dds.model.snapshot import PodInfo, Snapshot
from dds.planner import plan_scale_up
from dds.planner.gangs import placed_pods
from dds.planner.memos import PlannerMemos
from dds.planner.provisioning import RequestDecision, virtual_pods
from dds.sim.trace import Job

CA_RETRY_FIRST_S = 60.0  # cluster-autoscaler's initial ProvisioningRequest retry time
CA_RETRY_MAX_S = 600.0  # --provisioning-request-max-backoff-time default
CA_BOOKING_S = 600.0  # processors/provreq/processor.go defaultReservationTime


@dataclass(frozen=True)
class KueueQueue:
    """The ClusterQueue every job goes through, and its provisioning check's retry strategy (Kueue's defaults)."""

    gpu_quota: int  # nominalQuota of the GPU resource
    backoff_limit: int = 3
    backoff_base_s: float = 60.0
    backoff_max_s: float = 1800.0

    def __post_init__(self) -> None:
        if self.gpu_quota <= 0:
            raise ValueError(f"kueue: gpu_quota must be positive, got {self.gpu_quota}")


@dataclass(frozen=True, slots=True)
class WorkloadRecord:
    """One Kueue job of a run: from its creation to admission (`Provisioned=True`) and to all of its pods Running."""

    name: str
    pods: int
    gpus: int
    created_s: float
    requested_s: Optional[float]  # when its last ProvisioningRequest was created (it got quota): None, never
    admitted_s: Optional[float]  # None: never admitted (deactivated after its retries, or the run ended first)
    running_s: Optional[float]  # when the last of its pods started
    attempts: int  # ProvisioningRequests created for it

    @property
    def to_admitted_s(self) -> Optional[float]:
        return None if self.admitted_s is None else self.admitted_s - self.created_s

    @property
    def from_quota_s(self) -> Optional[float]:
        """From its last request (created when it got quota) to all of its pods Running: the autoscaler's part and
        the pods' start, without the wait for quota."""
        return None if self.running_s is None or self.requested_s is None else self.running_s - self.requested_s

    @property
    def to_running_s(self) -> Optional[float]:
        return None if self.running_s is None else self.running_s - self.created_s


@dataclass
class Workload:
    name: str
    jobs: list[Job]
    created_s: float
    holds_quota: bool = False
    request: Optional[ProvisioningRequest] = None
    attempts: int = 0
    retry_at: Optional[float] = None  # Kueue's backoff after a failed request
    ca_retry_at: Optional[float] = None  # cluster-autoscaler's backoff after Provisioned=False
    ca_retries: int = 0
    admitted_s: Optional[float] = None
    deactivated: bool = False
    ended: int = 0

    @property
    def gpus(self) -> int:
        return sum(j.gpus for j in self.jobs)


@dataclass
class Kueue:
    """The Kueue side of a simulation: quota, requests, their conditions, admission and retries."""

    queue: KueueQueue
    workloads: dict[str, Workload] = field(default_factory=dict)
    unadmitted_pods: int = 0  # pods of jobs that arrived and are not admitted (yet, or ever)
    _quota_used: int = 0

    def arrive(self, job: Job, now: float) -> None:
        name = job.group or job.name
        workload = self.workloads.setdefault(name, Workload(name=name, jobs=[], created_s=now))
        workload.jobs.append(job)
        self.unadmitted_pods += 1

    def take_quota(self, now: float, templates: Callable[[str], PodInfo]) -> list[Workload]:
        """Workloads that get quota now (oldest first, smaller ones past one that does not fit), each with a new
        request; `templates`: each job's pod as Kueue's PodTemplate shows it."""
        started = []
        for workload in self.workloads.values():
            if (workload.holds_quota or workload.deactivated or workload.admitted_s is not None
                    or (workload.retry_at is not None and workload.retry_at > now)):
                continue
            if self._quota_used + workload.gpus > self.queue.gpu_quota:
                continue
            self._quota_used += workload.gpus
            workload.holds_quota, workload.retry_at = True, None
            workload.ca_retry_at, workload.ca_retries = None, 0  # CA's backoff is per request
            workload.attempts += 1
            workload.request = self._request(workload, now, templates)
            started.append(workload)
        return started

    def _request(self, workload: Workload, now: float, templates: Callable[[str], PodInfo]) -> ProvisioningRequest:
        """One pod set per distinct pod shape (Kueue merges pod sets with identical templates)."""
        counts: dict[tuple, list[Job]] = {}
        for job in workload.jobs:
            counts.setdefault((job.milli_cpu, job.memory, job.gpus, job.gpu_model), []).append(job)
        pod_sets = tuple(PodSet(template=replace(templates(jobs[0].name), pod_group=None, pod_group_min_member=0,
                                                 labels={}), count=len(jobs))
                         for jobs in counts.values())
        name = f"{workload.name}-attempt{workload.attempts}"
        return ProvisioningRequest(namespace=templates(workload.jobs[0].name).namespace, name=name,
                                   uid=f"sim-pr-{name}", created_at=now, pod_sets=pod_sets)

    def view(self) -> ProvisioningView:
        """The requests of live Workloads (a request goes with its Workload's quota: deleted when the job ends)."""
        return ProvisioningView(requests=tuple(w.request for w in self.workloads.values()
                                               if w.holds_quota and w.request is not None))

    def pending_ca(self, now: float) -> Optional[Workload]:
        """The next request cluster-autoscaler's best-effort-atomic class looks at: the oldest with no Provisioned
        condition, or Provisioned=False past its retry time."""
        for workload in self.workloads.values():
            request = workload.request
            if not workload.holds_quota or request is None or request.is_true(PROVISIONED):
                continue
            if workload.ca_retry_at is None or workload.ca_retry_at <= now:
                return workload
        return None

    def ca_booked(self, now: float) -> list[PodInfo]:
        """The pods cluster-autoscaler injects into its simulation to book capacity: those of every request of its
        class Provisioned less than 10 minutes ago (then BookingExpired), the job's own pods counted besides."""
        pods: list[PodInfo] = []
        for workload in self.workloads.values():
            request = workload.request
            if request is not None and request.is_true(PROVISIONED) and \
                    now - request.conditions[PROVISIONED].since < CA_BOOKING_S:
                pods += virtual_pods(request)
        return pods

    def set_conditions(self, workload: Workload, changes: Sequence[tuple[str, str, str, str]], now: float) -> bool:
        """Write conditions on the Workload's request; True when it became Provisioned (Kueue admits the job)."""
        request = workload.request
        if request is None:
            return False
        conditions = dict(request.conditions)
        for kind, status, reason, message in changes:
            current = conditions.get(kind)
            since = current.since if current is not None and current.status == status else now
            conditions[kind] = Condition(status=status, reason=reason, message=message, since=since)
        workload.request = replace(request, conditions=conditions)
        if workload.request.is_true(FAILED):
            self._failed(workload, now)
            return False
        if workload.request.is_true(PROVISIONED) and workload.admitted_s is None:
            workload.admitted_s = now
            self.unadmitted_pods -= len(workload.jobs)
            return True
        return False

    def ca_outcome(self, workload: Workload, plan: Optional[ScaleUpPlan], now: float) -> bool:
        """What cluster-autoscaler's best-effort-atomic class writes after its scale-up (`plan`, None when not every
        pod could be placed); True when Kueue admits the job now."""
        accepted = (ACCEPTED, "True", "Accepted", "Provisioning Request was accepted")
        if plan is None:
            workload.ca_retry_at = now + min(CA_RETRY_FIRST_S * 2 ** min(workload.ca_retries, 10), CA_RETRY_MAX_S)
            workload.ca_retries += 1
            return self.set_conditions(workload, [accepted, (PROVISIONED, "False", "CapacityIsNotFound",
                                                             "Capacity is not found, CA will try to find it later.")],
                                       now)
        reason = "CapacityIsProvisioned" if plan.new_nodes else "CapacityIsFound"
        return self.set_conditions(workload, [accepted, (PROVISIONED, "True", reason, reason)], now)

    def apply(self, decisions: Sequence[RequestDecision], now: float) -> list[Workload]:
        """DDS's decisions on the requests; returns the Workloads Kueue admits now."""
        by_uid = {w.request.uid: w for w in self.workloads.values() if w.request is not None and w.holds_quota}
        admitted = []
        for decision in decisions:
            workload = by_uid.get(decision.request.uid)
            if workload is not None and self.set_conditions(
                    workload, [(c.kind, c.status, c.reason, c.message) for c in decision.conditions], now):
                admitted.append(workload)
        return admitted

    def _failed(self, workload: Workload, now: float) -> None:
        """Kueue's retry strategy: the quota goes back; a new request after the backoff, or the job deactivated."""
        self._release(workload)
        if workload.attempts <= self.queue.backoff_limit:
            delay = min(self.queue.backoff_base_s * 2 ** (workload.attempts - 1), self.queue.backoff_max_s)
            workload.retry_at = now + delay
        else:
            workload.deactivated = True

    def pod_ended(self, job: Job) -> None:
        workload = self.workloads[job.group or job.name]
        workload.ended += 1
        if workload.ended == len(workload.jobs):
            self._release(workload)

    def _release(self, workload: Workload) -> None:
        if workload.holds_quota:
            self._quota_used -= workload.gpus
            workload.holds_quota = False

    def next_retry(self, now: float) -> Optional[float]:
        """The earliest time a backoff (Kueue's or CA's) ends, after now."""
        times = [t for w in self.workloads.values() for t in (w.retry_at, w.ca_retry_at if w.holds_quota else None)
                 if t is not None and t > now]
        return min(times, default=None)

    def records(self, started: Mapping[str, Optional[float]]) -> tuple[WorkloadRecord, ...]:
        """`started`: each job's start time (None: never started)."""
        out = []
        for w in self.workloads.values():
            starts = [started.get(j.name) for j in w.jobs]
            running = None if any(s is None for s in starts) else max(s for s in starts if s is not None)
            out.append(WorkloadRecord(name=w.name, pods=len(w.jobs), gpus=w.gpus, created_s=w.created_s,
                                      requested_s=w.request.created_at if w.request is not None else None,
                                      admitted_s=w.admitted_s, running_s=running, attempts=w.attempts))
        return tuple(out)


def ca_atomic_scale_up(snapshot: Snapshot, config: PlannerConfig, booked: Sequence[PodInfo],
                       request: ProvisioningRequest, memos: PlannerMemos) -> Optional[ScaleUpPlan]:
    """Cluster-autoscaler's best-effort-atomic class for one request, with the planner standing in for CA's
    simulation (as the `node-only` policy's scale-up does): the booked pods (`Kueue.ca_booked`) take their room first
    wherever they fit, without a scale-up of their own; then the request's pods go where they fit, and whole new nodes
    are planned for the rest, all or nothing. Returns the plan (its `new_nodes` may be empty: everything fits as it
    is), or None when not every pod can be placed."""
    fits = plan_scale_up(snapshot, replace(config, allow_new_nodes=False), list(booked), memos=memos)
    held = [p for p in booked if p.key in placed_pods(fits)]
    # CA schedules the booked pods in its snapshot before it tries the request's: the request's pods come after them.
    pods = virtual_pods(replace(request, created_at=snapshot.now))
    plan = plan_scale_up(snapshot, replace(config, allow_new_nodes=True), held + pods,
                         memos=memos)
    if not {p.key for p in pods} <= placed_pods(plan):
        return None
    return plan
