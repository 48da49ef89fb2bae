#!/usr/bin/env python3
"""Generates DDS's Grafana dashboard (charts/dds/files/dashboard.json) with grafana-foundation-sdk's builders.

    .venv/bin/python hack/gen-dashboard.py           # rewrite the checked-in JSON
    .venv/bin/python hack/gen-dashboard.py --check   # exit 1 if the checked-in JSON is not this script's output

The chart ships the JSON as a ConfigMap labelled grafana_dashboard: "1" (dashboard.enabled) for Grafana's sidecar.
Every query names only metrics of dds/metrics.py, except the "cluster-autoscaler's view" row (CA's own metrics),
and every selector is narrowed to the dashboard's cluster and namespace variables.
tests/integration/chart/test_monitoring.py parses each query with promtool, checks its DDS metric names against a live
DDS's /metrics, its CA metric names against the pinned cluster-autoscaler, its selectors' scope, and that this output
equals the checked-in file.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from grafana_foundation_sdk.builders import prometheus, timeseries
from grafana_foundation_sdk.builders.common import StackingConfig, VizLegendOptions
from grafana_foundation_sdk.builders.dashboard import Dashboard, DatasourceVariable, QueryVariable, Row
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import LegendDisplayMode, LegendPlacement, StackingMode
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh, VariableSort
from generated_file import write_or_check  # hack/, beside this script

OUTPUT = Path(__file__).resolve().parents[1] / "charts" / "dds" / "files" / "dashboard.json"
UID = "dds-overview"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"
# cluster-autoscaler's metrics the "cluster-autoscaler's view" row reads (cluster-autoscaler 1.36.1, metrics/metrics.go:
# namespace cluster_autoscaler; labels reason, type).
CA_SCALED_UP = "cluster_autoscaler_scaled_up_nodes_total"
CA_FAILED_SCALE_UPS = "cluster_autoscaler_failed_scale_ups_total"
CA_UNSCHEDULABLE_PODS = "cluster_autoscaler_unschedulable_pods_count"
# Every selector of every query is narrowed to the cluster and namespace (release) variables, as kube-prometheus-stack's
# dashboards are: one Prometheus may hold several clusters and several DDS releases. ".*" (All) also matches series
# without the label (a Prometheus of one cluster has no `cluster` label).
SCOPE = 'cluster=~"$cluster", namespace=~"$namespace"'
USED = 'state="used"'
CXL = 'model=~"cxl-memory-.*"'  # CXL memory chunks: devices whose model names their size (dds/model/cxl.py)
NOT_CXL = 'model!~"cxl-memory-.*"'


def m(metric: str, matchers: str = "") -> str:
    """A metric's selector narrowed to the dashboard's cluster and namespace."""
    return f"{metric}{{{SCOPE}{', ' + matchers if matchers else ''}}}"


def scope_variable(name: str, label: str, query: str) -> QueryVariable:
    return (QueryVariable(name).label(label).datasource(DATASOURCE).query(query)
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC)
            .include_all(True).all_value(".*").multi(True))


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


def panel(title: str, description: str, unit: str, queries: list[Query], stacked: bool = False,
          width: int = 12) -> timeseries.Panel:
    built = (timeseries.Panel().title(title).description(description).unit(unit).datasource(DATASOURCE)
             .span(width).height(8).min(0)
             .legend(VizLegendOptions().display_mode(LegendDisplayMode.TABLE).placement(LegendPlacement.BOTTOM)
                     .show_legend(True).calcs(["lastNotNull", "max"])))
    if stacked:
        built = built.stacking(StackingConfig().mode(StackingMode.NORMAL)).fill_opacity(30)
    for ref, query in zip("ABCDEFGH", queries):
        built = built.with_target(prometheus.Dataquery().expr(query.expr).legend_format(query.legend).ref_id(ref)
                                  .datasource(DATASOURCE))
    return built


def quantiles(metric: str, by: str, legend: str) -> list[Query]:
    return [Query(f"histogram_quantile({q}, sum by (le{by}) (rate({m(metric + '_bucket')}[{RATE}])))",
                  f"p{int(q * 100)}{legend}") for q in (0.5, 0.95, 0.99)]


def build() -> Dashboard:
    return (
        Dashboard("DDS: Dynamic Device Scaling")
        .uid(UID)
        .tags(["dds", "gpu", "autoscaling"])
        .description("GPUs attached to live nodes (the GPU path) and nodes added (the node path) by DDS, the "
                     "cluster-autoscaler externalgrpc cloud provider. Metrics: dds/metrics.py.")
        .refresh("30s")
        .time("now-3h", "now")
        .timezone("browser")
        .with_variable(DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
        .with_variable(scope_variable("cluster", "Cluster", "label_values(dds_leader, cluster)"))
        .with_variable(scope_variable("namespace", "Namespace", 'label_values(dds_leader{cluster=~"$cluster"}, '
                                      'namespace)'))
        .with_row(Row("GPUs"))
        .with_panel(panel(
            "Pool devices by state and model", "Fabric pool devices, free (in the pool) and used (attached to a "
            "node), per pool and model.", "short",
            [Query(f"sum by (pool, model, state) ({m('dds_pool_devices')})", "{{pool}} {{model}} {{state}}")],
            stacked=True))
        .with_panel(panel(
            "GPUs per node", "Fabric GPUs attached to each node (dds_node_gpus: one series per node and model, as "
            "the last control loop pass saw them; a node's line ends when the node is gone).", "short",
            [Query(f"sum by (node) ({m('dds_node_gpus')})", "{{node}}")], stacked=True))
        .with_panel(panel(
            "Idle GPUs past the cooldown", "Idle GPUs past their group's GPU idle cooldown that DDS decided to "
            "release (warm headroom and reserved nodes left out). A healthy loop releases them in the same pass; "
            "a value that stays up fires DDSGPUsIdleLongPastCooldown.", "short",
            [Query(f"sum by (group) ({m('dds_gpus_idle_past_cooldown')})", "{{group}}")]))
        .with_panel(panel(
            "GPUs on nodes by model", "GPUs attached to nodes (the pools' used devices but CXL memory) per model, "
            "and the attach and detach rates.", "short",
            [Query(f"sum by (model) ({m('dds_pool_devices', USED + ', ' + NOT_CXL)})", "{{model}} on nodes"),
             Query(f"sum by (model) (rate({m('dds_gpus_attached_total')}[{RATE}])) * 60", "{{model}} attached / min"),
             Query(f"sum by (model) (rate({m('dds_gpus_detached_total')}[{RATE}])) * 60", "{{model}} detached / min")]))
        .with_panel(panel(
            "CXL memory chunks on nodes", "CXL memory chunks attached to nodes (the pools' used cxl-memory-<size> "
            "devices; the model names a chunk's size), and the chunks attached and detached per minute "
            "(docs/cxl-memory.md).", "short",
            [Query(f"sum by (model) ({m('dds_pool_devices', USED + ', ' + CXL)})", "{{model}} on nodes"),
             Query(f"sum by (model) (rate({m('dds_cxl_memory_chunks_attached_total')}[{RATE}])) * 60",
                   "{{model}} attached / min"),
             Query(f"sum by (model) (rate({m('dds_cxl_memory_chunks_detached_total')}[{RATE}])) * 60",
                   "{{model}} detached / min")]))
        .with_panel(panel(
            "Attach latency", "From attach request to the GPU visible on the node, per fabric backend.", "s",
            quantiles("dds_attach_duration_seconds", ", backend", " {{backend}}")))
        .with_panel(panel(
            "Detach latency", "From detach request to the GPU back in the pool, per fabric backend.", "s",
            quantiles("dds_detach_duration_seconds", ", backend", " {{backend}}")))
        .with_row(Row("Decisions"))
        .with_panel(panel(
            "Decisions by case and outcome", "What DDS decided per interval: the case (CA's scale-up or "
            "scale-down, the fast path, warm headroom, repair, ...) and its outcome (gpu, node, move, none, error).",
            "short", [Query(f"sum by (case, outcome) (increase({m('dds_decisions_total')}[{RATE}]))",
                            "{{case}} {{outcome}}")], stacked=True))
        .with_panel(panel(
            "Pending pods considered", "Pending pods the last plan considered, and nodes added and removed "
            "through the node backend per minute.", "short",
            [Query(f"max({m('dds_pending_pods_considered')})", "pending pods"),
             Query(f"sum(rate({m('dds_nodes_added_total')}[{RATE}])) * 60", "nodes added / min"),
             Query(f"sum(rate({m('dds_nodes_removed_total')}[{RATE}])) * 60", "nodes removed / min")]))
        .with_row(Row("cluster-autoscaler and the control loop"))
        .with_panel(panel(
            "cluster-autoscaler call latency (p99)", "How long DDS took to answer each CloudProvider RPC "
            "cluster-autoscaler made; its grpc_timeout (10s by default) is the deadline.", "s",
            [Query(f"histogram_quantile(0.99, sum by (le, method) "
                   f"(rate({m('dds_grpc_request_duration_seconds_bucket')}[{RATE}])))", "{{method}}")]))
        .with_panel(panel(
            "cluster-autoscaler call errors", "RPCs answered with an error status, by method and code "
            "(UNIMPLEMENTED answers the optional pricing calls by design).", "reqps",
            [Query(f"sum by (method, code) (rate({m('dds_grpc_request_errors_total')}[{RATE}]))",
                   "{{method}} {{code}}")]))
        .with_panel(panel(
            "Control loop duration", "One pass of the control loop (observe, plan, act), less the time it waited "
            "for cluster-autoscaler's calls.", "s", quantiles("dds_control_loop_duration_seconds", "", "")))
        .with_panel(panel(
            "Leader and fabric errors", "Which replica leads (1), and fabric operations that failed per minute.",
            "short",
            [Query(f"sum by (namespace, instance) ({m('dds_leader')})", "leader {{namespace}} {{instance}}"),
             Query(f"sum by (kind, code) (rate({m('dds_fabric_errors_total')}[{RATE}])) * 60",
                   "{{kind}} {{code}} / min")]))
        # cluster-autoscaler's own metrics (its metrics/metrics.go), scraped by the chart's ServiceMonitor
        # cluster-autoscaler: what CA saw and did with what DDS answered.
        .with_row(Row("cluster-autoscaler's view"))
        .with_panel(panel(
            "cluster-autoscaler scale-ups", "Nodes cluster-autoscaler added through DDS (each IncreaseSize DDS "
            "served, by a GPU attach or a new node) and its failed scale-ups by reason, per minute.", "short",
            [Query(f"sum(rate({m(CA_SCALED_UP)}[{RATE}])) * 60", "nodes added / min"),
             Query(f"sum by (reason) (rate({m(CA_FAILED_SCALE_UPS)}[{RATE}])) * 60", "failed: {{reason}} / min")]))
        .with_panel(panel(
            "cluster-autoscaler unschedulable pods", "Pods cluster-autoscaler found unschedulable (its scale-up "
            "input) and pods the scheduler has not processed yet.", "short",
            [Query(f"sum by (type) ({m(CA_UNSCHEDULABLE_PODS)})", "{{type}}")], stacked=True))
    )


def render() -> str:
    return json.dumps(build().build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the checked-in JSON instead of writing it")
    args = parser.parse_args()
    return write_or_check(OUTPUT, render(), args.check, "make dashboard")


if __name__ == "__main__":
    sys.exit(main())
