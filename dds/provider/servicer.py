"""The externalgrpc CloudProvider servicer: decode CA's request, call the registry or a decider, encode the answer.

| RPC                          | answered from                     | notes                                                      |
|------------------------------|-----------------------------------|------------------------------------------------------------|
| Refresh                      | registry.refresh()                | start of every CA loop; never fails (last good groups kept) |
| NodeGroups                   | registry.views()                  | cached by CA until the next Refresh; spec-fixed G with live nodes adds `G#live` |
| NodeGroupForNode             | registry.group_for_node()         | a spec-fixed group's live node: `G#live`; id "" = not autoscaled |
| NodeGroupTargetSize          | registry.view()                   | an error here aborts CA's loop: only for unknown groups     |
| NodeGroupIncreaseSize        | registry check, ScaleUpDecider    | answers within CA's deadline; TargetSize includes it at once |
| NodeGroupDeleteNodes         | registry check, ScaleDownDecider  | placeholders drop their instance                            |
| NodeGroupDecreaseTargetSize  | registry.decrease_target()        | only instances with no node yet                             |
| NodeGroupNodes               | in-flight instances (+ live nodes of observed groups) |                                         |
| NodeGroupTemplateNodeInfo    | template.build_template_node()    | optional RPC; fills nodeBytes (2) and legacy nodeInfo (1)   |
| NodeGroupGetOptions          | CA's defaults + group overrides   | optional RPC; fills duration pairs 8/3, 9/4, 10/5           |
| GPULabel, GetAvailableGPUTypes | LABEL_ATTACHED_GPU, the models | cached by CA for its lifetime                               |
| PricingNodePrice, PricingPodPrice | -                            | UNIMPLEMENTED: the only code CA reads as "not provided"     |
| Cleanup                      | flushes the instance store        | CA is shutting down                                         |

A companion `G#live` (the live nodes of spec-fixed group G, registry.py) answers TargetSize and NodeGroupNodes with
those nodes, TemplateNodeInfo with G's template, GetOptions UNIMPLEMENTED (CA's own defaults, MaxNodeStartupTime
included, which the protocol cannot carry), and refuses IncreaseSize, DecreaseTargetSize and DeleteNodes with
FAILED_PRECONDITION: it is always at its min and max, and DDS removes those nodes itself.

Error codes (`status_for`): unknown group NOT_FOUND, bad argument INVALID_ARGUMENT (also a payload that is not the
method's request message: see `add_to_server`), a node of another group or a decrease below the registered nodes
FAILED_PRECONDITION, a scale-up nothing can serve RESOURCE_EXHAUSTED, anything unexpected INTERNAL. Every message says
what was wrong, cut to MAX_MESSAGE_CHARS (tests/unit/reliability fuzzes all of this).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

import grpc
from google.protobuf import any_pb2, duration_pb2, message_factory
from google.protobuf.message import DecodeError

from dds import metrics
from dds.model.groups import LABEL_ATTACHED_GPU, NodeGroupSpec, TemplateMode
from dds.model.text import bounded_text
from dds.scaling.requests import ScaleDownDecider, ScaleUpDecider, ScaleUpRefused
from dds.provider.gen.externalgrpc import externalgrpc_pb2 as pb
from dds.provider.gen.externalgrpc import externalgrpc_pb2_grpc as pb_grpc
from dds.scaling.instances import InstanceRecord, InstanceState
from dds.provider.membership import CompanionGroup
from dds.provider.registry import (InvalidRequest, PreconditionFailed, Registry, RegistryError, UnknownGroup,
                                   companion_refusal)
from dds.scaling.requests import Placeholder, RequestNode
from dds.provider.template import build_template_node

log = logging.getLogger(__name__)

_NANOS = 1_000_000_000
_GO_DURATION_MIN, _GO_DURATION_MAX = -2**63, 2**63 - 1  # nanoseconds; also the legacy field's int64
_STATE = {InstanceState.CREATING: pb.InstanceStatus.instanceCreating,
          InstanceState.DELETING: pb.InstanceStatus.instanceDeleting}


class NotProvided(Exception):
    """An optional RPC DDS does not provide (answered UNIMPLEMENTED)."""


def status_for(exc: BaseException) -> grpc.StatusCode:
    """The one place typed errors become gRPC status codes."""
    if isinstance(exc, UnknownGroup):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(exc, InvalidRequest):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(exc, PreconditionFailed):
        return grpc.StatusCode.FAILED_PRECONDITION
    if isinstance(exc, ScaleUpRefused):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(exc, NotProvided):
        return grpc.StatusCode.UNIMPLEMENTED
    if isinstance(exc, RegistryError):
        return grpc.StatusCode.FAILED_PRECONDITION
    return grpc.StatusCode.INTERNAL


# An error message echoes the bad value; cut it short, as the message travels in a trailer and a client refuses
# trailers over its metadata limit (8 KiB by default in gRPC) with an error that hides ours.
MAX_MESSAGE_CHARS = 1024


@dataclass(frozen=True)
class UndecodableRequest:
    """What the lenient deserializer hands over for a payload that is not the method's request message."""

    message_type: str
    error: str


