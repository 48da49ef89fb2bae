"""The alerts and the Grafana dashboard, checked by the real tools: `promtool check rules` and `promtool test rules`
(promtool built from its Go module by hack/build-tools.sh) with a unit test per alert, every PromQL expression of the
rules and the dashboard parsed by promtool, and every metric they name served by a live DDS's /metrics."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from dds.app import App, build_app
from dds.config import FabricBackend, NodeBackend, Settings
from harness import rbac
from harness.versions import active_profile
from tests.integration.chart.tools import CHART, DASHBOARD, ROOT, RULES, helm_template, run

ALERT_TESTS = Path(__file__).with_name("alerts_test.yaml")
OPERATIONS = ROOT / "docs" / "operations.md"
# Grafana's interval variables are not PromQL; promtool parses the query with a duration in their place.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}
# The dashboard's "cluster-autoscaler's view" row reads CA's own metrics (its metrics/metrics.go namespace).
CA_PREFIX = "cluster_autoscaler_"
# The matchers every selector of every dashboard query carries: the cluster and namespace variables.
SCOPE = ('cluster=~"$cluster"', 'namespace=~"$namespace"')


def alerts() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"] if "alert" in rule]


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


def as_promql(grafana_query: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        grafana_query = grafana_query.replace(variable, value)
    return grafana_query


# --- the rules ---

def test_promtool_accepts_the_rule_file() -> None:
    result = run("promtool", "check", "rules", str(RULES))
    assert f"SUCCESS: {len(alerts())} rules found" in result.stdout, result.stdout


def test_every_alert_passes_its_unit_tests() -> None:
    result = run("promtool", "test", "rules", str(ALERT_TESTS))
    assert "SUCCESS" in result.stdout, result.stdout


def test_every_alert_has_a_firing_and_a_quiet_unit_test() -> None:
    cases: dict[str, list[bool]] = {}
    for test in yaml.safe_load(ALERT_TESTS.read_text())["tests"]:
        for case in test.get("alert_rule_test", []):
            cases.setdefault(case["alertname"], []).append(bool(case.get("exp_alerts")))
    for alert in alerts():
        name = alert["alert"]
        assert True in cases.get(name, []), f"{name}: no unit test where it fires ({ALERT_TESTS.name})"
        assert False in cases.get(name, []), f"{name}: no unit test where it stays quiet ({ALERT_TESTS.name})"


def anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+\s+(.+?)\s*$", markdown, flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading).strip().lower().replace(" ", "-") for heading in headings}


# The runbooks are docs/operations.md where the chart says the project is (Chart.yaml home).
RUNBOOKS = yaml.safe_load((CHART / "Chart.yaml").read_text())["home"] + "/blob/main/docs/operations.md"


def test_every_alert_links_its_runbook_section_of_the_operations_guide() -> None:
    sections = anchors(OPERATIONS.read_text())
    for alert in alerts():
        page, _, anchor = alert["annotations"]["runbook_url"].partition("#")
        assert page == RUNBOOKS and anchor == alert["alert"].lower(), alert["annotations"]["runbook_url"]
        assert anchor in sections, f"{alert['alert']}: docs/operations.md has no section #{anchor}"


def test_every_aggregation_of_the_alerts_keeps_cluster_and_namespace() -> None:
    """kube-prometheus-stack's rules and dashboards select by cluster and namespace: an alert that aggregates them
    away cannot say which release (or cluster) it is about."""
    for alert in alerts():
        groupings = re.findall(r"\b(by|without)\s*\(([^)]*)\)", alert["expr"])
        assert groupings, f"{alert['alert']}: no aggregation keeps a release apart from another"
        for keyword, labels in groupings:
            kept = {label.strip() for label in labels.split(",")}
            assert keyword == "by" and {"cluster", "namespace"} <= kept, f"{alert['alert']}: {keyword} ({labels})"


def prometheus_rule(values: dict[str, str]) -> dict[str, Any]:
    [rule] = [o for o in helm_template({"fabric.backend": "simulated", "prometheusRule.enabled": "true", **values})
              if o["kind"] == "PrometheusRule"]
    return rule


def test_the_chart_ships_the_rule_file_as_a_prometheus_rule() -> None:
    assert prometheus_rule({})["spec"] == yaml.safe_load(RULES.read_text())


def test_a_runbook_base_url_links_each_alert_to_its_section() -> None:
    base = "https://git.example.com/dds/blob/main/docs/operations.md"
    rule = prometheus_rule({"prometheusRule.runbookBaseUrl": base})
    urls = {r["alert"]: r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert urls == {a["alert"]: f"{base}#{a['alert'].lower()}" for a in alerts()}


def rules_by_name(rule: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}


def test_an_alert_can_be_disabled_relabelled_or_given_another_pending_time() -> None:
    rendered = rules_by_name(prometheus_rule({
        "prometheusRule.alerts.DDSOrphanedGPUsReclaimed.enabled": "false",
        "prometheusRule.alerts.DDSAttachesFailing.labels.severity": "critical",
        "prometheusRule.alerts.DDSAttachesFailing.for": "1m",
        "prometheusRule.additionalRuleLabels.team": "gpu-platform"}))
    shipped = {a["alert"]: a for a in alerts()}
    assert set(rendered) == set(shipped) - {"DDSOrphanedGPUsReclaimed"}
    assert rendered["DDSAttachesFailing"]["labels"] == {"severity": "critical", "team": "gpu-platform"}
    assert rendered["DDSAttachesFailing"]["for"] == "1m"
    assert rendered["DDSNoLeader"]["labels"] == {"severity": "critical", "team": "gpu-platform"}
    assert rendered["DDSNoLeader"]["for"] == shipped["DDSNoLeader"]["for"]
    assert all(rendered[name]["expr"] == shipped[name]["expr"] for name in rendered)


@pytest.mark.parametrize("value, refused", [
    ("prometheusRule.alerts.DDSNoleader.enabled=false", "additional properties 'DDSNoleader' not allowed"),
    ("prometheusRule.alerts.DDSNoLeader.for=ten minutes", "/prometheusRule/alerts/DDSNoLeader/for"),
])
def test_an_override_of_an_alert_that_does_not_exist_or_a_bad_duration_is_refused(value: str, refused: str) -> None:
    key, _, setting = value.partition("=")
    result = helm_template({"fabric.backend": "simulated", "prometheusRule.enabled": "true", key: setting},
                           check=False)
    assert result.returncode != 0 and refused in result.stderr, result.stderr


# --- the scrape objects ---

def scrape_objects(values: dict[str, str]) -> dict[tuple[str, str], dict[str, Any]]:
    objects = helm_template({"fabric.backend": "simulated", "serviceMonitor.enabled": "true", **values})
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def test_the_service_monitor_scrapes_every_replica_with_the_prometheus_service_accounts_own_token() -> None:
    objects = scrape_objects({"serviceMonitor.scrapeClass": "sa-token"})
    monitor = objects[("ServiceMonitor", "dds")]
    [service] = [o for (kind, _), o in objects.items() if kind == "Service"
                 and selects(monitor["spec"]["selector"]["matchLabels"], o["metadata"]["labels"])]
    pods = objects[("Deployment", "dds")]["spec"]["template"]["metadata"]["labels"]
    # Every replica: the Service selects the pods without the leader label the gRPC Service selects by.
    assert selects(service["spec"]["selector"], pods) and "dds.cdi.dev/leader" not in service["spec"]["selector"]
    assert service["metadata"]["name"] == "dds-metrics" and service["spec"]["clusterIP"] == "None"
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["scheme"] == "https" and endpoint["tlsConfig"]["serverName"] == "dds.dds-system.svc"
    # The token is the scrape class's (the Prometheus pod's projected ServiceAccount token), no long-lived one.
    assert monitor["spec"]["scrapeClass"] == "sa-token"
    assert not {"authorization", "bearerTokenSecret", "bearerTokenFile"} & set(endpoint)
    assert not [o for o in objects.values() if o.get("type") == "kubernetes.io/service-account-token"]
    assert "scrapeClass" not in scrape_objects({})[("ServiceMonitor", "dds")]["spec"]  # the default scrape class


def test_cluster_autoscaler_is_scraped_through_its_own_service_and_service_monitor() -> None:
    objects = scrape_objects({"clusterAutoscaler.cloudConfigSecret": "cloud-config"})
    monitor = objects[("ServiceMonitor", "cluster-autoscaler")]
    service = objects[("Service", "cluster-autoscaler-metrics")]
    assert selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    dds_metrics = objects[("Service", "dds-metrics")]
    assert not selects(monitor["spec"]["selector"]["matchLabels"], dds_metrics["metadata"]["labels"])
    pod = objects[("Deployment", "cluster-autoscaler")]["spec"]["template"]
    assert selects(service["spec"]["selector"], pod["metadata"]["labels"])
    [port] = pod["spec"]["containers"][0]["ports"]
    assert (service["spec"]["ports"][0]["targetPort"], service["spec"]["ports"][0]["port"]) == (port["name"],
                                                                                             port["containerPort"])
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    without_ca = scrape_objects({"clusterAutoscaler.enabled": "false"})
    assert ("ServiceMonitor", "cluster-autoscaler") not in without_ca


# --- the dashboard ---

def test_the_checked_in_dashboard_is_the_generators_output() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "hack" / "gen-dashboard.py"), "--check"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_the_chart_ships_the_dashboard_for_grafanas_sidecar() -> None:
    [configmap] = [o for o in helm_template({"fabric.backend": "simulated", "dashboard.enabled": "true"})
                   if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "dds-dashboard"]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(configmap["data"]["dds.json"]) == json.loads(DASHBOARD.read_text())


def test_the_dashboard_has_the_panels_an_operator_looks_for() -> None:
    titles = {panel["title"] for panel in json.loads(DASHBOARD.read_text())["panels"]}
    assert {"Pool devices by state and model", "GPUs per node", "Idle GPUs past the cooldown",
            "GPUs on nodes by model", "Attach latency", "Detach latency",
            "Decisions by case and outcome", "cluster-autoscaler call latency (p99)", "Control loop duration",
            "Pending pods considered"} <= titles


def test_every_selector_of_every_query_is_narrowed_to_the_cluster_and_namespace_variables() -> None:
    variables = {v["name"]: v for v in json.loads(DASHBOARD.read_text())["templating"]["list"]}
    assert {"datasource", "cluster", "namespace"} <= set(variables)
    assert variables["namespace"]["query"] == 'label_values(dds_leader{cluster=~"$cluster"}, namespace)'
    for name in ("cluster", "namespace"):  # All matches series without the label too (one cluster: no `cluster`)
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*"
    for query in dashboard_queries():
        for metric in metric_names(as_promql(query)):
            for selector in re.finditer(rf"\b{metric}\b(\{{[^}}]*\}})?", query):
                assert all(m in (selector.group(1) or "") for m in SCOPE), f"{selector.group()} in {query}"


def test_the_dashboard_shows_cluster_autoscalers_view() -> None:
    panels = {panel["title"]: [t["expr"] for t in panel.get("targets", [])]
              for panel in json.loads(DASHBOARD.read_text())["panels"]}
    assert "cluster_autoscaler_scaled_up_nodes_total" in " ".join(panels["cluster-autoscaler scale-ups"])
    assert "cluster_autoscaler_failed_scale_ups_total" in " ".join(panels["cluster-autoscaler scale-ups"])
    assert "cluster_autoscaler_unschedulable_pods_count" in " ".join(panels["cluster-autoscaler unschedulable pods"])


def pinned_cluster_autoscaler() -> Path:
    cache = Path(os.environ.get("DDS_BIN_CACHE", Path.home() / ".cache" / "dds" / "bin"))
    version = active_profile().autoscaler_version
    path = cache / f"cluster-autoscaler-{version}" / "cluster-autoscaler"
    if not path.is_file():
        pytest.fail(f"cluster-autoscaler {version} is not built ({path}): run `make setup`", pytrace=False)
    return path


def test_every_cluster_autoscaler_metric_the_dashboard_names_is_one_the_pinned_cluster_autoscaler_defines() -> None:
    """CA registers a labelled metric only at its first sample (a scale-up that failed, say), so a scrape of an idle
    CA cannot show them all: the names are checked against the strings of the pinned binary instead, which holds
    each metric's name beside its namespace (metrics/metrics.go)."""
    names = {n for q in dashboard_queries() for n in metric_names(as_promql(q)) if n.startswith(CA_PREFIX)}
    assert names, "the dashboard has no cluster-autoscaler panel"
    binary = pinned_cluster_autoscaler().read_bytes()
    assert CA_PREFIX.rstrip("_").encode() in binary
    unknown = sorted(n for n in names if n.removeprefix(CA_PREFIX).encode() not in binary)
    assert unknown == [], f"not metrics of cluster-autoscaler {active_profile().autoscaler_version}: {unknown}"


