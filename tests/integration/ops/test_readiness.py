"""Readiness follows start-up: /readyz fails `started` until DDS can answer cluster-autoscaler (the cache's first LIST
in, the planner primed, the gRPC server listening), so a Service does not route CA to a replica still starting."""

from __future__ import annotations

import threading
import time

import pytest
import requests

from tests.integration.controller.harness import ControllerHarness

pytestmark = pytest.mark.integration


def readyz(port: int) -> requests.Response:
    return requests.get(f"http://127.0.0.1:{port}/readyz", timeout=5)


def test_readyz_fails_until_start_up_is_done(dds: ControllerHarness, monkeypatch) -> None:
    app = dds.app
    syncing, synced = threading.Event(), threading.Event()
    start_cache = app._start_cache

    def slow_first_list() -> None:  # the first LIST of a large cluster takes a while
        syncing.set()
        synced.wait(30)
        start_cache()

    monkeypatch.setattr(app, "_start_cache", slow_first_list)
    starter = threading.Thread(target=app.start, name="start-up")
    starter.start()
    try:
        assert syncing.wait(30)
        response = readyz(app.ops.port)  # the process answers HTTP already
        assert response.status_code == 503 and "[-]started failed" in response.text, response.text
        synced.set()
        assert app.started.wait(30)
        deadline = time.monotonic() + 10
        while readyz(app.ops.port).status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        response = readyz(app.ops.port)
        assert response.status_code == 200 and "[+]started ok" in response.text, response.text
    finally:
        synced.set()
        starter.join(30)