def _lenient(message_class: Any) -> Callable[[bytes], Any]:
    """gRPC answers INTERNAL for a request its deserializer cannot read; decode here instead, so the servicer can
    answer INVALID_ARGUMENT naming the message type."""

    def deserialize(payload: bytes) -> Any:
        try:
            return message_class.FromString(payload)
        except (DecodeError, ValueError) as exc:
            return UndecodableRequest(message_class.DESCRIPTOR.name, str(exc) or type(exc).__name__)

    return deserialize


def add_to_server(servicer: "CloudProviderServicer", server: grpc.Server) -> None:
    """Register every CloudProvider method (what the generated `add_CloudProviderServicer_to_server` does), with
    request deserializers that never raise."""
    service = pb.DESCRIPTOR.services_by_name["CloudProvider"]
    handlers = {
        method.name: grpc.unary_unary_rpc_method_handler(
            getattr(servicer, method.name),
            request_deserializer=_lenient(message_factory.GetMessageClass(method.input_type)),
            response_serializer=message_factory.GetMessageClass(method.output_type).SerializeToString)
        for method in service.methods}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    server.add_registered_method_handlers(service.full_name, handlers)


def _rpc(method: Callable[..., Any]) -> Callable[..., Any]:
    """Metrics, a debug line per call, and errors turned into a status with a message.

    CA calls NodeGroupForNode and GetOptions thousands of times a scan, so what every call pays is kept small: the
    method's metric children are bound once here (prometheus' `labels()` takes a lock and builds a key per call)."""
    name = method.__name__
    latency = metrics.GRPC_LATENCY.labels(name)
    errors: dict[grpc.StatusCode, Any] = {}

    @functools.wraps(method)
    def wrapper(self: "CloudProviderServicer", request: Any, context: grpc.ServicerContext) -> Any:
        started = time.perf_counter()
        try:
            if log.isEnabledFor(logging.DEBUG):  # rendering a request of 50,000 nodes is not free
                log.debug("%s(%s)", name, _one_line(request))
            if isinstance(request, UndecodableRequest):
                raise InvalidRequest(f"{name}: the payload is not a valid {request.message_type} protobuf "
                                     f"message: {request.error}")
            return method(self, request, context)
        except Exception as exc:
            code = status_for(exc)
            if code == grpc.StatusCode.INTERNAL:
                log.exception("%s failed unexpectedly", name)
                message = bounded_text(f"{name} failed inside DDS: {type(exc).__name__}: {exc}", MAX_MESSAGE_CHARS)
            else:
                message = bounded_text(str(exc), MAX_MESSAGE_CHARS)
                log.log(logging.DEBUG if code == grpc.StatusCode.UNIMPLEMENTED else logging.WARNING,
                        "%s refused (%s): %s", name, code.name, message)
        finally:
            latency.observe(time.perf_counter() - started)
        counter = errors.get(code)
        if counter is None:
            counter = errors[code] = metrics.GRPC_ERRORS.labels(name, code.name)
        counter.inc()
        context.abort(code, message)

    return wrapper


