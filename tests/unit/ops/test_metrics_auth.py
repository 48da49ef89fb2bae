"""Who may read /metrics and /decisions: the settings that are refused, the cache of allowed answers, and the
operations endpoint over TLS as a scraper and a prober see it (real sockets; the apiserver's reviews are played by a
recording stand-in here, the real ones run in tests/integration/ops/test_metrics_auth_apiserver.py)."""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pytest
import requests
from kubernetes import client
from prometheus_client import CollectorRegistry, Counter

from dds import certs
from dds.commands.serve import run_cluster
from dds.config import Settings
from dds.kube.authn import (DENIAL_TTL_SECONDS, REVIEWS_BURST, REVIEWS_PER_SECOND, AllowedCache, ApiserverAuthorizer,
                            ApiserverReviews, Decision, ReviewBudget, ReviewUnavailable, User)
from dds.ops.http import (MetricsSettingsError, OpsServer, ServingCertificate, build_ops_server,
                          check_metrics_settings)

SCRAPER_TOKEN = "token-of-prometheus"
STRANGER_TOKEN = "token-of-someone-else"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class RecordedReviews:
    """The apiserver's answers: SCRAPER_TOKEN is prometheus, allowed `get` on the granted paths; STRANGER_TOKEN is a
    user without grants; any other token is unknown. Every question asked is recorded."""

    granted: set[str] = field(default_factory=lambda: {"/metrics", "/decisions"})
    asked: list[tuple] = field(default_factory=list)
    unavailable: bool = False

    def authenticate(self, token: str) -> Optional[User]:
        self.asked.append(("TokenReview", token))
        if self.unavailable:
            raise ReviewUnavailable("cannot reach the apiserver for a TokenReview: connection refused")
        users = {SCRAPER_TOKEN: User("system:serviceaccount:monitoring:prometheus", groups=("system:serviceaccounts",)),
                 STRANGER_TOKEN: User("system:serviceaccount:default:stranger")}
        return users.get(token)

    def authorize(self, user: User, verb: str, path: str) -> Decision:
        self.asked.append(("SubjectAccessReview", user.name, verb, path))
        if user.name.endswith(":prometheus") and verb == "get" and path in self.granted:
            return Decision(True, 'RBAC: allowed by ClusterRoleBinding "prometheus-dds"')
        return Decision(False)


# --- the settings that are refused ---

@pytest.mark.parametrize("listen", ["0.0.0.0:8087", ":8087", "[::]:8087", "10.0.0.7:8087", "dds.example:8087"])
def test_a_reachable_address_without_authentication_is_refused_naming_the_settings(listen: str) -> None:
    with pytest.raises(MetricsSettingsError) as refused:
        check_metrics_settings(Settings(metrics_listen=listen))
    assert "metrics_listen" in str(refused.value) and "metrics_secure: true" in str(refused.value)
    assert listen in str(refused.value)


@pytest.mark.parametrize("listen", ["127.0.0.1:8087", "127.0.0.2:0", "[::1]:8087", "localhost:8087"])
def test_loopback_is_served_plainly(listen: str) -> None:
    check_metrics_settings(Settings(metrics_listen=listen))


def test_the_default_is_loopback_and_allowed() -> None:
    settings = Settings()
    assert settings.metrics_listen.startswith("127.0.0.1:") and not settings.metrics_secure
    check_metrics_settings(settings)


def test_secure_needs_a_serving_certificate(tmp_path: Path) -> None:
    with pytest.raises(MetricsSettingsError, match="metrics_tls_cert and metrics_tls_key, or tls_cert and tls_key"):
        check_metrics_settings(Settings(metrics_listen="0.0.0.0:8087", metrics_secure=True))
    with pytest.raises(MetricsSettingsError, match="go together"):
        check_metrics_settings(Settings(metrics_listen="0.0.0.0:8087", metrics_secure=True,
                                        metrics_tls_cert=tmp_path / "tls.crt"))
    check_metrics_settings(Settings(metrics_listen="0.0.0.0:8087", metrics_secure=True,
                                    tls_cert=tmp_path / "tls.crt", tls_key=tmp_path / "tls.key"))


