"""The apiserver's error answers as dds.kube raises them to the layers above.

The kubernetes client raises `ApiException`; the modules of dds.kube that other layers call turn it into `ApiError`,
which carries the same facts (HTTP status, reason, the Status object's message) without importing the client, so the
fabric, node and controller code can tell a 404 from a 409 while only dds.kube depends on the kubernetes package.
Connection errors (urllib3, TLS, timeouts) are not apiserver answers and pass through unchanged.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional, TypeVar

from kubernetes import client
from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential

STATUS_NOT_FOUND = 404
STATUS_CONFLICT = 409
# Answers worth asking again: throttling and the apiserver's (or its proxy's) temporary failures.
TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})

F = TypeVar("F", bound=Callable[..., Any])


def is_transient(exc: BaseException) -> bool:
    """A throttled or temporarily failed request, or no answer at all (connection refused, reset, timed out)."""
    if isinstance(exc, client.ApiException):
        return exc.status in TRANSIENT_STATUS
    return isinstance(exc, (ConnectionError, TimeoutError, OSError))


def retrying(attempts: int) -> Callable[[F], F]:
    """Retry a call on transient failures, with exponential backoff (0.1 s doubling, at most 2 s between tries)."""
    return retry(retry=retry_if_exception(is_transient), stop=stop_after_attempt(attempts),
                 wait=wait_exponential(multiplier=0.1, max=2.0), reraise=True)


class ApiError(Exception):
    """The apiserver answered with an error status (`status` None or 0: the client got no HTTP answer at all)."""

    def __init__(self, status: Optional[int], reason: str, body: str = "") -> None:
        super().__init__(f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.body = body

    @classmethod
    def of(cls, exc: client.ApiException) -> "ApiError":
        body = exc.body if isinstance(exc.body, str) else (exc.body.decode(errors="replace") if exc.body else "")
        return cls(exc.status, str(exc.reason or ""), body)

    @property
    def not_found(self) -> bool:
        return self.status == STATUS_NOT_FOUND

    @property
    def conflict(self) -> bool:
        return self.status == STATUS_CONFLICT

    @property
    def message(self) -> str:
        """The `message` of the Status object the apiserver sent, "" when the body is not one."""
        try:
            return str(json.loads(self.body or "{}").get("message", ""))
        except (ValueError, AttributeError):
            return ""


@contextmanager
def api_errors() -> Iterator[None]:
    """Raise the client's ApiException as `ApiError` (the original chained as its cause)."""
    try:
        yield
    except client.ApiException as exc:
        raise ApiError.of(exc) from exc
