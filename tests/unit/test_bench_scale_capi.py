"""The Cluster API scale benchmark's bookkeeping (tests/bench/scale_capi.py): which Machines count as up, when, and the
lines it prints."""

from __future__ import annotations

from typing import Any

from tests.bench.scale_capi import Progress, is_running, report, set_names, split

CREATED = "2026-11-29T05:00:00Z"
CREATED_EPOCH = 1795928400.0  # CREATED as seconds since the epoch


def machine(name: str, phase: str = "Running", node: str = "n") -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if node:
        status["nodeRef"] = {"name": node}
    return {"metadata": {"name": name, "creationTimestamp": CREATED}, "status": status}


def test_a_machine_is_up_once_running_with_a_node_ref() -> None:
    assert is_running(machine("a"))
    assert not is_running(machine("a", phase="Provisioned"))
    assert not is_running(machine("a", node=""))
    assert not is_running({"metadata": {"name": "a"}})


def test_progress_keeps_the_first_look_at_which_a_machine_was_up() -> None:
    progress = Progress()
    progress.observe([machine("a"), machine("b", phase="Provisioning", node="")], now=CREATED_EPOCH + 10)
    progress.observe([machine("a"), machine("b")], now=CREATED_EPOCH + 25)
    assert progress.latency == {"a": 10.0, "b": 25.0}
    assert progress.seen == {"a": CREATED_EPOCH + 10, "b": CREATED_EPOCH + 25}


def test_the_report_gives_the_ratios_against_the_harness_path() -> None:
    capi = {"machines_running": 5000.0, "up_s": 600.0, "apiserver_cpu_s": 300.0, "etcd_cpu_s": 20.0,
            "manager_cpu_s": 120.0}
    harness = {"up_s": 60.0, "apiserver_cpu_s": 100.0, "etcd_cpu_s": 0.0, "harness_cpu_s": 30.0}
    lines = report(5000, 500, "v1.14.2", capi, harness)
    assert lines[0].startswith("bench-scale-capi machines=5000 scale_down=500 cluster-api=v1.14.2 path=cluster-api ")
    assert "up_s=600.0" in lines[0] and "manager_cpu_s=120.0" in lines[0] and "down_s" not in lines[0]
    assert lines[1] == ("bench-scale-capi machines=5000 path=harness up_s=60.0 apiserver_cpu_s=100.0 etcd_cpu_s=0.0 "
                        "harness_cpu_s=30.0")
    assert lines[2] == "bench-scale-capi machines=5000 capi/harness up_s=10.0x apiserver_cpu_s=3.0x etcd_cpu_s=n/a"


def test_a_run_that_did_not_hold_prints_what_it_reached_and_no_baseline() -> None:
    lines = report(5000, 500, "v1.14.2", {"machines_running": 3100.0, "up_s": 1500.0}, None)
    assert lines == ["bench-scale-capi machines=5000 scale_down=500 cluster-api=v1.14.2 path=cluster-api "
                     "machines_running=3100.0 up_s=1500.0"]


def test_machines_split_over_machinesets_as_evenly_as_can_be() -> None:
    assert split(5000, 1) == [5000]
    assert split(4500, 4) == [1125, 1125, 1125, 1125]
    assert split(10, 4) == [3, 3, 2, 2] and sum(split(4999, 7)) == 4999
    assert set_names(1) == ["gpu-workers"] and set_names(3) == ["gpu-workers-0", "gpu-workers-1", "gpu-workers-2"]