def test_dds_serve_stops_with_the_error_before_reading_the_cluster(tmp_path: Path, capsys) -> None:
    settings = Settings(kubeconfig=tmp_path / "no-such-kubeconfig", insecure=True, metrics_listen="0.0.0.0:8087")
    assert run_cluster(settings) == 2
    error = capsys.readouterr().err
    assert error.startswith("dds serve: metrics_listen '0.0.0.0:8087' is not a loopback address"), error
    assert "no-such-kubeconfig" not in error  # refused before the kubeconfig was even read


def test_authentication_without_tls_is_refused() -> None:
    with pytest.raises(MetricsSettingsError, match="needs TLS"):
        OpsServer("127.0.0.1:0", authorizer=ApiserverAuthorizer(RecordedReviews()))


# --- the cache of allowed answers ---

def authorizer_with(reviews: RecordedReviews, clock: FakeClock, ttl: float = 10.0, size: int = 16
                    ) -> ApiserverAuthorizer:
    return ApiserverAuthorizer(reviews, AllowedCache(ttl_seconds=ttl, max_entries=size, clock=clock),
                               AllowedCache(ttl_seconds=DENIAL_TTL_SECONDS, clock=clock), ReviewBudget(clock=clock))


def test_an_allowed_answer_is_reused_until_it_expires() -> None:
    reviews, clock = RecordedReviews(), FakeClock()
    authorizer = authorizer_with(reviews, clock)
    first = authorizer.check(SCRAPER_TOKEN, "get", "/metrics")
    assert first.allowed and first.user == "system:serviceaccount:monitoring:prometheus"
    assert len(reviews.asked) == 2  # one TokenReview, one SubjectAccessReview
    clock.now += 9.9
    assert authorizer.check(SCRAPER_TOKEN, "get", "/metrics").allowed
    assert len(reviews.asked) == 2  # answered from the cache
    clock.now += 0.1
    assert authorizer.check(SCRAPER_TOKEN, "get", "/metrics").allowed
    assert len(reviews.asked) == 4  # expired: asked again


def test_a_revoked_grant_is_seen_once_the_cached_answer_expires() -> None:
    reviews, clock = RecordedReviews(), FakeClock()
    authorizer = authorizer_with(reviews, clock)
    assert authorizer.check(SCRAPER_TOKEN, "get", "/metrics").allowed
    reviews.granted.clear()
    clock.now += 10
    assert authorizer.check(SCRAPER_TOKEN, "get", "/metrics").status == 403


def test_refusals_are_kept_briefly_so_a_new_grant_applies_within_the_denial_ttl() -> None:
    reviews, clock = RecordedReviews(granted=set()), FakeClock()
    authorizer = authorizer_with(reviews, clock)
    assert authorizer.check(SCRAPER_TOKEN, "get", "/metrics").status == 403
    reviews.granted.add("/metrics")
    assert authorizer.check(SCRAPER_TOKEN, "get", "/metrics").status == 403  # the refusal, kept
    clock.now += DENIAL_TTL_SECONDS
    assert authorizer.check(SCRAPER_TOKEN, "get", "/metrics").allowed  # the new grant, within the denial TTL


def test_a_bad_token_repeated_costs_one_token_review_per_denial_ttl() -> None:
    reviews, clock = RecordedReviews(), FakeClock()
    authorizer = authorizer_with(reviews, clock)
    for _ in range(50):
        assert authorizer.check("unknown-token", "get", "/metrics", source="10.0.0.9").status == 401
    clock.now += DENIAL_TTL_SECONDS
    assert authorizer.check("unknown-token", "get", "/metrics", source="10.0.0.9").status == 401
    assert reviews.asked.count(("TokenReview", "unknown-token")) == 2


