"""Trace-driven evaluation of scaling policies (`dds simulate`, docs/simulation.md).

    from dds.sim import WorkloadParams, build, compare, parse_policies, render_table, simulate
    scenario = build("kubecomp-w4", WorkloadParams(seed=1))
    print(render_table(compare([simulate(scenario, p) for p in parse_policies("all")], scenario.baseline)))

Modules: trace (job files), workloads (built-in scenarios), scenario (cluster and timings), policies, engine (the
discrete-event loop around the production planner and the production simulated fabric), ideal (the ideal pool: the
bound every policy is measured against), results, plots, progress.
"""

from dds.sim.engine import SimResult, Simulation, simulate
from dds.sim.policies import POLICIES, Policy, parse_policies
from dds.sim.results import Summary, compare, render_table
from dds.sim.scenario import ClusterSpec, Scenario, Timing
from dds.sim.trace import Job, TraceError, load_trace
from dds.sim.workloads import WorkloadParams, build

__all__ = ["SimResult", "Simulation", "simulate", "POLICIES", "Policy", "parse_policies", "Summary", "compare",
           "render_table", "ClusterSpec", "Scenario", "Timing", "Job", "TraceError", "load_trace", "WorkloadParams",
           "build"]
