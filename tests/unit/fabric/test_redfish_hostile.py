"""The Redfish service as an untrusted peer: a service that lies about where to log in, links or redirects to another
host, answers with megabytes or drips its answer must get no credential out of DDS, and cannot stall it or overflow its
operation log (docs/redfish.md, "the service is an untrusted peer")."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY

from dds.config import RedfishSettings
from dds.fabric.base import AttachRequest, ErrorCode, FabricError, OperationState
from dds.fabric.redfish import MAX_MESSAGE_CHARS, RedfishFabric
from dds.fabric.state import InMemoryFabricStateStore
from harness.redfish_emulator import ROOT, SESSIONS, SYSTEMS, CredentialTrap
from tests.unit.fabric.contract import MODEL, NODE_A, POOL
from tests.unit.fabric.harnesses import RedfishHarness, contract_pools, wait_until_done

BASIC = base64.b64encode(b"dds:secret").decode()  # what basic authentication would send


@pytest.fixture
def h() -> Iterator[RedfishHarness]:
    harness = RedfishHarness(composition_latency_s=0.05, decomposition_latency_s=0.05)
    yield harness
    harness.close()


@pytest.fixture
def trap() -> Iterator[CredentialTrap]:
    other_host = CredentialTrap()
    yield other_host
    other_host.stop()


def fabric_for(h: RedfishHarness, **settings: object) -> RedfishFabric:
    return RedfishFabric(RedfishSettings(endpoint=h.emulator.url, username="dds", **settings), password="secret",
                         clock=time.time, store=InMemoryFabricStateStore(), pools=contract_pools())


def tokens_sent_to(trap: CredentialTrap) -> list[str]:
    return [headers["x-auth-token"] for _, _, headers, _ in trap.received if "x-auth-token" in headers]


def test_a_login_link_to_another_host_gets_no_password_and_a_clear_error(h: RedfishHarness,
                                                                         trap: CredentialTrap) -> None:
    h.config.faults.sessions_link = trap.url + SESSIONS
    with pytest.raises(FabricError) as refused:
        fabric_for(h)
    assert refused.value.code == ErrorCode.BACKEND
    assert trap.url in refused.value.message and "outside the configured endpoint" in refused.value.message
    assert trap.received == []


@pytest.mark.parametrize("sessions_link", [pytest.param("", id="basic-auth"), pytest.param(None, id="session")])
def test_a_member_on_another_host_is_refused_and_gets_no_credential(h: RedfishHarness, trap: CredentialTrap,
                                                                    sessions_link: object) -> None:
    h.config.faults.sessions_link = sessions_link  # type: ignore[assignment]
    fabric = fabric_for(h)
    h.config.faults.foreign_members = [trap.url + SYSTEMS + "/stolen"]
    with pytest.raises(FabricError) as refused:
        fabric.pools()
    assert refused.value.code == ErrorCode.BACKEND and "outside the configured endpoint" in refused.value.message
    assert trap.received == [] and trap.secrets_seen("secret", BASIC) == []
    fabric.close()


def test_a_redirect_to_another_host_is_not_followed_and_the_session_token_stays_home(h: RedfishHarness,
                                                                                     trap: CredentialTrap) -> None:
    fabric = fabric_for(h)
    h.config.faults.redirects = {SYSTEMS: trap.url + SYSTEMS}
    with pytest.raises(FabricError) as refused:
        fabric.pools()
    assert "redirected to" in refused.value.message and trap.url in refused.value.message
    assert trap.received == [] and tokens_sent_to(trap) == []
    fabric.close()


def test_a_redirect_within_the_service_is_followed(h: RedfishHarness) -> None:
    h.config.faults.redirects = {SYSTEMS: SYSTEMS + "/"}  # a service that wants its collections with a slash
    h.emulator.requests.clear()
    assert POOL in [p.name for p in h.fabric.pools()]
    assert h.emulator.requests.count(("GET", SYSTEMS)) == 2  # asked, redirected, asked again where it said


def test_a_refusal_of_megabytes_is_stored_bounded_and_the_next_attach_works(h: RedfishHarness) -> None:
    h.config.faults.refusal_chars = 2_000_000
    h.fabric.attach(AttachRequest(key="huge", node=NODE_A, pool=POOL, model=MODEL, count=1))
    op = wait_until_done(lambda: h.fabric, "huge")
    assert op.state == OperationState.FAILED and op.error is not None
    assert op.error.message.startswith("The composition was refused: zzz")
    assert len(op.error.message) <= MAX_MESSAGE_CHARS and "characters in all" in op.error.message
    document, _ = h.store.load()
    assert len(json.dumps(document)) < 16 * 1024  # the operation log's ConfigMap holds 1 MiB in all
    h.fabric.attach(AttachRequest(key="next", node=NODE_A, pool=POOL, model=MODEL, count=1))
    assert wait_until_done(lambda: h.fabric, "next").state == OperationState.SUCCEEDED


def test_an_answer_over_the_size_bound_is_refused_naming_the_setting(h: RedfishHarness) -> None:
    fabric = fabric_for(h, max_response_bytes=64 * 1024)
    h.config.faults.padding_bytes = 200 * 1024
    with pytest.raises(FabricError) as refused:
        fabric.pools()
    assert refused.value.code == ErrorCode.BACKEND and "redfish.max_response_bytes" in refused.value.message
    h.config.faults.padding_bytes = 0
    assert POOL in [p.name for p in fabric.pools()]  # the service answering normally again is served again
    fabric.close()


def test_a_dripped_answer_is_cut_off_at_the_timeout(h: RedfishHarness) -> None:
    fabric = fabric_for(h, timeout_seconds=1.5)
    h.config.faults.drip_seconds = 0.05  # the service root (a few KiB) would take minutes
    started = time.monotonic()
    with pytest.raises(FabricError) as refused:
        fabric.pools()
    assert refused.value.code == ErrorCode.TIMEOUT and "redfish.timeout_seconds" in refused.value.message
    assert time.monotonic() - started < 30  # far less than the dripped answer would take (a loose, load-proof bound)
    h.config.faults.drip_seconds = 0.0
    fabric.close()


def test_an_unverified_service_is_accepted_loudly(h: RedfishHarness, caplog: pytest.LogCaptureFixture) -> None:
    fabric = fabric_for(h)  # the emulator serves http://: nothing tells DDS who answers
    assert REGISTRY.get_sample_value("dds_redfish_tls_unverified") == 1
    assert any("NOT verified" in r.getMessage() and "password" in r.getMessage() for r in caplog.records
               if r.levelname == "WARNING")
    fabric.close()