def test_token_reviews_are_rate_limited_per_source() -> None:
    reviews, clock = RecordedReviews(), FakeClock()
    authorizer = authorizer_with(reviews, clock)
    answers = [authorizer.check(f"guess-{n}", "get", "/metrics", source="10.0.0.9").status for n in range(100)]
    assert answers.count(401) == REVIEWS_BURST and answers[REVIEWS_BURST:] == [429] * (100 - REVIEWS_BURST)
    assert len([q for q in reviews.asked if q[0] == "TokenReview"]) == REVIEWS_BURST
    # another source, Prometheus, is not held back by the guesser
    assert authorizer.check(SCRAPER_TOKEN, "get", "/metrics", source="10.0.0.2").allowed
    clock.now += 1 / REVIEWS_PER_SECOND  # the guesser's budget refills at REVIEWS_PER_SECOND
    assert authorizer.check("guess-again", "get", "/metrics", source="10.0.0.9").status == 401


def test_an_answer_is_for_its_own_token_and_path_only() -> None:
    reviews, clock = RecordedReviews(granted={"/metrics"}), FakeClock()
    authorizer = authorizer_with(reviews, clock)
    assert authorizer.check(SCRAPER_TOKEN, "get", "/metrics").allowed
    assert authorizer.check(SCRAPER_TOKEN, "get", "/decisions").status == 403
    assert authorizer.check(STRANGER_TOKEN, "get", "/metrics").status == 403


def test_the_cache_keeps_the_newest_entries_and_never_the_token() -> None:
    clock = FakeClock()
    cache = AllowedCache(ttl_seconds=10, max_entries=2, clock=clock)
    for path in ("/a", "/b", "/c"):
        cache.put(SCRAPER_TOKEN, "get", path, "prometheus")
    assert len(cache) == 2
    assert cache.get(SCRAPER_TOKEN, "get", "/a") is None
    assert cache.get(SCRAPER_TOKEN, "get", "/c") == "prometheus"
    assert SCRAPER_TOKEN not in repr(cache._entries)


def test_a_zero_ttl_caches_nothing() -> None:
    reviews, clock = RecordedReviews(), FakeClock()
    authorizer = authorizer_with(reviews, clock, ttl=0)
    authorizer.check(SCRAPER_TOKEN, "get", "/metrics")
    authorizer.check(SCRAPER_TOKEN, "get", "/metrics")
    assert len(reviews.asked) == 4


def test_an_apiserver_that_does_not_answer_is_reported_as_unavailable() -> None:
    with socket.socket() as probe:  # a port nothing listens on once closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    configuration = client.Configuration()
    configuration.host, configuration.verify_ssl, configuration.retries = f"https://127.0.0.1:{port}", False, 0
    reviews = ApiserverReviews(client.ApiClient(configuration))
    with pytest.raises(ReviewUnavailable, match="cannot reach the apiserver for a TokenReview"):
        ApiserverAuthorizer(reviews).check(SCRAPER_TOKEN, "get", "/metrics")


# --- the endpoint over TLS ---

@pytest.fixture(scope="module")
def bundle() -> certs.CertBundle:
    return certs.generate_bundle(["localhost"], ["127.0.0.1"], days=1)


def write_pair(directory: Path, pair: certs.KeyPair) -> tuple[Path, Path]:
    """Write the pair as a Secret volume update does: new files swapped in whole."""
    paths = directory / "tls.crt", directory / "tls.key"
    for path, content in zip(paths, (pair.cert_pem, pair.key_pem)):
        staged = path.with_suffix(".new")
        staged.write_bytes(content)
        os.replace(staged, path)
    return paths


@dataclass
class SecureEndpoint:
    ops: OpsServer
    reviews: RecordedReviews
    ca_file: Path

    def get(self, path: str, token: Optional[str] = None) -> requests.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return requests.get(f"https://127.0.0.1:{self.ops.port}{path}", headers=headers, verify=str(self.ca_file),
                            timeout=5)


