"""Who may read /metrics and /decisions: the apiserver decides, as it does for kube-rbac-proxy and for
controller-runtime's metrics filter.

A scrape carries a bearer token (Prometheus sends its ServiceAccount's). DDS asks the apiserver whose token it is
(a TokenReview, authentication.k8s.io/v1), then whether that user may `get` the path (a SubjectAccessReview for a
non-resource URL, authorization.k8s.io/v1). Access is therefore granted with ordinary RBAC, the ClusterRole
`dds-metrics-reader` of manifests/dds/rbac.yaml:

    rules: [{nonResourceURLs: ["/metrics", "/decisions"], verbs: ["get"]}]

Allowed answers are kept `ttl_seconds` (10 s by default) per (token, verb, path), so a burst of scrapes costs the
apiserver two requests, not two per scrape; a revoked grant lingers for at most that TTL. Refusals (401, 403) are kept
`DENIAL_TTL_SECONDS` (2 s): a caller repeating a bad token costs one review per two seconds, and a grant just bound
applies within two seconds. The caches hold the token's SHA-256 digest, never the token.

Reviews are also rate-limited per source address: each source may cause `REVIEWS_BURST` reviews at once and
`REVIEWS_PER_SECOND` after that; past it DDS answers 429 without asking the apiserver, so a caller trying tokens by
the thousand cannot make DDS flood the apiserver with TokenReviews (nor be told which tokens are valid any faster).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol

import urllib3
from kubernetes import client

from dds.kube.errors import ApiError, api_errors

DEFAULT_TTL_SECONDS = 10.0
# Only allowed answers are kept, so only holders of valid tokens can fill the cache; the bound is for a cluster whose
# every ServiceAccount scrapes, not for an attacker.
DEFAULT_MAX_ENTRIES = 1024
REVIEW_TIMEOUT_SECONDS = 10.0
DENIAL_TTL_SECONDS = 2.0
REVIEWS_BURST = 20  # reviews one source may cause at once
REVIEWS_PER_SECOND = 2.0  # and then on average
_TRACKED_SOURCES = 4096  # sources whose review budget is kept; more start over (a bound, not a policy)

HTTP_OK = 200
HTTP_UNAUTHORIZED = 401
HTTP_FORBIDDEN = 403
HTTP_TOO_MANY_REQUESTS = 429


@dataclass(frozen=True, slots=True)
class User:
    """The user a TokenReview found, as a SubjectAccessReview must name it again."""

    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Access:
    """The answer to one request: `status` is the HTTP status to reply with (200, 401 or 403)."""

    status: int
    reason: str
    user: str = ""

    @property
    def allowed(self) -> bool:
        return self.status == HTTP_OK


@dataclass(frozen=True, slots=True)
class Decision:
    """What a SubjectAccessReview answered."""

    allowed: bool
    reason: str = ""


class ReviewUnavailable(Exception):
    """The apiserver could not be asked (unreachable, or it answered the review itself with an error)."""


class Reviews(Protocol):
    """The two questions asked of the apiserver."""

    def authenticate(self, token: str) -> Optional[User]:
        """The token's user, None when the apiserver does not recognise the token."""

    def authorize(self, user: User, verb: str, path: str) -> Decision:
        """May `user` do `verb` on the non-resource URL `path`?"""


class ApiserverReviews:
    """TokenReview and SubjectAccessReview through DDS's own API client (its RBAC: `create` on both)."""

    def __init__(self, api: client.ApiClient) -> None:
        self._authentication = client.AuthenticationV1Api(api)
        self._authorization = client.AuthorizationV1Api(api)

    def authenticate(self, token: str) -> Optional[User]:
        review = client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token))
        answer = _ask("TokenReview", lambda: self._authentication.create_token_review(
            review, _request_timeout=REVIEW_TIMEOUT_SECONDS))
        status = answer.status
        if status is None or not status.authenticated or status.user is None or not status.user.username:
            return None
        user = status.user
        return User(name=user.username, uid=user.uid or "", groups=tuple(user.groups or ()),
                    extra={key: list(values or ()) for key, values in (user.extra or {}).items()})

    def authorize(self, user: User, verb: str, path: str) -> Decision:
        review = client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
            user=user.name, uid=user.uid or None, groups=list(user.groups) or None, extra=user.extra or None,
            non_resource_attributes=client.V1NonResourceAttributes(path=path, verb=verb)))
        answer = _ask("SubjectAccessReview", lambda: self._authorization.create_subject_access_review(
            review, _request_timeout=REVIEW_TIMEOUT_SECONDS))
        status = answer.status
        if status is None:
            return Decision(False, "the apiserver's answer had no status")
        if status.evaluation_error and not status.allowed:
            return Decision(False, f"{status.reason or 'no rule allows it'} ({status.evaluation_error})")
        return Decision(bool(status.allowed), status.reason or "")


def _ask(kind: str, call: Callable[[], Any]) -> Any:
    try:
        with api_errors():
            return call()
    except ApiError as error:
        detail = error.message or error.reason
        raise ReviewUnavailable(f"the apiserver refused DDS's {kind} ({error.status}: {detail}); DDS's "
                                f"ClusterRole needs `create` on tokenreviews and subjectaccessreviews") from error
    except (OSError, urllib3.exceptions.HTTPError) as error:  # refused, reset, timed out: no answer at all
        raise ReviewUnavailable(f"cannot reach the apiserver for a {kind}: {error}") from error


