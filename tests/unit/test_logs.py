"""log_format json: one JSON object per line, with a decision's context fields as keys."""

import json
import logging

import pytest

from dds.logs import JsonFormatter, configure


def test_json_lines_keep_the_decision_context():
    record = logging.makeLogRecord({"name": "dds.controller.executor", "levelname": "INFO", "levelno": 20,
                                    "msg": "attaching %d x %s to %s", "args": (1, "A30", "worker-1"),
                                    "case": "case1-scale-up", "node": "worker-1", "key": "dds://g/gpu/u1#0"})
    line = json.loads(JsonFormatter().format(record))
    assert line["msg"] == "attaching 1 x A30 to worker-1"
    assert (line["case"], line["node"], line["key"]) == ("case1-scale-up", "worker-1", "dds://g/gpu/u1#0")
    assert line["level"] == "INFO" and line["logger"] == "dds.controller.executor"


def test_bad_level_is_a_clear_error():
    with pytest.raises(ValueError, match="log_level 'LOUD'"):
        configure("LOUD")


def test_unknown_log_format_is_refused_at_load():
    from pydantic import ValidationError

    from dds.config import Settings

    with pytest.raises(ValidationError, match="unknown log format 'yaml'"):
        Settings.load(None, log_format="yaml")


def test_nested_environment_variable_changes_one_field_of_the_files_section(tmp_path, monkeypatch):
    from dds.config import Settings

    config = tmp_path / "dds.yaml"
    config.write_text("redfish:\n  endpoint: https://bmc.example:8443\n  username: file-user\n")
    monkeypatch.setenv("DDS_REDFISH__USERNAME", "env-user")
    settings = Settings.load(config)
    assert (settings.redfish.endpoint, settings.redfish.username) == ("https://bmc.example:8443", "env-user")
