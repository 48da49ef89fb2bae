"""Every Prometheus metric DDS exports, defined once (prometheus-client idiom: module level, base units, `_total`).

Served on `/metrics` by dds/ops/http.py. Label values are bounded: group ids, pool names, models, RPC method names,
case and outcome enums — and node names for `dds_node_gpus`, one series per node (and GPU model on it), as
kube-state-metrics has per node; a node's series go when the node does (dds/controller/gpu_gauges.py).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
# Most of CA's calls (NodeGroupForNode, GetOptions: thousands a scan) are answered in microseconds: the finer buckets
# show them, and the tail of calls that waited for the interpreter or a core.
_RPC_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005) + _LATENCY_BUCKETS
_FABRIC_BUCKETS = (1, 2.5, 5, 10, 20, 30, 45, 60, 90, 120, 300, 600)

DECISIONS = Counter("dds_decisions_total", "Scaling decisions by case and outcome (gpu, node, mixed, none, error)",
                    ["case", "outcome"])
GPUS_ATTACHED = Counter("dds_gpus_attached_total", "GPUs attached to nodes", ["pool", "model"])
GPUS_DETACHED = Counter("dds_gpus_detached_total", "GPUs detached from nodes", ["pool", "model"])
# CXL memory chunks apart from the GPUs (docs/cxl-memory.md): the model names the chunk's size (cxl-memory-16Gi), so
# bytes are the count times that size.
CXL_CHUNKS_ATTACHED = Counter("dds_cxl_memory_chunks_attached_total", "CXL memory chunks attached to nodes (the model "
                              "names the chunk's size)", ["pool", "model"])
CXL_CHUNKS_DETACHED = Counter("dds_cxl_memory_chunks_detached_total", "CXL memory chunks detached from nodes (the "
                              "model names the chunk's size)", ["pool", "model"])
FABRIC_ERRORS = Counter("dds_fabric_errors_total", "Fabric operations that failed, by kind and error code",
                        ["backend", "kind", "code"])
OPERATOR_WEBHOOK_REFUSALS = Counter("dds_operator_webhook_refusals_total", "Writes of DDS's ComposabilityRequests "
                                    "the CDI operator's webhook refused because of another writer's request for the "
                                    "same node, type and model", ["other_request"])
UNHELD_DEVICES = Gauge("dds_unheld_devices", "GPUs nodes show beyond the fabric's records of devices on them, past "
                       "the grace: attached devices no ComposableResource holds")
ATTACH_LATENCY = Histogram("dds_attach_duration_seconds", "From attach request to the GPU visible on the node",
                           ["backend"], buckets=_FABRIC_BUCKETS)
DETACH_LATENCY = Histogram("dds_detach_duration_seconds", "From detach request to the GPU back in the pool",
                           ["backend"], buckets=_FABRIC_BUCKETS)
POOL_DEVICES = Gauge("dds_pool_devices", "Devices per pool, model and state (free, used)", ["pool", "model", "state"])
NODE_GPUS = Gauge("dds_node_gpus", "Fabric GPUs attached to each node, by its node group (empty: none) and model, as "
                  "the last control loop pass saw them", ["node", "group", "model"])
GPUS_IDLE_PAST_COOLDOWN = Gauge("dds_gpus_idle_past_cooldown",
                                "Idle GPUs past their group's GPU idle cooldown and not kept as warm headroom (nor "
                                "reserved): the ones the last control loop pass decided to detach", ["group"])
NODES_ADDED = Counter("dds_nodes_added_total", "Nodes requested through the node backend", ["group"])
NODES_REMOVED = Counter("dds_nodes_removed_total", "Nodes removed through the node backend", ["group"])
PLAN_LATENCY = Histogram("dds_plan_duration_seconds", "Time to compute a plan", ["kind"], buckets=_LATENCY_BUCKETS)
PENDING_PODS = Gauge("dds_pending_pods_considered", "Pending pods considered by the last scale-up plan")
GRPC_LATENCY = Histogram("dds_grpc_request_duration_seconds", "CloudProvider RPC latency", ["method"],
                         buckets=_RPC_BUCKETS)
GRPC_ERRORS = Counter("dds_grpc_request_errors_total", "CloudProvider RPCs answered with an error status",
                      ["method", "code"])
NODE_GROUP_CONFIG_ERRORS = Counter("dds_node_group_config_errors_total",
                                   "Node group definitions rejected: malformed, an unknown key, or asking for more "
                                   "than the namespace is granted (reason)", ["source", "reason"])
MACHINE_CLAIMS_REFUSED = Counter("dds_machine_node_claims_refused_total",
                                 "Machines whose status.nodeRef names a Node another Machine had first: not counted "
                                 "in their group (a copied spec.providerID)")
NODE_GROUPS = Gauge("dds_node_groups", "Node groups served to cluster-autoscaler")
INSTANCES = Gauge("dds_inflight_instances", "In-flight instances reported to CA, by group, kind and state",
                  ["group", "kind", "state"])
IS_LEADER = Gauge("dds_leader", "1 when this replica holds the leader lease")
REDFISH_TLS_UNVERIFIED = Gauge("dds_redfish_tls_unverified",
                               "1 when DDS sends its Redfish credentials without verifying who the service is "
                               "(verify_tls: false, or an http:// endpoint)")
EVENTS_DROPPED = Counter("dds_events_dropped_total",
                         "Kubernetes Events not written: queue_full (recorder backlog) or api_error (apiserver refused)",
                         ["reason"])
LEADER_TRANSITIONS = Counter("dds_leader_transitions_total",
                             "Times this replica started (started) or stopped (stopped) leading", ["transition"])
ORPHANS_RECLAIMED = Counter("dds_orphaned_gpus_reclaimed_total",
                            "Devices force-detached because their node was gone or their attach never ended "
                            "(orphan_attach_timeout_seconds)")
GPUS_STRANDED = Counter("dds_gpus_stranded_total",
                        "Devices still attached when a deleting Machine's pre-terminate hook was released after "
                        "pre_terminate_detach_timeout_seconds (dds/controller/machine_hooks.py); devices of a failed "
                        "attach left in their ComposabilityRequest because the CDI operator had not taken them up "
                        "operator_wait_bound_seconds after the attach ended (dds/fabric/composability.py)")
LOOP_LATENCY = Histogram("dds_control_loop_duration_seconds", "One pass of the control loop (observe, plan, act), "
                         "less the time it waited for cluster-autoscaler's calls",
                         buckets=(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 1.5, 2, 3,
                                  5, 10))
LOOP_WAITED = Counter("dds_control_loop_waited_for_calls_seconds_total",
                      "Time the control loop waited for cluster-autoscaler's calls under way before its steps")
OBJECTS_REFUSED = Counter("dds_objects_refused_total",
                          "Objects DDS refused: pods it cannot help (told in an Event, once per pod and reason) and "
                          "objects it cannot read (left out or refused, the rest planned), by kind and reason",
                          ["kind", "reason"])
APISERVER_REQUESTS = Counter("dds_apiserver_requests_total", "Requests DDS sent to the kube-apiserver, by verb (LIST "
                             "and WATCH are GETs of a collection)", ["verb"])
CERTIFICATE_EXPIRY = Gauge("dds_certificate_expiry_seconds",
                           "Unix time at which the soonest certificate of each file DDS serves with or trusts expires "
                           "(notAfter): server (tls_cert), client_ca (tls_ca), read at each scrape, so a renewed Secret "
                           "shows at once (NaN: the file could not be read); client: the soonest of the newest "
                           "certificate each allowed caller presented (cluster-autoscaler reads its own once at start)",
                           ["certificate"])
