"""The cloud-config file as cluster-autoscaler reads it, Go durations, and what the apiserver's JSON becomes."""

from __future__ import annotations

from pathlib import Path

import pytest

from dds.testing.ca_standin import CloudConfigError, load_cloud_config, parse_cloud_config, parse_go_duration
from dds.testing.ca_standin.views import node_from_manifest

from .conftest import iso


@pytest.mark.parametrize("text, expected", [
    pytest.param("5s", 5.0, id="seconds"), pytest.param("1m30s", 90.0, id="minutes-and-seconds"),
    pytest.param("250ms", 0.25, id="milliseconds"), pytest.param("1.5h", 5400.0, id="fractional-hours"),
    pytest.param("0", 0.0, id="bare-zero"), pytest.param("-2s", -2.0, id="negative"),
])
def test_go_durations(text, expected):
    assert parse_go_duration(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["5", "s", "1x", "1m 2s", ""])
def test_bad_go_durations(text):
    with pytest.raises(ValueError, match="not a Go duration"):
        parse_go_duration(text)


def test_plaintext_config_with_default_timeout():
    config = parse_cloud_config("address: 127.0.0.1:8086\n")
    assert (config.address, config.grpc_timeout, config.uses_tls, config.host) == ("127.0.0.1:8086", 5.0, False,
                                                                                   "127.0.0.1")


def test_mutual_tls_config():
    config = parse_cloud_config("address: '[::1]:8086'\ncert: c.pem\nkey: k.pem\ncacert: ca.pem\n"
                                "grpc_timeout: 1m\nunknown: ignored\n")
    assert (config.host, config.uses_tls, config.grpc_timeout, config.cacert) == ("::1", True, 60.0, Path("ca.pem"))


@pytest.mark.parametrize("text, message", [
    pytest.param("cert: c.pem\n", "field 'address' is required", id="no-address"),
    pytest.param("address: localhost\n", "field 'address'.*host:port", id="no-port"),
    pytest.param("address: h:1\ncert: c.pem\n", "'key' and 'cacert' must be set", id="cert-without-key-and-ca"),
    pytest.param("address: h:1\ngrpc_timeout: 5\n", "'grpc_timeout' must be a duration string", id="bare-number"),
    pytest.param("address: h:1\ngrpc_timeout: soon\n", "'grpc_timeout': not a Go duration", id="bad-duration"),
    pytest.param("- address\n", "top level must be a mapping", id="a-list"),
])
def test_bad_configs_name_the_field(text, message):
    with pytest.raises(CloudConfigError, match=message):
        parse_cloud_config(text)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(CloudConfigError, match="could not open cloud provider configuration file"):
        load_cloud_config(tmp_path / "absent.yaml")


@pytest.mark.parametrize("conditions, taints, ready", [
    pytest.param([("Ready", "True")], [], True, id="ready"),
    pytest.param([("Ready", "False")], [], False, id="not-ready"),
    pytest.param([("Ready", "True"), ("DiskPressure", "True")], [], False, id="disk-pressure"),
    pytest.param([("Ready", "True")], ["node.kubernetes.io/not-ready"], False, id="not-ready-taint"),
    pytest.param([], [], False, id="no-ready-condition"),
])
def test_node_readiness_as_ca_reads_it(conditions, taints, ready):
    node = node_from_manifest({
        "metadata": {"name": "n", "creationTimestamp": iso(10)},
        "spec": {"taints": [{"key": k, "effect": "NoSchedule"} for k in taints]},
        "status": {"allocatable": {"cpu": "1500m", "memory": "1Gi", "pods": "10"},
                   "conditions": [{"type": t, "status": s, "lastTransitionTime": iso(50)} for t, s in conditions]}})
    assert node.ready is ready
    assert (node.allocatable["cpu"], node.allocatable["pods"], node.created) == (1500, 10_000, 10.0)