def test_every_dashboard_query_parses(tmp_path: Path) -> None:
    # promtool parses expressions in rule files: each query becomes a recording rule of a generated file.
    rules = [{"record": f"dds_dashboard:query_{i}", "expr": as_promql(q)} for i, q in enumerate(dashboard_queries())]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = run("promtool", "check", "rules", str(path))
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout, result.stdout


# --- every metric named is one DDS serves ---

PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
                "offset", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (after promtool has parsed it): identifiers that are not
    functions, keywords, label names of a matcher or a grouping, nor inside strings."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)  # label lists
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        following = text[match.end():].lstrip()
        if following.startswith("(") or match.group().lower() in PROMQL_WORDS:
            continue  # a function or an aggregation, or a keyword
        if re.match(r"\d", text[match.start() - 1:match.start()] or " "):
            continue  # a unit of a number such as 5m or 1e3
        names.add(match.group())
    return names


def test_metric_names_are_read_out_of_expressions() -> None:
    assert metric_names('histogram_quantile(0.99, sum by (le, method) (rate(a_bucket{code!="x"}[5m]))) > 5') == \
        {"a_bucket"}
    assert metric_names("(sum(b) or vector(0)) < 1 and on () max(c) > 0") == {"b", "c"}


def served_names(exposition: str) -> set[str]:
    """Every series name /metrics can carry, including those of labelled metrics with no child yet (their HELP and
    TYPE lines are served before their first sample)."""
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
                "gauge": ("",), "summary": ("", "_count", "_sum", "_created"), "info": ("_info",)}
    names = set()
    for family in text_string_to_metric_families(exposition):
        names |= {family.name + suffix for suffix in suffixes.get(family.type, ("",))}
        names |= {sample.name for sample in family.samples}
    return names