@pytest.fixture
def secure(tmp_path: Path, bundle: certs.CertBundle) -> Iterator[SecureEndpoint]:
    registry = CollectorRegistry()
    Counter("dds_test_scrapes_total", "counted by the test", registry=registry).inc()
    (tmp_path / "ca.crt").write_bytes(bundle.ca.cert_pem)
    cert, key = write_pair(tmp_path, bundle.server)
    reviews = RecordedReviews()
    ops = OpsServer("127.0.0.1:0", registry, tls=ServingCertificate(cert, key), authorizer=ApiserverAuthorizer(reviews))
    ops.add_page("/decisions", lambda query: (b"no decisions yet\n", "text/plain; charset=utf-8"))
    ops.start()
    yield SecureEndpoint(ops, reviews, tmp_path / "ca.crt")
    ops.stop()


def test_a_scrape_without_a_token_is_refused_with_401(secure: SecureEndpoint) -> None:
    response = secure.get("/metrics")
    assert response.status_code == 401 and "no bearer token" in response.text
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert secure.reviews.asked == []  # no apiserver request for a missing token


def test_an_unknown_token_is_refused_with_401(secure: SecureEndpoint) -> None:
    response = secure.get("/decisions", token="forged")
    assert response.status_code == 401 and "TokenReview" in response.text


def test_a_token_without_the_grant_is_refused_with_403(secure: SecureEndpoint) -> None:
    response = secure.get("/metrics", token=STRANGER_TOKEN)
    assert response.status_code == 403
    assert 'user "system:serviceaccount:default:stranger" may not get /metrics' in response.text
    assert "dds-metrics-reader" in response.text


def test_an_authorized_token_is_served(secure: SecureEndpoint) -> None:
    metrics = secure.get("/metrics", token=SCRAPER_TOKEN)
    assert metrics.status_code == 200 and "dds_test_scrapes_total 1.0" in metrics.text
    decisions = secure.get("/decisions?format=text", token=SCRAPER_TOKEN)
    assert decisions.status_code == 200 and decisions.text == "no decisions yet\n"
    assert ("SubjectAccessReview", "system:serviceaccount:monitoring:prometheus", "get", "/decisions") \
        in secure.reviews.asked  # the path asked about has no query string


def test_probes_need_no_token(secure: SecureEndpoint) -> None:
    assert secure.get("/healthz").status_code == 200
    assert secure.get("/readyz").status_code == 200
    assert secure.reviews.asked == []


def test_an_apiserver_that_cannot_be_asked_gives_503_not_a_refusal(secure: SecureEndpoint) -> None:
    secure.reviews.unavailable = True
    response = secure.get("/metrics", token=SCRAPER_TOKEN)
    assert response.status_code == 503 and "connection refused" in response.text


def test_plain_http_on_the_tls_port_does_not_stop_the_server(secure: SecureEndpoint) -> None:
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(f"http://127.0.0.1:{secure.ops.port}/metrics", timeout=5)
    assert secure.get("/healthz").status_code == 200


def served_certificate(port: int) -> bytes:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # only reading which certificate is served
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context.wrap_socket(raw) as tls:
            return tls.getpeercert(binary_form=True)


def test_a_renewed_certificate_is_served_without_a_restart(secure: SecureEndpoint, tmp_path: Path) -> None:
    renewed = certs.generate_bundle(["localhost"], ["127.0.0.1"], days=1)
    before = served_certificate(secure.ops.port)
    write_pair(tmp_path, renewed.server)
    after = served_certificate(secure.ops.port)
    assert after != before
    assert ssl.DER_cert_to_PEM_cert(after).encode().strip() == renewed.server.cert_pem.strip()


def test_build_ops_server_follows_the_settings(tmp_path: Path, bundle: certs.CertBundle) -> None:
    cert, key = write_pair(tmp_path, bundle.server)
    plain = build_ops_server(Settings(metrics_listen="127.0.0.1:0"), authorizer=lambda: pytest.fail("not needed"))
    assert plain.tls is None and plain.authorizer is None
    secured = build_ops_server(Settings(metrics_listen="0.0.0.0:0", metrics_secure=True, tls_cert=cert, tls_key=key),
                               authorizer=lambda: ApiserverAuthorizer(RecordedReviews()))
    assert secured.tls is not None and secured.authorizer is not None
