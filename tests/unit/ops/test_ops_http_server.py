"""The operations endpoint as a prober and a scraper see it (real sockets on port 0)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests
from prometheus_client import CollectorRegistry, Counter

from dds.ops.http import OpsServer, parse_listen


@pytest.fixture
def registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("dds_test_things_total", "things counted by the test", ["kind"], registry=registry).labels("gpu").inc(3)
    return registry


@pytest.fixture
def ops(registry: CollectorRegistry) -> Iterator[OpsServer]:
    server = OpsServer("127.0.0.1:0", registry=registry)
    server.start()
    yield server
    server.stop()


def url(ops: OpsServer, path: str) -> str:
    return f"http://127.0.0.1:{ops.port}{path}"


def test_healthz_answers_ok(ops: OpsServer) -> None:
    response = requests.get(url(ops, "/healthz"), timeout=5)
    assert (response.status_code, response.text) == (200, "ok\n")


def test_metrics_serve_the_registry_in_prometheus_text(ops: OpsServer) -> None:
    response = requests.get(url(ops, "/metrics"), timeout=5)
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/plain")
    assert 'dds_test_things_total{kind="gpu"} 3.0' in response.text


def test_metrics_honour_an_openmetrics_accept_header(ops: OpsServer) -> None:
    response = requests.get(url(ops, "/metrics"), headers={"Accept": "application/openmetrics-text"}, timeout=5)
    assert response.headers["Content-Type"].startswith("application/openmetrics-text")
    assert response.text.rstrip().endswith("# EOF")


def test_default_registry_exposes_the_dds_metrics() -> None:
    import dds.metrics  # noqa: F401  (registers every DDS metric in the default registry)

    server = OpsServer("127.0.0.1:0")
    server.start()
    try:
        text = requests.get(url(server, "/metrics"), timeout=5).text
    finally:
        server.stop()
    assert "dds_leader" in text and "dds_events_dropped_total" in text


def failing_check() -> bool:
    raise ConnectionError("fabric manager unreachable")


@pytest.mark.parametrize(
    ("checks", "status", "expected_lines"),
    [
        ({}, 200, ["readyz check passed"]),
        ({"node-groups": lambda: True}, 200, ["[+]node-groups ok", "readyz check passed"]),
        ({"node-groups": lambda: False}, 503, ["[-]node-groups failed: not ready", "readyz check failed"]),
        ({"fabric": failing_check, "node-groups": lambda: True}, 503,
         ["[-]fabric failed: ConnectionError: fabric manager unreachable", "[+]node-groups ok", "readyz check failed"]),
    ],
    ids=["no-checks", "all-pass", "one-false", "one-raises"],
)
def test_readyz_reports_every_check(ops: OpsServer, checks: dict, status: int, expected_lines: list[str]) -> None:
    for name, check in checks.items():
        ops.add_ready_check(name, check)
    response = requests.get(url(ops, "/readyz"), timeout=5)
    assert response.status_code == status
    assert response.text.splitlines() == expected_lines


def test_readyz_follows_a_check_that_changes(ops: OpsServer) -> None:
    loaded = {"value": False}
    ops.add_ready_check("node-groups", lambda: loaded["value"])
    assert requests.get(url(ops, "/readyz"), timeout=5).status_code == 503
    loaded["value"] = True
    assert requests.get(url(ops, "/readyz"), timeout=5).status_code == 200


def test_shutdown_fails_readiness_but_not_liveness(ops: OpsServer) -> None:
    ops.begin_shutdown()
    assert requests.get(url(ops, "/readyz"), timeout=5).status_code == 503
    assert requests.get(url(ops, "/healthz"), timeout=5).status_code == 200


def test_unknown_path_is_404(ops: OpsServer) -> None:
    assert requests.get(url(ops, "/nope"), timeout=5).status_code == 404


def test_stop_releases_the_port(registry: CollectorRegistry) -> None:
    server = OpsServer("127.0.0.1:0", registry=registry)
    port = server.start()
    server.stop()
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
    server.stop()  # stopping twice is harmless


@pytest.mark.parametrize(
    ("address", "expected"),
    [("0.0.0.0:8087", ("0.0.0.0", 8087)), (":8087", ("0.0.0.0", 8087)), ("[::]:9000", ("::", 9000)),
     ("127.0.0.1:0", ("127.0.0.1", 0))],
    ids=["ipv4", "all-interfaces", "ipv6", "any-port"],
)
def test_parse_listen(address: str, expected: tuple[str, int]) -> None:
    assert parse_listen(address) == expected


@pytest.mark.parametrize("address", ["8087", "host:", "host:http", "host:70000"],
                         ids=["no-colon", "no-port", "named-port", "out-of-range"])
def test_parse_listen_rejects_bad_addresses_naming_the_setting(address: str) -> None:
    with pytest.raises(ValueError, match="metrics_listen"):
        parse_listen(address)


def test_check_names_must_be_words(ops: OpsServer) -> None:
    with pytest.raises(ValueError, match="readiness check name"):
        ops.add_ready_check("node groups", lambda: True)