@pytest.fixture
def live_dds(control_plane: Any, namespace: str) -> Iterator[App]:
    """DDS as `dds serve` runs it (simulated fabric, its shipped RBAC), with /metrics on a loopback port."""
    dds_api = rbac.api_client(rbac.install(control_plane, rbac.DDS))
    settings = Settings(listen="127.0.0.1:0", insecure=True, namespace=namespace, machineset_namespaces=[namespace],
                        node_backend=NodeBackend.MACHINESET, fabric=FabricBackend.SIMULATED,
                        metrics_listen="127.0.0.1:0")
    app = build_app(settings, dds_api)
    app.start()
    try:
        yield app
    finally:
        app.stop()


def scrape_after_a_pass(app: App, seconds: float = 60.0) -> str:
    """/metrics once the control loop has run a pass (its duration histogram has a sample)."""
    deadline = time.monotonic() + seconds
    while True:
        text = requests.get(f"http://127.0.0.1:{app.ops.port}/metrics", timeout=10).text
        if re.search(r"^dds_control_loop_duration_seconds_count [1-9]", text, flags=re.MULTILINE):
            return text
        if time.monotonic() > deadline:
            raise AssertionError(f"DDS's control loop ran no pass within {seconds:.0f} s; /metrics:\n{text[:2000]}")
        time.sleep(0.5)


@pytest.mark.integration
def test_every_metric_the_rules_and_the_dashboard_name_is_served_by_dds(live_dds: App) -> None:
    served = served_names(scrape_after_a_pass(live_dds))
    expressions = {f"alert {a['alert']}": a["expr"] for a in alerts()}
    expressions |= {f"dashboard query {q}": as_promql(q) for q in dashboard_queries()}
    named = {where: {n for n in metric_names(expr) if not n.startswith(CA_PREFIX)}  # CA's: checked above
             for where, expr in expressions.items()}
    unknown = {where: sorted(names - served) for where, names in named.items() if names - served}
    assert unknown == {}, f"metrics a live DDS does not serve: {unknown}"
    assert all(metric_names(expr) for expr in expressions.values())  # the extraction found something in each