def _first(items: Iterable[str], limit: int = 20) -> str:
    """A list for a log line: CA may name thousands of placeholder nodes in one call."""
    items = list(items)
    shown = ", ".join(items[:limit])
    return shown if len(items) <= limit else f"{shown} and {len(items) - limit} more"


def _one_line(request: Any) -> str:
    text = " ".join(str(request).split())
    return text if len(text) <= 300 else text[:297] + "..."


def _request_node(node: pb.ExternalGrpcNode) -> RequestNode:
    return RequestNode(name=node.name, provider_id=node.providerID, labels=dict(node.labels),
                       annotations=dict(node.annotations))


def _node_to_look_up(node: pb.ExternalGrpcNode) -> RequestNode:
    """The request's own label and annotation maps, not copies: NodeGroupForNode reads one label and drops the node
    within the call, and copying a node's every label was a third of the call."""
    return RequestNode(name=node.name, provider_id=node.providerID, labels=node.labels, annotations=node.annotations)


# The answer for a node of no group; never mutated (gRPC only serializes what a handler returns).
_NO_GROUP = pb.NodeGroupForNodeResponse(nodeGroup=pb.NodeGroup(id=""))


def _duration(nanos: int) -> duration_pb2.Duration:
    value = duration_pb2.Duration()
    value.FromNanoseconds(nanos)
    return value


def deletion_key(group_id: str, nodes: list[RequestNode]) -> str:
    """The same DeleteNodes call (CA repeats them every loop for placeholders) always gets the same key."""
    names = sorted(f"{n.name}|{n.provider_id}" for n in nodes)
    digest = hashlib.sha256("\n".join([group_id, *names]).encode()).hexdigest()[:16]
    return f"delete/{digest}"


