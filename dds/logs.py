"""Logging as settings.log_level / log_format ask: text for people, or one JSON object per line for log pipelines.

Decision log lines carry context as `extra=` fields (case, key, node, group, pods); the JSON format keeps them as keys,
so "every decision for node gpu-workers-x7k2p" is one query.

Messages carry strings DDS does not choose (a Redfish service's error, a caller's certificate names, an apiserver
message, object names and annotations), so no message can forge a log line or drive a terminal. The JSON format escapes
every control character (json.dumps). The text format escapes control characters, carriage returns, DEL, C1 controls
and the Unicode line separators and bidirectional overrides as `\\xNN` / `\\uNNNN`, and indents every line after a
message's first (DDS's own plan renderings are multi-line): only a record's first line starts at the margin, so a
newline inside a message never starts what reads as a record of its own.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from typing import Any

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}
# Characters a text log line must not carry raw: C0 controls but tab and newline, DEL and C1 controls, and the Unicode
# line/paragraph separators and bidirectional controls that make a viewer show a line other than it is.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
CONTINUATION = "\n    "  # what a newline inside a message becomes in the text format


def escape_text(message: str) -> str:
    """`message` as the text log shows it: unsafe characters escaped, continuation lines indented."""
    if _UNSAFE.search(message):
        message = _UNSAFE.sub(_escaped, message)
    return message.replace("\n", CONTINUATION) if "\n" in message else message


def _escaped(match: "re.Match[str]") -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


class TextFormatter(logging.Formatter):
    """The text format, with every message passed through `escape_text`."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        message = record.message
        record.message = escape_text(message)
        try:
            return super().formatMessage(record)
        finally:
            record.message = message


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def parse_level(level_name: str) -> int:
    """logging's level of a name, in any case; a ValueError for a name logging does not know."""
    level = getattr(logging, level_name.upper(), None)
    if not isinstance(level, int):
        raise ValueError(f"log_level {level_name!r} is not one of DEBUG, INFO, WARNING, ERROR")
    return level


def configure(level_name: str, log_format: str = "text") -> None:
    level = parse_level(level_name)
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        formatter: logging.Formatter = JsonFormatter()
        formatter.converter = __import__("time").gmtime
    else:
        formatter = TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
