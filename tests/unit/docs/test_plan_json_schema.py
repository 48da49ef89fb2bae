"""docs/plan-json.md names every key `dds plan --json` prints, and nothing it does not print."""

from __future__ import annotations

import json
import re
from pathlib import Path

from dds.cli import main

ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "examples" / "snapshot-demo.json"


def keys(value: object) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in keys(v)}
    return set()


def test_every_key_printed_is_documented(capsys) -> None:
    from dds.model.plan import Attach, Detach, IdlePastCooldown, Keep, NewNodes, PodDecision, Reject, RemoveNode

    assert main(["plan", "--snapshot", str(DEMO), "--json"]) == 0
    printed = keys(json.loads(capsys.readouterr().out))
    # The demo has no detach or removal: the model's fields stand for what other snapshots print.
    fields = {f for cls in (Attach, Detach, IdlePastCooldown, Keep, NewNodes, PodDecision, Reject, RemoveNode)
              for f in cls.__dataclass_fields__}
    documented = set(re.findall(r"`([a-z_A-Z]+)`", (ROOT / "docs" / "plan-json.md").read_text()))
    assert printed - documented == set()
    assert fields - documented == set()


def test_keys_are_snake_case_with_the_old_names_as_aliases(capsys) -> None:
    """scaleUp/scaleDown stay as deprecated aliases of the same objects; every other key is snake_case."""
    assert main(["plan", "--snapshot", str(DEMO), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["schema"] == "dds.plan/v1"
    assert data["scaleUp"] == data["scale_up"] and data["scaleDown"] == data["scale_down"]
    camel = {k for k in keys({"scale_up": data["scale_up"], "scale_down": data["scale_down"]}) if k != k.lower()}
    assert not camel, camel