class CloudProviderServicer(pb_grpc.CloudProviderServicer):
    def __init__(self, registry: Registry, scale_up: ScaleUpDecider, scale_down: ScaleDownDecider, gpu_label: str,
                 new_request_key: Optional[Callable[[], str]] = None) -> None:
        self.registry = registry
        self.scale_up = scale_up
        self.scale_down = scale_down
        self.gpu_model_label = gpu_label
        self._new_request_key = new_request_key or (lambda: f"increase/{uuid.uuid4().hex[:16]}")
        self._template_names = itertools.count()
        self._companion_answers = _CompanionAnswers()

    # --- groups and membership ---
    @_rpc
    def Refresh(self, request: pb.RefreshRequest, context: grpc.ServicerContext) -> pb.RefreshResponse:
        try:
            self.registry.refresh()
        except Exception:  # an error here aborts CA's whole loop: log it, answer success with the last good state
            log.exception("refresh failed; serving the last good node groups")
        return pb.RefreshResponse()

    @_rpc
    def NodeGroups(self, request: pb.NodeGroupsRequest, context: grpc.ServicerContext) -> pb.NodeGroupsResponse:
        return pb.NodeGroupsResponse(nodeGroups=[
            _companion_message(v) if isinstance(v, CompanionGroup)
            else pb.NodeGroup(id=v.spec.id, minSize=v.min_size, maxSize=v.max_size, debug=v.debug())
            for v in self.registry.views()])

    @_rpc
    def NodeGroupForNode(self, request: pb.NodeGroupForNodeRequest,
                         context: grpc.ServicerContext) -> pb.NodeGroupForNodeResponse:
        if not request.HasField("node"):
            raise InvalidRequest("NodeGroupForNode: node is missing")
        group = self.registry.group_for_node(_node_to_look_up(request.node))
        if group is None:
            return _NO_GROUP
        if isinstance(group, CompanionGroup):
            return self._companion_answers.for_node(group)
        view = self.registry.view(group)
        return pb.NodeGroupForNodeResponse(nodeGroup=pb.NodeGroup(
            id=group.id, minSize=view.min_size, maxSize=view.max_size, debug=view.debug()))

    @_rpc
    def GPULabel(self, request: pb.GPULabelRequest, context: grpc.ServicerContext) -> pb.GPULabelResponse:
        # Not the model label pods select on: a label DDS keeps true, present only while a node has GPUs (CA counts a
        # node with its GPU label and no GPU as unready, and fails scale-ups over it: dds/planner/labels.py).
        return pb.GPULabelResponse(label=LABEL_ATTACHED_GPU)

    @_rpc
    def GetAvailableGPUTypes(self, request: pb.GetAvailableGPUTypesRequest,
                             context: grpc.ServicerContext) -> pb.GetAvailableGPUTypesResponse:
        models = sorted({model for group in self.registry.groups() for model in group.gpu_models})
        return pb.GetAvailableGPUTypesResponse(gpuTypes={model: any_pb2.Any() for model in models})

    # --- sizes and instances ---
    @_rpc
    def NodeGroupTargetSize(self, request: pb.NodeGroupTargetSizeRequest,
                            context: grpc.ServicerContext) -> pb.NodeGroupTargetSizeResponse:
        companion = self.registry.companion(request.id)
        if companion is not None:
            return pb.NodeGroupTargetSizeResponse(targetSize=companion.size)
        group = self.registry.require(request.id)
        return pb.NodeGroupTargetSizeResponse(targetSize=self.registry.view(group).target_size)

    @_rpc
    def NodeGroupIncreaseSize(self, request: pb.NodeGroupIncreaseSizeRequest,
                              context: grpc.ServicerContext) -> pb.NodeGroupIncreaseSizeResponse:
        companion = self.registry.companion(request.id)
        if companion is not None:
            raise companion_refusal(companion, f"size increase by {request.delta} of")
        group = self.registry.require(request.id)
        key = self._new_request_key()
        with self.registry.scale_lock:
            before = self.registry.check_increase(group, request.delta)
            records = list(self.scale_up.increase(group, request.delta, key))
        if records and len(records) != request.delta:  # none: nothing to add (ca_requests.py says why)
            log.warning("scale-up of %s (request %s): asked for %d unit(s), %d instance(s) recorded",
                        group.id, key, request.delta, len(records))
        log.info("scale-up of %s by %d (target %d -> %d, request %s): %s", group.id, request.delta,
                 before.target_size, self.registry.view(group).target_size, key, _reasons(records))
        return pb.NodeGroupIncreaseSizeResponse()

    @_rpc
    def NodeGroupDeleteNodes(self, request: pb.NodeGroupDeleteNodesRequest,
                             context: grpc.ServicerContext) -> pb.NodeGroupDeleteNodesResponse:
        companion = self.registry.companion(request.id)
        if companion is not None:
            raise companion_refusal(companion, f"deleting {_first(_request_node(n).describe() for n in request.nodes)}"
                                               " from")
        group = self.registry.require(request.id)
        nodes = [_request_node(n) for n in request.nodes]
        targets = self.registry.resolve_deletions(group, nodes)
        key = deletion_key(group.id, nodes)
        self.scale_down.delete_nodes(group, targets, key)
        placeholders = sum(1 for t in targets if isinstance(t, Placeholder))
        log.info("delete nodes of %s (request %s): %d live node(s) handed to the scale-down decider, %d "
                 "placeholder(s) of abandoned instances dropped: %s", group.id, key, len(targets) - placeholders,
                 placeholders, _first(n.describe() for n in nodes))
        return pb.NodeGroupDeleteNodesResponse()

    @_rpc
    def NodeGroupDecreaseTargetSize(self, request: pb.NodeGroupDecreaseTargetSizeRequest,
                                    context: grpc.ServicerContext) -> pb.NodeGroupDecreaseTargetSizeResponse:
        companion = self.registry.companion(request.id)
        if companion is not None:
            raise companion_refusal(companion, f"target size decrease by {-request.delta} of")
        group = self.registry.require(request.id)
        with self.registry.scale_lock:
            removed = self.registry.decrease_target(group, request.delta)
        log.info("target size of %s decreased by %d: forgot instance(s) %s (work already started may still "
                 "complete)", group.id, -request.delta, ", ".join(r.id for r in removed))
        return pb.NodeGroupDecreaseTargetSizeResponse()

    @_rpc
    def NodeGroupNodes(self, request: pb.NodeGroupNodesRequest,
                       context: grpc.ServicerContext) -> pb.NodeGroupNodesResponse:
        companion = self.registry.companion(request.id)
        if companion is not None:
            return pb.NodeGroupNodesResponse(instances=_running(companion.provider_ids()))
        group = self.registry.require(request.id)
        instances = [_instance(r) for r in self.registry.instances(group)]
        if group.template_mode == TemplateMode.OBSERVED:
            instances += _running(n.provider_id for n in self.registry.live_nodes(group) if n.provider_id)
        return pb.NodeGroupNodesResponse(instances=instances)

    # --- optional RPCs ---
    @_rpc
    def NodeGroupTemplateNodeInfo(self, request: pb.NodeGroupTemplateNodeInfoRequest,
                                  context: grpc.ServicerContext) -> pb.NodeGroupTemplateNodeInfoResponse:
        companion = self.registry.companion(request.id)
        # CA asks a companion only when none of its nodes is ready to copy; it never scales it up, so G's own template
        # (every GPU slot filled) is as good an answer as any and keeps one shape per group.
        group = companion.group if companion is not None else self.registry.require(request.id)
        node = build_template_node(group, self.gpu_model_label, next(self._template_names))
        response = pb.NodeGroupTemplateNodeInfoResponse(nodeBytes=node.SerializeToString(deterministic=True))
        response.nodeInfo.CopyFrom(node)  # the same Node for 1.34.0/1.34.1, which read only field 1
        return response

    @_rpc
    def NodeGroupGetOptions(self, request: pb.NodeGroupAutoscalingOptionsRequest,
                            context: grpc.ServicerContext) -> pb.NodeGroupAutoscalingOptionsResponse:
        companion = self.registry.companion(request.id)
        if companion is not None:
            # CA's own defaults, in full: echoing the request's would set MaxNodeStartupTime to 0 (externalgrpc's
            # options carry no such field), and CA would count a companion node that is not ready yet as unready at
            # once. G's overrides do not matter: CA never scales a companion down (its size is its min size).
            raise NotProvided(f"{companion.id} has no options of its own: cluster-autoscaler's defaults apply")
        group = self.registry.require(request.id)
        if not request.HasField("defaults"):
            raise InvalidRequest(f"options of {group.id}: the request carries no defaults to apply overrides to")
        return pb.NodeGroupAutoscalingOptionsResponse(nodeGroupAutoscalingOptions=group_options(group, request.defaults))

    @_rpc
    def PricingNodePrice(self, request: pb.PricingNodePriceRequest,
                         context: grpc.ServicerContext) -> pb.PricingNodePriceResponse:
        raise NotProvided("DDS has no pricing model: node prices are not provided")

    @_rpc
    def PricingPodPrice(self, request: pb.PricingPodPriceRequest,
                        context: grpc.ServicerContext) -> pb.PricingPodPriceResponse:
        raise NotProvided("DDS has no pricing model: pod prices are not provided")

    @_rpc
    def Cleanup(self, request: pb.CleanupRequest, context: grpc.ServicerContext) -> pb.CleanupResponse:
        log.info("cluster-autoscaler is shutting down (Cleanup)")
        self.registry.tracker.flush()
        return pb.CleanupResponse()


