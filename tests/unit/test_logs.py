"""log_format json: one JSON object per line, with a decision's context fields as keys."""

import json
import logging

import pytest

from dds.logs import JsonFormatter, TextFormatter, configure


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


def text_line(message: str, *args: object) -> str:
    record = logging.makeLogRecord({"name": "dds.fabric.redfish", "levelname": "WARNING", "levelno": 30,
                                    "msg": message, "args": args})
    return TextFormatter("%(levelname)s %(name)s: %(message)s").format(record)


def test_a_newline_in_an_untrusted_string_cannot_start_a_forged_record():
    forged = "refused\n2026-11-28 12:00:00,000 INFO dds.controller: all GPUs released"
    shown = text_line("Redfish said: %s", forged)
    first, *rest = shown.split("\n")
    assert first == "WARNING dds.fabric.redfish: Redfish said: refused"
    assert rest == ["    2026-11-28 12:00:00,000 INFO dds.controller: all GPUs released"]  # indented: not a record


@pytest.mark.parametrize("raw,shown", [
    ("\r", "\\x0d"),  # a carriage return would overwrite the line on a terminal
    ("\x1b[2J", "\\x1b[2J"),  # an ANSI escape (clear screen)
    ("\x00", "\\x00"),
    ("\u202e", "\\u202e"),  # right-to-left override: a line shown other than it is
    ("\u2028", "\\u2028"),  # a Unicode line separator
])
def test_control_characters_are_escaped_in_the_text_log(raw: str, shown: str):
    assert text_line("name %s end", f"a{raw}b") == f"WARNING dds.fabric.redfish: name a{shown}b end"


def test_the_json_log_escapes_them_too():
    record = logging.makeLogRecord({"name": "n", "levelname": "INFO", "levelno": 20, "msg": "%s",
                                    "args": ("a\nb\r\x1b",)})
    line = JsonFormatter().format(record)
    assert "\n" not in line and "\r" not in line and "\x1b" not in line
    assert json.loads(line)["msg"] == "a\nb\r\x1b"
