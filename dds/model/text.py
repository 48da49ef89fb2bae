"""Text DDS stores or sends that has a size limit: a gRPC status message (CA's channel refuses trailers over its
metadata limit), an in-flight instance's reason and error (all of them share one ConfigMap of at most 1 MiB)."""

from __future__ import annotations


def bounded_text(text: str, limit: int) -> str:
    """`text`, cut to at most `limit` characters with a note of how long it was."""
    if len(text) <= limit:
        return text
    tail = f"... ({len(text)} characters in all)"
    return text[:max(0, limit - len(tail))] + tail