def _companion_message(companion: CompanionGroup) -> pb.NodeGroup:
    return pb.NodeGroup(id=companion.id, minSize=companion.size, maxSize=companion.size, debug=companion.debug())


class _CompanionAnswers:
    """NodeGroupForNode's answer for a companion's node, built once per companion: the membership index makes a new
    `CompanionGroup` only when the live nodes or the groups change, and CA asks about every node on every scan.
    One dict store per miss, so threads need no lock (a race builds an equal answer twice)."""

    def __init__(self) -> None:
        self._built: dict[str, tuple[CompanionGroup, pb.NodeGroupForNodeResponse]] = {}

    def for_node(self, companion: CompanionGroup) -> pb.NodeGroupForNodeResponse:
        built = self._built.get(companion.id)
        if built is not None and built[0] is companion:
            return built[1]
        answer = pb.NodeGroupForNodeResponse(nodeGroup=_companion_message(companion))
        self._built[companion.id] = (companion, answer)
        return answer


def _running(provider_ids: Iterable[str]) -> list[pb.Instance]:
    return [pb.Instance(id=provider_id, status=pb.InstanceStatus(instanceState=pb.InstanceStatus.instanceRunning))
            for provider_id in provider_ids]


def _instance(record: InstanceRecord) -> pb.Instance:
    status = pb.InstanceStatus(instanceState=_STATE[record.state])
    if record.failed:
        status.errorInfo.CopyFrom(pb.InstanceErrorInfo(errorCode=record.error_code, errorMessage=record.error_message,
                                                       instanceErrorClass=record.error_class))
    return pb.Instance(id=record.id, status=status)


