"""The chart refuses at render every setting `dds serve` refuses at start, with the reason, instead of rendering a pod
that crash-loops: values.schema.json's `settings` and `fabric.settings` are generated from dds/config.py's Settings
(hack/gen-chart-schema.py), the refusals spanning several settings are `fail`s in templates/_helpers.tpl.

Each case below is checked on both sides: the same change made to the settings the chart renders for a sound base is
refused by DDS's own start checks, and `helm template` refuses the values with a message naming it."""

from __future__ import annotations

import copy
import json
import subprocess
import time
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml
from pydantic import ValidationError

from dds.config import FabricBackend, Settings
from dds.fabric.composability import _capacity_from
from dds.fabric.factory import build_fabric, require_fabric_choice, require_pools
from dds.logs import parse_level
from dds.ops.http import check_metrics_settings
from tests.integration.chart.tools import CHART, KUBE_VERSION, ROOT, run

SECTIONS = {"composability-request": "composability", "redfish": "redfish", "simulated": "simulated_fabric"}
POOLS = [{"name": "rack-1", "devices": {"A100": 16}}]
BASES: dict[str, dict[str, Any]] = {
    "simulated": {"fabric.backend": "simulated"},
    "composability-request": {"fabric.backend": "composability-request", "settings.pools": POOLS},
    "redfish": {"fabric.backend": "redfish", "settings.pools": POOLS,
                "fabric.settings.endpoint": "https://redfish.example:8443"},
}


class Refusal(NamedTuple):
    base: str
    change: dict[str, Any]  # value path -> value; None removes the key
    message: str  # in helm's error


REFUSALS = {
    # One setting alone: values.schema.json, generated from Settings.
    "unknown-setting": Refusal("simulated", {"settings.polcy": "spread"}, "additional properties 'polcy' not allowed"),
    "wrong-type": Refusal("simulated", {"settings.loop_interval_seconds": "often"}, "/settings/loop_interval_seconds"),
    "out-of-range": Refusal("simulated", {"settings.loop_interval_seconds": 0}, "/settings/loop_interval_seconds"),
    "unknown-policy": Refusal("simulated", {"settings.policy": "best-fitt"}, "/settings/policy"),
    "unknown-solver": Refusal("simulated", {"settings.batch_solver": "cplex"}, "/settings/batch_solver"),
    "unknown-log-format": Refusal("simulated", {"settings.log_format": "xml"}, "/settings/log_format"),
    "unknown-log-level": Refusal("simulated", {"settings.log_level": "verbose"}, "/settings/log_level"),
    "unknown-node-backend": Refusal("simulated", {"settings.node_backend": "ec2"}, "/settings/node_backend"),
    "removed-kwok-node-backend": Refusal("simulated", {"settings.node_backend": "kwok"}, "/settings/node_backend"),
    "removed-kwok-section": Refusal("simulated", {"settings.kwok": {"provisioning_delay_seconds": 3}},
                                    "additional properties 'kwok' not allowed"),
    "no-allowed-client": Refusal("simulated", {"settings.grpc_allowed_clients": []},
                                 "/settings/grpc_allowed_clients"),
    "blank-allowed-client": Refusal("simulated", {"settings.grpc_allowed_clients": [" "]},
                                    "/settings/grpc_allowed_clients/0"),
    "grant-without-pools": Refusal("simulated", {"settings.node_group_namespaces": {"team": {"pools": []}}},
                                   "/settings/node_group_namespaces/team/pools"),
    "grant-of-a-blank-pool": Refusal("simulated", {"settings.node_group_namespaces": {"team": {"pools": [""]}}},
                                     "/settings/node_group_namespaces/team/pools/0"),
    "misspelt-fabric-setting": Refusal("redfish", {"fabric.settings.endpointt": "https://x"},
                                       "additional properties 'endpointt' not allowed"),
    "fabric-setting-out-of-range": Refusal("redfish", {"fabric.settings.timeout_seconds": 0},
                                           "/fabric/settings/timeout_seconds"),
    "fault-probability-above-one": Refusal("simulated", {"fabric.settings.faults": {"attach_error": 2}},
                                           "/fabric/settings/faults/attach_error"),
    "replaced-dra-switch": Refusal("simulated", {"fabric.settings.dra_resource_slices": True},
                                   "additional properties 'dra_resource_slices' not allowed"),
    "pool-name-with-slash": Refusal("simulated", {"fabric.settings.pools": [{"name": "a/b", "devices": {"A30": 1}}]},
                                    "/fabric/settings/pools/0/name"),
    "negative-device-count": Refusal("simulated", {"fabric.settings.pools": [{"name": "a", "devices": {"A30": -1}}]},
                                     "/fabric/settings/pools/0/devices/A30"),
    "negative-slot-limit": Refusal("simulated", {"fabric.settings.pools": [
        {"name": "a", "devices": {"A30": 1}, "max_slots_per_node": -1}]}, "/fabric/settings/pools/0/max_slots_per_node"),
    # Several settings together: templates/_helpers.tpl "dds.refusals".
    "metrics-unsecured": Refusal("simulated", {"settings.metrics_secure": False},
                                 "settings.metrics_secure must be true"),
    "metrics-unsecured-by-omission": Refusal("simulated", {"settings.metrics_secure": None},
                                             "settings.metrics_secure must be true"),
    "metrics-cert-without-key": Refusal("simulated", {"settings.metrics_tls_cert": "/etc/dds/m/tls.crt"},
                                        "settings.metrics_tls_cert and settings.metrics_tls_key go together"),
    "pools-with-the-simulated-fabric": Refusal("simulated", {"settings.pools": POOLS},
                                               "settings.pools is for a real fabric"),
    "composability-without-pools": Refusal("composability-request", {"settings.pools": None},
                                           "fabric composability-request: declare the GPU pools"),
    "redfish-without-pools": Refusal("redfish", {"settings.pools": None}, "fabric redfish: declare the GPU pools"),
    "pool-name-twice": Refusal("simulated", {"fabric.settings.pools": [{"name": "a", "devices": {"A30": 1}},
                                                                       {"name": "a", "devices": {"A100": 1}}]},
                               "pool name used twice"),
    "model-in-two-pools": Refusal("composability-request", {"settings.pools": [
        {"name": "a", "devices": {"A100": 1}}, {"name": "b", "devices": {"A100": 1}}]}, "model A100 is already in pool"),
    "grant-of-an-unread-namespace": Refusal("simulated", {"settings.machineset_namespaces": ["team-a"],
                                                          "settings.node_group_namespaces": {"team-b": {"pools": ["*"]}}},
                                            "node_group_namespaces names team-b, which settings.machineset_namespaces"),
}