class AllowedCache:
    """(token digest, verb, path) -> user name, each for `ttl_seconds`, at most `max_entries` (oldest out). Holds
    allowed answers; a second one, with a short TTL, holds refusals (the user name is then the refusal's reason)."""

    def __init__(self, ttl_seconds: float = DEFAULT_TTL_SECONDS, max_entries: int = DEFAULT_MAX_ENTRIES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if ttl_seconds < 0 or max_entries < 1:
            raise ValueError(f"allowed-answer cache: ttl {ttl_seconds} must be >= 0 and size {max_entries} >= 1")
        self._ttl = ttl_seconds
        self._max = max_entries
        self._clock = clock
        self._entries: OrderedDict[tuple[str, str, str], tuple[float, str]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, token: str, verb: str, path: str) -> Optional[str]:
        key = _key(token, verb, path)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            expires, user = entry
            if self._clock() >= expires:
                del self._entries[key]
                return None
            return user

    def put(self, token: str, verb: str, path: str, user: str) -> None:
        if self._ttl == 0:
            return
        key = _key(token, verb, path)
        with self._lock:
            self._entries[key] = (self._clock() + self._ttl, user)
            self._entries.move_to_end(key)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


def _key(token: str, verb: str, path: str) -> tuple[str, str, str]:
    return hashlib.sha256(token.encode()).hexdigest(), verb, path


class ReviewBudget:
    """A token bucket per source address: `burst` reviews at once, `per_second` on average after that."""

    def __init__(self, burst: int = REVIEWS_BURST, per_second: float = REVIEWS_PER_SECOND,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._burst = float(burst)
        self._rate = per_second
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # source -> (tokens left, when counted)
        self._lock = threading.Lock()

    def take(self, source: str) -> bool:
        """True when `source` may cause one more review now (and counts it)."""
        now = self._clock()
        with self._lock:
            if source not in self._buckets and len(self._buckets) >= _TRACKED_SOURCES:
                self._buckets.clear()
            tokens, then = self._buckets.get(source, (self._burst, now))
            tokens = min(self._burst, tokens + (now - then) * self._rate)
            if tokens < 1:
                self._buckets[source] = (tokens, now)
                return False
            self._buckets[source] = (tokens - 1, now)
            return True


class ApiserverAuthorizer:
    """Answers "may the bearer of this token `verb` this path?" with the apiserver's reviews; allowed answers cached
    `ttl_seconds`, refusals `DENIAL_TTL_SECONDS`, reviews rate-limited per source."""

    def __init__(self, reviews: Reviews, cache: Optional[AllowedCache] = None,
                 denials: Optional[AllowedCache] = None, budget: Optional[ReviewBudget] = None) -> None:
        self._reviews = reviews
        self._cache = cache if cache is not None else AllowedCache()
        self._denials = denials if denials is not None else AllowedCache(DENIAL_TTL_SECONDS)
        self._budget = budget if budget is not None else ReviewBudget()

    @classmethod
    def for_cluster(cls, api: client.ApiClient, ttl_seconds: float = DEFAULT_TTL_SECONDS) -> "ApiserverAuthorizer":
        return cls(ApiserverReviews(api), AllowedCache(ttl_seconds))

    def check(self, token: Optional[str], verb: str, path: str, source: str = "") -> Access:
        """`source` is the caller's address (its review budget). Raises ReviewUnavailable when the apiserver cannot
        be asked (the caller answers 503, not a refusal)."""
        if not token:
            return Access(HTTP_UNAUTHORIZED, "no bearer token: send `Authorization: Bearer <token>` (e.g. a "
                                             "ServiceAccount token bound to the ClusterRole dds-metrics-reader)")
        cached = self._cache.get(token, verb, path)
        if cached is not None:
            return Access(HTTP_OK, "allowed (cached)", cached)
        refused = self._denials.get(token, verb, path)
        if refused is not None:
            status, _, reason = refused.partition(" ")
            return Access(int(status), f"{reason} (refused again within {DENIAL_TTL_SECONDS:g} s)")
        if not self._budget.take(source):
            return Access(HTTP_TOO_MANY_REQUESTS, f"too many token reviews asked from {source or 'this address'}: "
                                                  f"at most {REVIEWS_BURST} at once and {REVIEWS_PER_SECOND:g} a "
                                                  f"second; try again later")
        access = self._review(token, verb, path)
        if access.allowed:
            self._cache.put(token, verb, path, access.user)
        else:
            self._denials.put(token, verb, path, f"{access.status} {access.reason}")
        return access

    def _review(self, token: str, verb: str, path: str) -> Access:
        user = self._reviews.authenticate(token)
        if user is None:
            return Access(HTTP_UNAUTHORIZED, "the apiserver does not accept this token (TokenReview)")
        decision = self._reviews.authorize(user, verb, path)
        if not decision.allowed:
            because = f": {decision.reason}" if decision.reason else ""
            return Access(HTTP_FORBIDDEN, f'user "{user.name}" may not {verb} {path}{because} (bind the ClusterRole '
                                          f"dds-metrics-reader to allow it)", user.name)
        return Access(HTTP_OK, "allowed", user.name)
