"""ReadyForwarder: a Service in front of DDS replicas — new connections go to a Ready replica, none when none is Ready."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from harness.forwarder import Backend, ReadyForwarder


class NamedServer:
    """Answers every connection with its name, then echoes what it receives."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.ready = False
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._connections: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def backend(self) -> Backend:
        return Backend(self.name, "127.0.0.1", self.port, lambda: self.ready)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self._connections.append(conn)
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    def _echo(self, conn: socket.socket) -> None:
        try:
            conn.sendall(self.name.encode() + b"\n")
            while data := conn.recv(1024):
                conn.sendall(data)
        except OSError:
            pass

    def kill(self) -> None:
        """Close the listener and every open connection, as a killed process's kernel does."""
        for conn in [self._listener, *self._connections]:
            try:
                conn.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept / recv; close alone would not
            except OSError:
                pass
            conn.close()


@pytest.fixture
def replicas() -> Iterator[tuple[NamedServer, NamedServer, ReadyForwarder]]:
    a, b = NamedServer("a"), NamedServer("b")
    forwarder = ReadyForwarder(lambda: [a.backend(), b.backend()]).start()
    yield a, b, forwarder
    forwarder.stop()
    a.kill()
    b.kill()


def dial(forwarder: ReadyForwarder) -> socket.socket:
    conn = socket.create_connection((forwarder.host, forwarder.port), timeout=5)
    conn.settimeout(5)
    return conn


def greeting(conn: socket.socket) -> bytes:
    return conn.recv(1024)


def test_a_connection_goes_to_the_ready_replica_and_bytes_flow_both_ways(replicas):
    a, b, forwarder = replicas
    b.ready = True
    with dial(forwarder) as conn:
        assert greeting(conn) == b"b\n"
        conn.sendall(b"ping")
        assert conn.recv(1024) == b"ping"
    assert forwarder.routed_to("b") == 1 and forwarder.routed_to("a") == 0


def test_without_a_ready_replica_the_connection_is_closed_at_once(replicas):
    _, _, forwarder = replicas
    with dial(forwarder) as conn:
        assert conn.recv(1024) == b""
    assert [r.backend for r in forwarder.routes] == [None]


def test_a_killed_replica_ends_its_connections_and_new_ones_reach_the_new_ready_one(replicas):
    a, b, forwarder = replicas
    a.ready = True
    with dial(forwarder) as first:
        assert greeting(first) == b"a\n"
        a.ready = False
        a.kill()
        assert first.recv(1024) == b""  # the client sees its connection end, and reconnects
    b.ready = True
    with dial(forwarder) as second:
        assert greeting(second) == b"b\n"


def test_a_replica_ready_but_unreachable_is_skipped(replicas):
    a, b, forwarder = replicas
    a.ready = b.ready = True
    a.kill()
    with dial(forwarder) as conn:
        assert greeting(conn) == b"b\n"