def helm_template(values: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    args = []
    for path, value in values.items():
        args += ["--set", f"{path}=null"] if value is None else ["--set-json", f"{path}={json.dumps(value)}"]
    return run("helm", "template", "dds", str(CHART), "--namespace", "dds-system", "--kube-version", KUBE_VERSION,
               *args, check=False)


def rendered_settings(values: dict[str, Any]) -> dict[str, Any]:
    result = helm_template(values)
    assert result.returncode == 0, result.stderr
    [configmap] = [doc for doc in yaml.safe_load_all(result.stdout)
                   if doc and doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == "dds-settings"]
    return yaml.safe_load(configmap["data"]["settings.yaml"])


def changed(settings: dict[str, Any], backend: str, change: dict[str, Any]) -> dict[str, Any]:
    """The settings with the values' change made where the chart would put it (fabric.settings: the backend's
    section)."""
    out = copy.deepcopy(settings)
    for path, value in change.items():
        parts = path.split(".")
        keys = parts[1:] if parts[0] == "settings" else [SECTIONS[backend], *parts[2:]]
        target = out
        for key in keys[:-1]:
            target = target.setdefault(key, {})
        if value is None:
            target.pop(keys[-1], None)
        else:
            target[keys[-1]] = value
    return out


def dds_start_refusal(settings: dict[str, Any], tmp_path: Path) -> str:
    """What `dds serve` says refusing these settings before it serves (dds/commands/serve.py, then the fabric's
    construction in dds/app.py); "" when it would start."""
    path = tmp_path / "settings.yaml"
    path.write_text(yaml.safe_dump(settings))
    try:
        loaded = Settings.load(path)
        parse_level(loaded.log_level)  # dds.logs.configure, before anything else
        check_metrics_settings(loaded)
        backend = require_fabric_choice(loaded)
        if backend == FabricBackend.SIMULATED:
            build_fabric(loaded, clock=time.time)  # validates the simulated pools
        else:
            pools = require_pools(loaded)
            if backend == FabricBackend.COMPOSABILITY_REQUEST:
                _capacity_from(pools)  # what ComposabilityRequestFabric checks at construction
    except (ValidationError, ValueError) as exc:
        return str(exc)
    return ""


def test_the_checked_in_schema_is_generated_from_the_settings_model() -> None:
    result = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "hack/gen-chart-schema.py", "--check"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("backend", BASES)
def test_each_base_renders_settings_dds_starts_with(backend: str, tmp_path: Path) -> None:
    assert dds_start_refusal(rendered_settings(BASES[backend]), tmp_path) == ""


@pytest.mark.parametrize("case", REFUSALS.values(), ids=REFUSALS.keys())
def test_every_refusal_of_dds_is_a_refusal_of_the_chart(case: Refusal, tmp_path: Path) -> None:
    base = BASES[case.base]
    refused_by_dds = dds_start_refusal(changed(rendered_settings(base), case.base, case.change), tmp_path)
    assert refused_by_dds, f"DDS starts with {case.change}: not a refusal"
    result = helm_template({**base, **case.change})
    assert result.returncode != 0, f"the chart renders {case.change}, which DDS refuses: {refused_by_dds}"
    assert case.message in result.stderr, result.stderr