def _reasons(records: list[InstanceRecord]) -> str:
    described = sorted({f"{r.kind.value}: {r.reason}" for r in records})
    return "; ".join(described) or "no instance recorded"


def group_options(group: NodeGroupSpec, defaults: pb.NodeGroupAutoscalingOptions) -> pb.NodeGroupAutoscalingOptions:
    """CA's defaults with the group's overrides. The answer replaces CA's defaults entirely, so everything is echoed;
    each duration is written to both its current field and its legacy twin (1.34.x dereferences the legacy one)."""
    overrides = group.options
    options = pb.NodeGroupAutoscalingOptions()
    options.CopyFrom(defaults)
    if overrides.scale_down_utilization_threshold is not None:
        options.scaleDownUtilizationThreshold = overrides.scale_down_utilization_threshold
    if overrides.scale_down_gpu_utilization_threshold is not None:
        options.scaleDownGpuUtilizationThreshold = overrides.scale_down_gpu_utilization_threshold
    if overrides.zero_or_max_node_scaling is not None:
        options.zeroOrMaxNodeScaling = overrides.zero_or_max_node_scaling
    if overrides.ignore_daemonsets_utilization is not None:
        options.ignoreDaemonSetsUtilization = overrides.ignore_daemonsets_utilization
    for current, legacy, override in (
            ("scaleDownUnneededDuration", "scaleDownUnneededTime", overrides.scale_down_unneeded_seconds),
            ("scaleDownUnreadyDuration", "scaleDownUnreadyTime", overrides.scale_down_unready_seconds),
            ("MaxNodeProvisionDuration", "MaxNodeProvisionTime", overrides.max_node_provision_seconds)):
        nanos = int(round(override * _NANOS)) if override is not None else _default_nanos(defaults, current, legacy)
        if not _GO_DURATION_MIN <= nanos <= _GO_DURATION_MAX:
            where = f"defaults.{current}" if override is None else f"the group's override of {current}"
            raise InvalidRequest(f"options of {group.id}: {where} = {nanos / _NANOS:.6g}s is out of range: a Go "
                                 "time.Duration (and the legacy field) holds at most about 292 years")
        getattr(options, current).CopyFrom(_duration(nanos))
        getattr(options, legacy).duration = nanos
    return options


def _default_nanos(defaults: pb.NodeGroupAutoscalingOptions, current: str, legacy: str) -> int:
    """In integer nanoseconds: CA's values are Go time.Durations, which a float round trip would not keep exact."""
    if defaults.HasField(current):
        return getattr(defaults, current).ToNanoseconds()
    if defaults.HasField(legacy):
        return getattr(defaults, legacy).duration
    return 0
