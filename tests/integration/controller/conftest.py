from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.controller.harness import ControllerHarness


@pytest.fixture
def dds(control_plane: Any, namespace: str) -> Iterator[ControllerHarness]:
    harness = ControllerHarness(control_plane.api_client(), namespace)
    try:
        yield harness
    finally:
        harness.close()
