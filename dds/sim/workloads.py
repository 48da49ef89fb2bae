"""Built-in scenarios: KubeComp's jobs A–E and workloads 1–4, its single-pool, reallocation and multi-pool setups, and
two of our own (an elastic cluster where nodes can be added, and a 50-node scale test).

Numbers from the paper (Ting et al., "KubeComp", Tables I/II and §VI) are used as they are; where the paper is silent we
choose, and say so in `Scenario.notes` (printed with the results) and in docs/simulation.md:

- Job CPU and GPU requests: Table I (A 80 cores/1 GPU, B 40/1, C 40/2, D 40/4, E 40/8). Memory is not given: 64 GiB
  for A, 32 GiB for the others, against 768 GiB nodes, so memory never binds (as in the paper, where only CPU and GPU
  matter).
- Job duration: 5 minutes (§VI-A3: "Each job runs for five minutes").
- Workload mixes: Table II, as exact counts (largest remainder), in a seeded random order.
- Arrivals: Poisson (exponential gaps). The paper gives the means only for the reallocation study (30/60/120 s); for
  workloads 1–4 we use 60 s and 50 jobs.
- Testbed: two nodes of 192 logical cores sharing one 8-GPU pool (V100), up to 8 GPUs per node (§VI-A1).
- Multi-pool: pools of 24 GPUs shared by 4 nodes, preconfigured 4/4/8/8 (§VI-E2). The SenseTime Helios traces are
  not redistributable here: we generate a Helios-*like* trace (documented in `helios_like_jobs`), so our multi-pool
  numbers are comparable to the paper's in kind, not in value.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Callable, Mapping, Optional, Sequence

from dds.config import PoolSpec
from dds.model.cxl import cxl_model
from dds.model.groups import DEFAULT_GPU_IDLE_COOLDOWN_SECONDS, LABEL_NODE_GROUP, NodeGroupSpec
from dds.sim.kueue import KueueQueue
from dds.sim.scenario import SIM_SOURCE, ClusterSpec, Scenario, Timing
from dds.sim.trace import Job

GiB = 2**30
KUBECOMP_MODEL = "V100"
KUBECOMP_NODE_CORES = 192
KUBECOMP_NODE_MEMORY = 768 * GiB
KUBECOMP_JOB_SECONDS = 300.0
# Production's default (a group without dds.cdi.dev/gpu-idle-cooldown), so a simulation with default settings is what a
# cluster gets. It used to be 60 s here against production's 10 minutes; both are now the measured 5 minutes.
SIM_GPU_IDLE_COOLDOWN_S = DEFAULT_GPU_IDLE_COOLDOWN_SECONDS
SIM_NODE_IDLE_COOLDOWN_S = 600.0


@dataclass(frozen=True)
class JobType:
    name: str
    cores: int
    gpus: int
    memory: int


# KubeComp Table I.
JOB_TYPES: Mapping[str, JobType] = MappingProxyType({
    "A": JobType("A", 80, 1, 64 * GiB),
    "B": JobType("B", 40, 1, 32 * GiB),
    "C": JobType("C", 40, 2, 32 * GiB),
    "D": JobType("D", 40, 4, 32 * GiB),
    "E": JobType("E", 40, 8, 32 * GiB),
})

# KubeComp Table II (shares of jobs A–E).
WORKLOAD_MIXES: Mapping[int, Mapping[str, float]] = MappingProxyType({
    1: MappingProxyType({"A": 0.50, "B": 0.50}),
    2: MappingProxyType({"A": 0.50, "C": 0.50}),
    3: MappingProxyType({"A": 0.25, "B": 0.25, "C": 0.25, "D": 0.25}),
    4: MappingProxyType({"A": 0.24, "B": 0.24, "C": 0.24, "D": 0.24, "E": 0.04}),
})


@dataclass(frozen=True)
class WorkloadParams:
    """What a user may change about a generated workload from the command line (None = the scenario's default)."""

    seed: int = 1
    jobs: Optional[int] = None
    mean_interval_s: Optional[float] = None
    pools: Optional[int] = None  # multi-pool scenarios: how many pools
    gpu_idle_cooldown_s: Optional[float] = None
    timing: Optional[Timing] = None


# --- job generators ---

def poisson_arrivals(count: int, mean_interval_s: float, rng: random.Random) -> tuple[float, ...]:
    """`count` arrival times: the first at 0, then exponential gaps of the given mean (a Poisson process)."""
    if count < 0:
        raise ValueError(f"job count must be >= 0, got {count}")
    if mean_interval_s <= 0:
        raise ValueError(f"mean interval must be > 0 seconds, got {mean_interval_s}")
    times, now = [], 0.0
    for index in range(count):
        if index:
            now += rng.expovariate(1.0 / mean_interval_s)
        times.append(round(now, 3))
    return tuple(times)


def exact_counts(mix: Mapping[str, float], count: int) -> dict[str, int]:
    """Jobs per type so the shares hold exactly (largest remainder; ties by type name)."""
    total = sum(mix.values())
    if total <= 0:
        raise ValueError("a workload mix needs a positive share")
    raw = {name: count * share / total for name, share in mix.items()}
    counts = {name: math.floor(value) for name, value in raw.items()}
    short = count - sum(counts.values())
    for name in sorted(raw, key=lambda n: (-(raw[n] - counts[n]), n))[:short]:
        counts[name] += 1
    return counts


def mix_jobs(mix: Mapping[str, float], count: int, mean_interval_s: float, seed: int, prefix: str = "job",
             duration_s: float = KUBECOMP_JOB_SECONDS, model: Optional[str] = None) -> tuple[Job, ...]:
    """KubeComp-style jobs: exact shares of job types A–E in a seeded random order, Poisson arrivals."""
    unknown = sorted(set(mix) - set(JOB_TYPES))
    if unknown:
        raise ValueError(f"unknown job type(s) {', '.join(unknown)}; known: {', '.join(JOB_TYPES)}")
    rng = random.Random(seed)
    kinds = [name for name, n in sorted(exact_counts(mix, count).items()) for _ in range(n)]
    rng.shuffle(kinds)
    arrivals = poisson_arrivals(count, mean_interval_s, rng)
    width = len(str(max(count - 1, 0)))
    jobs = []
    for index, (kind, arrival) in enumerate(zip(kinds, arrivals)):
        spec = JOB_TYPES[kind]
        jobs.append(Job(name=f"{prefix}-{index:0{width}d}-{kind.lower()}", arrival_s=arrival, duration_s=duration_s,
                        milli_cpu=spec.cores * 1000, memory=spec.memory, gpus=spec.gpus, gpu_model=model))
    return tuple(jobs)


# Helios-like job shape (our choice, see module docstring): most jobs take one GPU, a minority take a whole node;
# durations are heavy-tailed (log-normal, median 10 minutes, capped at 4 hours); 12 cores and 32 GiB per GPU.
HELIOS_LIKE_GPUS: Mapping[int, float] = MappingProxyType({1: 0.55, 2: 0.15, 4: 0.15, 8: 0.15})
HELIOS_LIKE_MEDIAN_S = 600.0
HELIOS_LIKE_SIGMA = 1.0
HELIOS_LIKE_MAX_S = 4 * 3600.0


def helios_like_jobs(count: int, total_gpus: int, target_load: float, seed: int,
                     mean_interval_s: Optional[float] = None, prefix: str = "job") -> tuple[Job, ...]:
    """A synthetic trace shaped like SenseTime Helios (not the real one), arriving at `target_load` of `total_gpus`."""
    rng = random.Random(seed)
    sizes = list(HELIOS_LIKE_GPUS)
    weights = [HELIOS_LIKE_GPUS[s] for s in sizes]
    shapes = []
    for _ in range(count):
        gpus = rng.choices(sizes, weights)[0]
        duration = min(HELIOS_LIKE_MAX_S, HELIOS_LIKE_MEDIAN_S * math.exp(rng.gauss(0.0, HELIOS_LIKE_SIGMA)))
        shapes.append((gpus, round(max(duration, 30.0), 1)))
    if mean_interval_s is None:
        gpu_seconds = sum(g * d for g, d in shapes) / max(count, 1)
        mean_interval_s = gpu_seconds / (target_load * total_gpus)
    arrivals = poisson_arrivals(count, mean_interval_s, rng)
    width = len(str(max(count - 1, 0)))
    return tuple(Job(name=f"{prefix}-{index:0{width}d}", arrival_s=arrival, duration_s=duration,
                     milli_cpu=12_000 * gpus, memory=32 * GiB * gpus, gpus=gpus)
                 for index, ((gpus, duration), arrival) in enumerate(zip(shapes, arrivals)))


# --- clusters ---

def gpu_group(group_id: str, *, nodes: int, max_nodes: Optional[int] = None, cores: int = KUBECOMP_NODE_CORES,
              memory: int = KUBECOMP_NODE_MEMORY, max_gpus: int = 8, pool: str = "pool-0",
              models: Sequence[str] = (KUBECOMP_MODEL,), gpu_idle_cooldown_s: float = SIM_GPU_IDLE_COOLDOWN_S,
              node_idle_cooldown_s: float = SIM_NODE_IDLE_COOLDOWN_S, max_cxl_memory: int = 0,
              cxl_memory_chunk: int = 0) -> NodeGroupSpec:
    """A spec-fixed DDS group of identical servers attached to one fabric pool (taking up to `max_cxl_memory` bytes
    of CXL memory in chunks of `cxl_memory_chunk`, if given: docs/cxl-memory.md)."""
    top = nodes if max_nodes is None else max_nodes
    return NodeGroupSpec(id=group_id, min_size=min(nodes, top), max_size=top, replicas=nodes, milli_cpu=cores * 1000,
                         memory=memory, max_gpus_per_node=max_gpus, fabric_pool=pool, gpu_models=tuple(models),
                         labels={LABEL_NODE_GROUP: group_id}, gpu_idle_cooldown_seconds=gpu_idle_cooldown_s,
                         node_idle_cooldown_seconds=node_idle_cooldown_s, source=SIM_SOURCE,
                         max_cxl_memory=max_cxl_memory, cxl_memory_chunk=cxl_memory_chunk)


def single_pool_cluster(nodes: int, pool_gpus: int, layout: Optional[Sequence[int]] = None, max_gpus: int = 8,
                        gpu_idle_cooldown_s: float = SIM_GPU_IDLE_COOLDOWN_S) -> ClusterSpec:
    group = gpu_group("workers", nodes=nodes, max_gpus=max_gpus, gpu_idle_cooldown_s=gpu_idle_cooldown_s)
    preconfigured = {"workers": tuple(layout)} if layout is not None else {}
    return ClusterSpec(groups=(group,), pools=(PoolSpec(name="pool-0", devices={KUBECOMP_MODEL: pool_gpus}),),
                       initial_nodes={"workers": nodes}, preconfigured=preconfigured)


def multi_pool_cluster(pools: int, gpu_idle_cooldown_s: float = SIM_GPU_IDLE_COOLDOWN_S) -> ClusterSpec:
    """KubeComp §VI-E2: each pool holds 24 GPUs shared by 4 nodes; preconfigured 4/4/8/8 per pool."""
    if pools < 1:
        raise ValueError(f"a multi-pool cluster needs at least one pool, got {pools}")
    groups, specs, initial, layout = [], [], {}, {}
    for index in range(pools):
        pool, group_id = f"pool-{index}", f"rack-{index}"
        groups.append(gpu_group(group_id, nodes=4, pool=pool, gpu_idle_cooldown_s=gpu_idle_cooldown_s))
        specs.append(PoolSpec(name=pool, devices={KUBECOMP_MODEL: 24}))
        initial[group_id] = 4
        layout[group_id] = (4, 4, 8, 8)
    return ClusterSpec(groups=tuple(groups), pools=tuple(specs), initial_nodes=initial, preconfigured=layout)


# --- scenarios ---

def _cooldown(params: WorkloadParams) -> float:
    return SIM_GPU_IDLE_COOLDOWN_S if params.gpu_idle_cooldown_s is None else params.gpu_idle_cooldown_s


def _timing(params: WorkloadParams) -> Timing:
    return params.timing or Timing()


def kubecomp_workload(number: int, params: WorkloadParams) -> Scenario:
    """KubeComp §VI-B: workload 1–4 on the two-node testbed with one 8-GPU pool (even 4/4 as the static layout)."""
    jobs = params.jobs or 50
    interval = params.mean_interval_s or 60.0
    cluster = single_pool_cluster(nodes=2, pool_gpus=8, layout=(4, 4), gpu_idle_cooldown_s=_cooldown(params))
    return Scenario(
        name=f"kubecomp-w{number}", cluster=cluster, timing=_timing(params), seed=params.seed,
        description=f"KubeComp workload {number} (Table II) on the testbed: 2 nodes x 192 cores, one 8-GPU pool",
        jobs=mix_jobs(WORKLOAD_MIXES[number], jobs, interval, params.seed),
        notes=(f"{jobs} jobs, Poisson mean gap {interval:g} s, 5 min each (paper: duration only)",
               "static = even 4/4; static-concentrated = 8/0 (the paper's two fixed settings)"))


def kubecomp_single_pool(params: WorkloadParams) -> Scenario:
    """KubeComp §VI-E1: 4 nodes and a 24-GPU pool running a mix of job A and job E (here half and half)."""
    jobs = params.jobs or 100
    interval = params.mean_interval_s or 60.0
    cluster = single_pool_cluster(nodes=4, pool_gpus=24, layout=(6, 6, 6, 6), gpu_idle_cooldown_s=_cooldown(params))
    return Scenario(
        name="kubecomp-ae", cluster=cluster, timing=_timing(params), seed=params.seed,
        description="KubeComp single-pool simulation: 4 nodes, 24-GPU pool, jobs A and E half and half",
        jobs=mix_jobs({"A": 0.5, "E": 0.5}, jobs, interval, params.seed),
        notes=(f"{jobs} jobs, Poisson mean gap {interval:g} s (paper: not given)",
               "static = 6 GPUs per node; static-concentrated = 8/8/8/0"))


def kubecomp_reallocation(mean_interval_s: float, params: WorkloadParams) -> Scenario:
    """KubeComp §VI-F: 5 nodes with 6 GPUs each (a 30-GPU pool), 50 jobs A–E in equal shares."""
    jobs = params.jobs or 50
    interval = params.mean_interval_s or mean_interval_s
    cluster = single_pool_cluster(nodes=5, pool_gpus=30, layout=(6,) * 5, gpu_idle_cooldown_s=_cooldown(params))
    return Scenario(
        name=f"kubecomp-realloc-{mean_interval_s:g}", cluster=cluster, timing=_timing(params), seed=params.seed,
        description=f"KubeComp reallocation study: 5 nodes x 6 GPUs, jobs A-E equal, Poisson mean {interval:g} s",
        jobs=mix_jobs({k: 0.2 for k in "ABCDE"}, jobs, interval, params.seed),
        notes=(f"{jobs} jobs, Poisson mean gap {interval:g} s (paper: 30/60/120 s)",
               "reallocated GPUs = devices that arrive on a node other than the one they last served"))


def kubecomp_multipool(params: WorkloadParams) -> Scenario:
    pools = params.pools or 4
    cluster = multi_pool_cluster(pools, gpu_idle_cooldown_s=_cooldown(params))
    jobs = params.jobs or 200 * pools
    return Scenario(
        name="kubecomp-multipool", cluster=cluster, timing=_timing(params), seed=params.seed,
        description=f"KubeComp multi-pool: {pools} pool(s) of 24 GPUs x 4 nodes, Helios-like synthetic trace",
        jobs=helios_like_jobs(jobs, cluster.total_gpus(), 0.85, params.seed, params.mean_interval_s),
        notes=(f"{jobs} jobs from a Helios-LIKE generator at 85% offered GPU load (not the SenseTime trace)",
               "static = 4/4/8/8 per pool (the paper's preconfigured cluster)"))


def elastic(params: WorkloadParams) -> Scenario:
    """Our scenario for node-only vs attach-first: 2 servers to start, up to 12, a 48-GPU A30 pool."""
    cooldown = _cooldown(params)
    group = gpu_group("gpu-workers", nodes=2, max_nodes=12, cores=64, memory=512 * GiB, max_gpus=8, pool="pool-0",
                      models=("A30",), gpu_idle_cooldown_s=cooldown)
    cluster = ClusterSpec(groups=(group,), pools=(PoolSpec(name="pool-0", devices={"A30": 48}),),
                          initial_nodes={"gpu-workers": 2}, preconfigured={"gpu-workers": (2, 2)})
    count = params.jobs or 200
    interval = params.mean_interval_s or 90.0
    rng = random.Random(params.seed)
    arrivals = poisson_arrivals(count, interval, rng)
    jobs = []
    for index, arrival in enumerate(arrivals):
        gpus = rng.choices((1, 2, 4, 8), (0.5, 0.25, 0.15, 0.10))[0]
        duration = round(max(60.0, rng.expovariate(1 / 1200.0)), 1)
        jobs.append(Job(name=f"job-{index:03d}", arrival_s=arrival, duration_s=duration, milli_cpu=8000,
                        memory=32 * GiB, gpus=gpus))
    return Scenario(
        name="elastic", cluster=cluster, timing=_timing(params), seed=params.seed, jobs=tuple(jobs),
        baseline="node-only",
        description="2-12 servers (64 cores, up to 8 GPUs), 48-GPU pool; 1/2/4/8-GPU jobs, ~20 min each",
        notes=(f"{count} jobs, Poisson mean gap {interval:g} s; node-only servers boot with 8 fixed GPUs",))


def scale_test(params: WorkloadParams) -> Scenario:
    """1,000 jobs on 50 nodes (5 pools of 10 nodes x 40 GPUs): the simulator's own speed benchmark."""
    cooldown = _cooldown(params)
    groups, pools, initial = [], [], {}
    for index in range(5):
        groups.append(gpu_group(f"rack-{index}", nodes=10, pool=f"pool-{index}", gpu_idle_cooldown_s=cooldown))
        pools.append(PoolSpec(name=f"pool-{index}", devices={KUBECOMP_MODEL: 40}))
        initial[f"rack-{index}"] = 10
    cluster = ClusterSpec(groups=tuple(groups), pools=tuple(pools), initial_nodes=initial)
    count = params.jobs or 1000
    interval = params.mean_interval_s or 4.0
    return Scenario(
        name="scale-50x1000", cluster=cluster, timing=_timing(params), seed=params.seed,
        description="50 nodes in 5 pools of 40 GPUs; KubeComp workload 4 mix",
        jobs=mix_jobs(WORKLOAD_MIXES[4], count, interval, params.seed),
        notes=(f"{count} jobs, Poisson mean gap {interval:g} s (about 80% offered GPU load)",))


GANG_SHAPES = ((0.70, "single", 1, 1), (0.25, "ddp", 4, 2), (0.05, "oversized", 3, 8))  # share, kind, pods, GPUs


def gang_jobs(count: int, mean_interval_s: float, seed: int) -> tuple[Job, ...]:
    """Our AI mix: `count` jobs (pods), submitted at Poisson arrivals: 70% of submissions single 1-GPU jobs
    (exponential, mean 15 min); 25% data-parallel gangs of 4 pods x 2 GPUs that must start together (mean 30 min);
    5% gangs of 3 x 8 GPUs, more than the pool holds, which can never start (what a gang-unaware planner strands GPUs
    on). A gang that would overshoot `count` is submitted as a single job."""
    rng = random.Random(seed)
    jobs: list[Job] = []
    for index, arrival in enumerate(poisson_arrivals(count, mean_interval_s, rng)):
        if len(jobs) >= count:
            break
        pick, kind, pods, gpus = rng.random(), "single", 1, 1
        for share, kind, pods, gpus in GANG_SHAPES:
            if pick < share:
                break
            pick -= share
        if len(jobs) + pods > count:
            kind, pods, gpus = "single", 1, 1
        mean = 900.0 if kind == "single" else 1800.0
        duration = round(max(60.0, rng.expovariate(1 / mean)), 1)
        group = None if kind == "single" else f"{kind}-{index:03d}"
        for member in range(pods):
            name = f"{kind}-{index:03d}" + (f"-{member}" if group else "")
            jobs.append(Job(name=name, arrival_s=arrival, duration_s=duration, milli_cpu=8000 * gpus,
                            memory=32 * GiB * gpus, gpus=gpus, gpu_model="A30", group=group,
                            group_min=pods if group else 0))
    return tuple(jobs)


def gangs(params: WorkloadParams) -> Scenario:
    """Gang workloads: 4 fixed nodes of 64 cores sharing a 16-GPU A30 pool, gangs mixed with single jobs."""
    group = gpu_group("gpu-workers", nodes=4, cores=64, memory=512 * GiB, max_gpus=8, models=("A30",),
                      gpu_idle_cooldown_s=_cooldown(params))
    cluster = ClusterSpec(groups=(group,), pools=(PoolSpec(name="pool-0", devices={"A30": 16}),),
                          initial_nodes={"gpu-workers": 4}, preconfigured={"gpu-workers": (4, 4, 4, 4)})
    count = params.jobs or 180
    interval = params.mean_interval_s or 300.0
    return Scenario(
        name="gangs", cluster=cluster, timing=_timing(params), seed=params.seed,
        jobs=gang_jobs(count, interval, params.seed),
        description="4 nodes (64 cores, up to 8 GPUs), 16-GPU pool; single jobs and gangs that start together",
        notes=(f"{count} jobs; submissions at Poisson mean gap {interval:g} s: 70% 1-GPU jobs, 25% gangs of "
               f"4 x 2 GPUs, 5% gangs of 3 x 8 GPUs that cannot fit the pool",
               "the scheduler starts a gang only whole (coscheduling); gang-unaware = best-fit planning its pods "
               "one by one"))


# The memory-heavy mix (our choice): share, kind, GPUs, cores, memory. Training jobs ask for memory with their GPUs;
# inference jobs that keep their model's weights and cache in host memory ask for one GPU and 160 GiB; CPU-only
# data-preparation jobs for 192 GiB. Every job fits a node's own 256 GiB: only how many fit at once depends on memory.
CXL_MEMORY_SHAPES = ((0.55, "train", 0, 8, 32 * GiB), (0.30, "infer", 1, 8, 160 * GiB),
                     (0.15, "etl", 0, 16, 192 * GiB))  # train: 1/2/4 GPUs, 8 cores and 32 GiB per GPU
CXL_TRAIN_GPUS = ((1, 0.5), (2, 0.3), (4, 0.2))
CXL_NODE_MEMORY = 256 * GiB
CXL_MAX_PER_NODE = 256 * GiB
CXL_CHUNK = 32 * GiB
CXL_POOL_CHUNKS = 32  # 1 TiB of CXL memory in the pool
CXL_POOL_GPUS = 32


def cxl_memory_jobs(count: int, mean_interval_s: float, seed: int) -> tuple[Job, ...]:
    """`count` jobs at Poisson arrivals, of the CXL_MEMORY_SHAPES mix, each lasting an exponential time of mean
    20 minutes (at least one)."""
    rng = random.Random(seed)
    jobs = []
    width = len(str(max(count - 1, 0)))
    for index, arrival in enumerate(poisson_arrivals(count, mean_interval_s, rng)):
        pick = rng.random()
        share, kind, gpus, cores, memory = CXL_MEMORY_SHAPES[-1]
        for share, kind, gpus, cores, memory in CXL_MEMORY_SHAPES:
            if pick < share:
                break
            pick -= share
        if kind == "train":
            gpus = rng.choices([g for g, _ in CXL_TRAIN_GPUS], [w for _, w in CXL_TRAIN_GPUS])[0]
            cores, memory = cores * gpus, memory * gpus
        duration = round(max(60.0, rng.expovariate(1 / 1200.0)), 1)
        jobs.append(Job(name=f"{kind}-{index:0{width}d}", arrival_s=arrival, duration_s=duration,
                        milli_cpu=cores * 1000, memory=memory, gpus=gpus, gpu_model="A30" if gpus else None))
    return tuple(jobs)


def cxl_memory(params: WorkloadParams) -> Scenario:
    """Memory demand (issue 43): 2-10 servers of 256 GiB that take up to 256 GiB of CXL memory each, in 32 GiB chunks,
    from a pool of 32 A30s and 1 TiB of CXL memory. `dds simulate` runs it again GPU-only (no CXL memory) and compares."""
    group = gpu_group("gpu-workers", nodes=2, max_nodes=10, cores=64, memory=CXL_NODE_MEMORY, max_gpus=8,
                      pool="pool-0", models=("A30",), gpu_idle_cooldown_s=_cooldown(params),
                      max_cxl_memory=CXL_MAX_PER_NODE, cxl_memory_chunk=CXL_CHUNK)
    pool = PoolSpec(name="pool-0", devices={"A30": CXL_POOL_GPUS, cxl_model(CXL_CHUNK): CXL_POOL_CHUNKS})
    cluster = ClusterSpec(groups=(group,), pools=(pool,), initial_nodes={"gpu-workers": 2},
                          preconfigured={"gpu-workers": (2, 2)})
    count = params.jobs or 200
    interval = params.mean_interval_s or 90.0
    return Scenario(
        name="cxl-memory", cluster=cluster, timing=_timing(params), seed=params.seed, baseline="node-only",
        jobs=cxl_memory_jobs(count, interval, params.seed),
        description="2-10 servers (64 cores, 256 GiB, up to 8 GPUs and 256 GiB of CXL memory), pool of 32 A30s and "
                    f"{CXL_POOL_CHUNKS} x 32 GiB of CXL memory; memory-heavy jobs",
        notes=(f"{count} jobs, Poisson mean gap {interval:g} s, ~20 min each: 55% training (1/2/4 GPUs, 8 cores and "
               "32 GiB per GPU), 30% inference (1 GPU, 160 GiB), 15% data preparation (no GPU, 16 cores, 192 GiB)",
               "every job fits a node's own memory; attach-first policies also run GPU-only (no CXL memory) and are "
               "compared with it"))


# Kueue jobs (our choice): share, pods, GPUs per pod. Data-parallel training as in tests/e2e/test_kueue.py (4 pods x
# 2 GPUs), jobs of 2 x 4 GPUs, single 4-GPU and 8-GPU jobs; 8 cores and 32 GiB per GPU.
KUEUE_SHAPES = ((0.40, 4, 2), (0.20, 2, 4), (0.30, 1, 4), (0.10, 1, 8))
KUEUE_POOL_GPUS = 32


def kueue_jobs(count: int, mean_interval_s: float, seed: int) -> tuple[Job, ...]:
    """Kueue jobs of `count` pods in all (trace rows; the last job is cut to what is left), submitted at Poisson
    arrivals, of the KUEUE_SHAPES mix, each lasting an exponential time of mean 30 minutes (at least one); a job's
    pods are one gang (`group`), all of them needed at once."""
    rng = random.Random(seed)
    jobs: list[Job] = []
    for index, arrival in enumerate(poisson_arrivals(count, mean_interval_s, rng)):
        if len(jobs) >= count:
            break
        pick = rng.random()
        share, pods, gpus = KUEUE_SHAPES[-1]
        for share, pods, gpus in KUEUE_SHAPES:
            if pick < share:
                break
            pick -= share
        pods = min(pods, count - len(jobs))
        duration = round(max(60.0, rng.expovariate(1 / 1800.0)), 1)
        name = f"job-{index:03d}"
        for member in range(pods):
            jobs.append(Job(name=f"{name}-{member}", arrival_s=arrival, duration_s=duration, milli_cpu=8000 * gpus,
                            memory=32 * GiB * gpus, gpus=gpus, gpu_model="A30", group=name))
    return tuple(jobs)


def kueue(params: WorkloadParams) -> Scenario:
    """Kueue jobs admitted through ProvisioningRequests (issue 42): 2-8 servers, a 32-GPU pool, a 32-GPU quota."""
    group = gpu_group("gpu-workers", nodes=2, max_nodes=8, cores=64, memory=512 * GiB, max_gpus=8, pool="pool-0",
                      models=("A30",), gpu_idle_cooldown_s=_cooldown(params))
    cluster = ClusterSpec(groups=(group,), pools=(PoolSpec(name="pool-0", devices={"A30": KUEUE_POOL_GPUS}),),
                          initial_nodes={"gpu-workers": 2}, preconfigured={"gpu-workers": (2, 2)})
    count = params.jobs or 240
    interval = params.mean_interval_s or 600.0
    return Scenario(
        name="kueue", cluster=cluster, timing=_timing(params), seed=params.seed, baseline="node-only",
        jobs=kueue_jobs(count, interval, params.seed), kueue=KueueQueue(gpu_quota=KUEUE_POOL_GPUS),
        description="2-8 servers (64 cores, up to 8 GPUs), 32-GPU pool; every job admitted by Kueue through a "
                    "ProvisioningRequest (ClusterQueue quota: 32 GPUs)",
        notes=(f"{count} pods, jobs at Poisson mean gap {interval:g} s, ~30 min each: 40% 4 pods x 2 GPUs, 20% 2 x 4, "
               "30% 1 x 4, 10% 1 x 8; a job's pods exist only once its request is Provisioned",
               "attach-first policies: DDS's class attach-or-provision.dds.cdi.dev; node-only: cluster-autoscaler's "
               "best-effort-atomic-scale-up (whole 8-GPU servers)"))


def trace_scenario(jobs: Sequence[Job], params: WorkloadParams, name: str = "trace") -> Scenario:
    """A user's trace on the `elastic` cluster shape, unless a caller passes its own cluster (docs/simulation.md)."""
    base = elastic(replace(params, jobs=1))
    return replace(base, name=name, jobs=tuple(jobs), description=f"trace {name} on the elastic cluster",
                   notes=(f"{len(jobs)} jobs from {name}",))


BUILTIN: Mapping[str, tuple[str, Callable[[WorkloadParams], Scenario]]] = MappingProxyType({
    "kubecomp-w1": ("KubeComp workload 1 (A+B) on the 2-node testbed", lambda p: kubecomp_workload(1, p)),
    "kubecomp-w2": ("KubeComp workload 2 (A+C) on the 2-node testbed", lambda p: kubecomp_workload(2, p)),
    "kubecomp-w3": ("KubeComp workload 3 (A-D) on the 2-node testbed", lambda p: kubecomp_workload(3, p)),
    "kubecomp-w4": ("KubeComp workload 4 (A-E) on the 2-node testbed", lambda p: kubecomp_workload(4, p)),
    "kubecomp-ae": ("KubeComp single pool: 4 nodes, 24 GPUs, jobs A and E", kubecomp_single_pool),
    "kubecomp-realloc-30": ("KubeComp reallocation study, mean gap 30 s", lambda p: kubecomp_reallocation(30, p)),
    "kubecomp-realloc-60": ("KubeComp reallocation study, mean gap 60 s", lambda p: kubecomp_reallocation(60, p)),
    "kubecomp-realloc-120": ("KubeComp reallocation study, mean gap 120 s", lambda p: kubecomp_reallocation(120, p)),
    "kubecomp-multipool": ("KubeComp multi-pool (4 x 24 GPUs), Helios-like trace", kubecomp_multipool),
    "elastic": ("2-12 servers, 48-GPU pool: node-only vs attach-first", elastic),
    "scale-50x1000": ("1,000 jobs on 50 nodes: simulator speed", scale_test),
    "gangs": ("4 nodes, 16-GPU pool: gangs of 4 x 2 GPUs among single jobs", gangs),
    "cxl-memory": ("2-10 servers, 32 GPUs and 1 TiB of CXL memory: memory-heavy jobs, against GPU-only", cxl_memory),
    "kueue": ("2-8 servers, 32-GPU pool: jobs admitted by Kueue through ProvisioningRequests", kueue),
})


def build(name: str, params: WorkloadParams = WorkloadParams()) -> Scenario:
    try:
        _, builder = BUILTIN[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; built in: {', '.join(BUILTIN)}") from None
    return builder(params)
