"""The SIGKILL campaign on the whole stack (issue 6 "Done when", issue 9 part 1): DDS killed at every named step of
attach, detach, node add and node remove (dds/crashpoints.py) and at random times while a workload keeps all four going,
with the real apiserver, scheduler, kwok nodes and the autoscaler; after every crash and restart, and at the end after
convergence, the invariants of harness/invariants.py must hold.

`make test` runs the short campaign (each step crashed at least once, a few minutes); `make soak` (DDS_SOAK=1) the long
one (at least 100 crashes, each step several times). Both print their figures and, with DDS_RELIABILITY_FIGURES=path,
merge them into that JSON file under "crash" / "crash-soak" (next to the fuzzing figures).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dds import crashpoints
from harness.crash_campaign import CampaignFigures, CampaignOptions, CrashCampaign, WorkloadDriver
from harness.invariants import ClusterHistory, ClusterReader, HistoryBounds, describe
from harness.stack import StackOptions, start_stack
from tests.unit.reliability import figures as reliability_figures

pytestmark = pytest.mark.e2e

SOAK = os.environ.get("DDS_SOAK") == "1"
ORPHAN_TIMEOUT = 20.0
DETACH_LATENCY = (0.5, 1.0)

# Short latencies and cooldowns so one workload cycle (attach, node add, detach, node removal) takes about a minute.
STACK = StackOptions(
    attach_latency=(1.0, 2.0), detach_latency=DETACH_LATENCY, node_provisioning_seconds=4.0,
    gpu_idle_cooldown_seconds=4.0, node_idle_cooldown_seconds=6.0, pool_size=8, workers=2,
    dds_settings={
        # In these lives CA (its 30 s GPU-pod buffer, 2 s scans) answers GPU pods first, through IncreaseSize, and DDS's
        # loop serves what CA does not, e.g. while it backs off after a crash during IncreaseSize. Every other life
        # runs the fast path instead (CampaignOptions.fast_path_every): the loop attaches after 2 s.
        "pending_debounce_seconds": 40.0,
        "orphan_attach_timeout_seconds": ORPHAN_TIMEOUT,
    },
    # A crash during IncreaseSize fails CA's scale-up, and CA backs the group off (5 min by default).
    autoscaler_timings={"initial_node_group_backoff_duration": 3.0, "max_node_group_backoff_duration": 15.0})

SHORT = CampaignOptions(crashes=16, min_per_point=1, slack=0, random_every=4, max_hit=1, machine_failures=1,
                        life_timeout=90.0, budget_seconds=420.0)
LONG = CampaignOptions(crashes=110, min_per_point=3, slack=2, random_every=4, max_hit=3, machine_failures=4,
                       life_timeout=90.0, budget_seconds=4200.0, seed=21)


def run_campaign(workdir: Path, options: CampaignOptions) -> CampaignFigures:
    with start_stack(workdir, STACK) as stack:
        reader = ClusterReader.for_stack(stack)
        # DDS reclaims an orphan after the timeout, in its next loop (1 s), with a detach of at most 1 s; 10 s slack.
        bounds = HistoryBounds(orphan_seconds=ORPHAN_TIMEOUT + 1.0 + DETACH_LATENCY[1] + 10.0)
        with ClusterHistory(reader, bounds) as history:
            driver = WorkloadDriver(stack, seed=options.seed).start()
            campaign = CrashCampaign(stack, options, history, reader)
            try:
                campaign.run()
            finally:
                driver.stop()
            return campaign.finish(driver)


def report(key: str, result: CampaignFigures) -> None:
    reliability_figures.add_summary(f"SIGKILL campaign ({key})", result.lines())
    target = os.environ.get("DDS_RELIABILITY_FIGURES")
    if target:
        reliability_figures.merge_section(Path(target), key, result.as_json())


def check(result: CampaignFigures, options: CampaignOptions) -> None:
    assert result.violations == [], f"{len(result.violations)} invariant violation(s):\n{describe(result.violations)}"
    missing = [name for name in crashpoints.POINTS if result.crashes_by_point[name] < options.min_per_point]
    assert not missing, f"steps crashed fewer than {options.min_per_point} time(s): {missing}; {result.lines()}"
    assert result.crashes >= options.crashes, result.lines()


@pytest.mark.timeout(1200)
def test_sigkill_at_every_step_loses_nothing(tmp_path_factory):
    result = run_campaign(tmp_path_factory.mktemp("crash-campaign"), SHORT)
    report("crash", result)
    check(result, SHORT)


@pytest.mark.slow
@pytest.mark.skipif(not SOAK, reason="the long campaign runs under make soak (DDS_SOAK=1)")
@pytest.mark.timeout(6000)
def test_sigkill_soak_hundred_crashes_lose_nothing(tmp_path_factory):
    result = run_campaign(tmp_path_factory.mktemp("crash-soak"), LONG)
    report("crash-soak", result)
    check(result, LONG)
