#!/usr/bin/env python3
"""Generates the `settings` and `fabric.settings` parts of charts/dds/values.schema.json from dds/config.py's Settings,
and `prometheusRule.alerts` from the alert names of charts/dds/files/prometheus-rules.yaml.

    .venv/bin/python hack/gen-chart-schema.py           # rewrite the checked-in schema (make chart-schema)
    .venv/bin/python hack/gen-chart-schema.py --check   # exit 1 if the checked-in schema is not this script's output

One source of truth: `helm template`/`helm install` refuse a misspelt, mistyped or out-of-range setting the way
`dds serve` does at start, instead of rendering a pod that crash-loops. The refusals that span several values (e.g.
metrics_secure with the chart's pod-address bind) are `fail`s in templates/_helpers.tpl ("dds.refusals").
tests/integration/chart/test_settings_refusals.py keeps the checked-in schema equal to this output and renders each
refusal. The alerts' part makes a misspelt alert name under prometheusRule.alerts a refusal too, not an override that
silently does nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml
from generated_file import write_or_check  # hack/, beside this script

from dds.config import Settings

CHART = Path(__file__).resolve().parents[1] / "charts" / "dds"
SCHEMA = CHART / "values.schema.json"
RULES = CHART / "files" / "prometheus-rules.yaml"
# A Prometheus duration (a rule's `for`), e.g. 10m or 1h30m.
DURATION = r"^(0|([0-9]+(ms|s|m|h|d|w|y))+)$"
# fabric.backend -> the settings section it reads (templates/_helpers.tpl "dds.fabricSection").
FABRIC_SECTIONS = {"composability-request": "composability", "redfish": "redfish", "simulated": "simulated_fabric"}
GENERATED = "generated from dds/config.py Settings by hack/gen-chart-schema.py (make chart-schema): do not edit"


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    """The schema with every $ref replaced by its definition and pydantic's titles dropped (helm reads one file)."""
    if isinstance(node, dict):
        if "$ref" in node:
            return _inline(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
        return {key: _inline(value, defs) for key, value in node.items() if key != "title"}
    if isinstance(node, list):
        return [_inline(item, defs) for item in node]
    return node


def settings_schema() -> dict[str, Any]:
    raw = Settings.model_json_schema()
    defs = raw.get("$defs", {})
    properties = {name: _inline(prop, defs) for name, prop in raw["properties"].items() if name != "config_file"}
    described = ("any other DDS setting (docs/configuration.md), written into settings.yaml as given; `listen`, "
                 "`tls_*`, `namespace`, `in_cluster`, `metrics_listen`, `fabric`, `lease_name` and `insecure` are the "
                 f"chart's and refused here; {GENERATED}")
    return {"type": "object", "description": described,
            "properties": properties, "additionalProperties": False}


def fabric_section_rules(settings: dict[str, Any]) -> list[dict[str, Any]]:
    """fabric.settings is the section of the chosen backend: checked with that section's schema."""
    return [{"if": {"properties": {"backend": {"const": backend}}, "required": ["backend"]},
             "then": {"properties": {"settings": settings["properties"][section]}}}
            for backend, section in FABRIC_SECTIONS.items()]


def alert_overrides_schema() -> dict[str, Any]:
    """prometheusRule.alerts: one optional override per alert the rule file has, by name."""
    names = [rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
             if "alert" in rule]
    override = {"type": "object", "additionalProperties": False, "properties": {
        "enabled": {"type": "boolean", "description": "false leaves the alert out"},
        "for": {"type": "string", "pattern": DURATION, "description": "how long it is pending before it fires"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"},
                   "description": "labels added to the alert or replacing its own (severity)"}}}
    return {"type": "object", "description": "per alert, by name: `enabled: false` leaves it out, `labels` adds or "
            "replaces labels (severity too), `for` replaces its pending time; an unknown alert name is refused; "
            "generated from files/prometheus-rules.yaml by hack/gen-chart-schema.py (make chart-schema): do not edit",
            "properties": {name: override for name in names}, "additionalProperties": False}


def generate(current: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(current))
    settings = settings_schema()
    out["properties"]["settings"] = settings
    fabric = out["properties"]["fabric"]
    fabric["properties"]["settings"] = {"type": "object", "description": "that backend's settings section of "
                                        "dds/config.py (`composability`, `redfish`, `simulated_fabric`), checked "
                                        f"with that section's schema; {GENERATED}"}
    fabric["allOf"] = fabric_section_rules(settings)
    out["properties"]["prometheusRule"]["properties"]["alerts"] = alert_overrides_schema()
    return out


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if the checked-in schema differs")
    args = parser.parse_args()
    wanted = render(generate(json.loads(SCHEMA.read_text())))
    return write_or_check(SCHEMA, wanted, args.check, "make chart-schema")


if __name__ == "__main__":
    sys.exit(main())
