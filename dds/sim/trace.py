"""Jobs and the trace files users feed to `dds simulate --trace FILE`.

A trace is one job per row, in CSV (with a header) or JSON lines (one object per line):

| field        | meaning                                                       | required | example   |
|--------------|---------------------------------------------------------------|----------|-----------|
| `name`       | unique job name (the pod name in the simulation)              | yes      | `train-7` |
| `arrival_s`  | submission time, seconds from the start of the trace (>= 0)   | yes      | `120.5`   |
| `duration_s` | run time once started, seconds (> 0)                          | yes      | `300`     |
| `cpu`        | CPU request: cores (`40`, `0.5`) or a Kubernetes quantity     | yes      | `40`      |
| `memory`     | memory request: bytes or a Kubernetes quantity (`32Gi`)       | yes      | `32Gi`    |
| `gpus`       | whole GPUs requested (>= 0)                                   | yes      | `4`       |
| `gpu_model`  | GPU model the job insists on (empty = any model)              | no       | `A30`     |
| `group`      | gang (pod group) the job belongs to; its pods start together  | no       | `ddp-3`   |
| `group_min`  | pods of the gang that must run at once (empty: all its jobs)  | no       | `4`       |

Lines starting with `#` and blank lines are skipped. Every error names the file, the line and the field.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

from dds.model.quantity import QuantityError, to_int, to_milli

REQUIRED_FIELDS = ("name", "arrival_s", "duration_s", "cpu", "memory", "gpus")
OPTIONAL_FIELDS = ("gpu_model", "group", "group_min")
CSV_HEADER = REQUIRED_FIELDS + OPTIONAL_FIELDS


class TraceError(ValueError):
    """A trace that cannot be read: names the file, line and field."""


@dataclass(frozen=True, slots=True)
class Job:
    """One unit of work: a pod that runs `duration_s` once bound."""

    name: str
    arrival_s: float
    duration_s: float
    milli_cpu: int
    memory: int  # bytes
    gpus: int
    gpu_model: Optional[str] = None
    group: Optional[str] = None  # gang name: its jobs start together (see gang_minimums)
    group_min: int = 0  # jobs of the gang that must run at once; 0 = all of them

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("job name must not be empty")
        if self.arrival_s < 0:
            raise ValueError(f"job {self.name}: arrival_s must be >= 0, got {self.arrival_s}")
        if self.duration_s <= 0:
            raise ValueError(f"job {self.name}: duration_s must be > 0, got {self.duration_s}")
        if self.milli_cpu < 0 or self.memory < 0 or self.gpus < 0:
            raise ValueError(f"job {self.name}: cpu, memory and gpus must be >= 0")
        if self.group_min < 0 or (self.group_min and not self.group):
            raise ValueError(f"job {self.name}: group_min must be >= 0 and needs a group")


def gang_minimums(jobs: Iterable[Job]) -> dict[str, int]:
    """Per gang, the jobs that must run at once: the largest group_min its jobs give, else all of its jobs."""
    sizes: dict[str, int] = {}
    declared: dict[str, int] = {}
    for job in jobs:
        if job.group:
            sizes[job.group] = sizes.get(job.group, 0) + 1
            declared[job.group] = max(declared.get(job.group, 0), job.group_min)
    return {group: declared[group] or size for group, size in sizes.items()}


def load_trace(path: Path) -> tuple[Job, ...]:
    """Read a `.csv` or `.jsonl`/`.ndjson`/`.json` trace; jobs come back sorted by arrival (stable)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read trace: {exc.strerror or exc}") from exc
    suffix = Path(path).suffix.lower()
    if suffix == ".csv":
        jobs = parse_csv(text, source=str(path))
    elif suffix in (".jsonl", ".ndjson", ".json"):
        jobs = parse_jsonl(text, source=str(path))
    else:
        raise TraceError(f"{path}: unknown trace format {suffix or '(no extension)'!r}; use .csv or .jsonl")
    return jobs


def parse_csv(text: str, source: str = "<csv>") -> tuple[Job, ...]:
    lines = [(number, line) for number, line in enumerate(text.splitlines(), start=1)
             if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        raise TraceError(f"{source}: the trace is empty (a header line and at least one job are needed)")
    header_number, header_line = lines[0]
    header = [name.strip() for name in next(csv.reader([header_line]))]
    missing = [name for name in REQUIRED_FIELDS if name not in header]
    if missing:
        raise TraceError(f"{source}:{header_number}: header lacks column(s) {', '.join(missing)}; "
                         f"expected {','.join(CSV_HEADER)}")
    unknown = [name for name in header if name not in CSV_HEADER]
    if unknown:
        raise TraceError(f"{source}:{header_number}: unknown column(s) {', '.join(unknown)}; "
                         f"known: {','.join(CSV_HEADER)}")
    rows = []
    for number, line in lines[1:]:
        values = next(csv.reader([line]))
        if len(values) != len(header):
            raise TraceError(f"{source}:{number}: {len(values)} value(s) for {len(header)} column(s)")
        rows.append((number, dict(zip(header, (v.strip() for v in values)))))
    return _jobs_from_rows(rows, source)


def parse_jsonl(text: str, source: str = "<jsonl>") -> tuple[Job, ...]:
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{source}:{number}: not JSON: {exc.msg} (column {exc.colno})") from exc
        if not isinstance(record, dict):
            raise TraceError(f"{source}:{number}: each line must be a JSON object, got {type(record).__name__}")
        unknown = [name for name in record if name not in CSV_HEADER]
        if unknown:
            raise TraceError(f"{source}:{number}: unknown field(s) {', '.join(sorted(unknown))}; "
                             f"known: {', '.join(CSV_HEADER)}")
        rows.append((number, record))
    if not rows:
        raise TraceError(f"{source}: the trace has no jobs")
    return _jobs_from_rows(rows, source)


def _jobs_from_rows(rows: Sequence[tuple[int, Mapping[str, Any]]], source: str) -> tuple[Job, ...]:
    jobs = []
    seen: dict[str, int] = {}
    for number, row in rows:
        job = _job_from_row(row, f"{source}:{number}")
        if job.name in seen:
            raise TraceError(f"{source}:{number}: job name {job.name!r} already used on line {seen[job.name]}")
        seen[job.name] = number
        jobs.append(job)
    for group, minimum in gang_minimums(jobs).items():
        size = sum(1 for j in jobs if j.group == group)
        if minimum > size:
            raise TraceError(f"{source}: group {group!r} needs {minimum} jobs at once (group_min) but has {size}")
    return tuple(sorted(jobs, key=lambda j: j.arrival_s))


def _job_from_row(row: Mapping[str, Any], where: str) -> Job:
    for name in REQUIRED_FIELDS:
        if row.get(name) in (None, ""):
            raise TraceError(f"{where}: field {name!r} is missing or empty")
    name = str(row["name"]).strip()
    arrival = _number(row["arrival_s"], where, "arrival_s")
    duration = _number(row["duration_s"], where, "duration_s")
    if arrival < 0:
        raise TraceError(f"{where}: field 'arrival_s' must be >= 0, got {arrival}")
    if duration <= 0:
        raise TraceError(f"{where}: field 'duration_s' must be > 0, got {duration}")
    milli_cpu = _quantity(row["cpu"], where, "cpu", to_milli)
    memory = _quantity(row["memory"], where, "memory", to_int)
    gpus = _whole(row["gpus"], where, "gpus")
    model = row.get("gpu_model")
    model = str(model).strip() if model not in (None, "") else None
    group = row.get("group")
    group = str(group).strip() if group not in (None, "") else None
    minimum = _whole(row["group_min"], where, "group_min") if row.get("group_min") not in (None, "") else 0
    if minimum and group is None:
        raise TraceError(f"{where}: field 'group_min' needs a 'group'")
    return Job(name=name, arrival_s=arrival, duration_s=duration, milli_cpu=milli_cpu, memory=memory, gpus=gpus,
               gpu_model=model, group=group, group_min=minimum)


def _number(value: Any, where: str, field: str) -> float:
    if isinstance(value, bool):
        raise TraceError(f"{where}: field {field!r} must be a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TraceError(f"{where}: field {field!r} must be a number, got {value!r}") from None
    if number != number or number in (float("inf"), float("-inf")):
        raise TraceError(f"{where}: field {field!r} must be finite, got {value!r}")
    return number


def _whole(value: Any, where: str, field: str) -> int:
    number = _number(value, where, field)
    if number < 0 or number != int(number):
        raise TraceError(f"{where}: field {field!r} must be a whole number >= 0, got {value!r}")
    return int(number)


def _quantity(value: Any, where: str, field: str, convert: Any) -> int:
    try:
        amount = convert(value if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value))
    except QuantityError:
        raise TraceError(f"{where}: field {field!r} is not a quantity: {value!r} (e.g. 40, 500m, 32Gi)") from None
    if amount < 0:
        raise TraceError(f"{where}: field {field!r} must be >= 0, got {value!r}")
    return amount


def dump_csv(jobs: Iterable[Job]) -> str:
    """Write jobs in the CSV trace format (cpu in cores, memory in bytes), e.g. to save a generated workload."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    for job in jobs:
        cpu = f"{job.milli_cpu // 1000}" if job.milli_cpu % 1000 == 0 else f"{job.milli_cpu}m"
        writer.writerow([job.name, _compact(job.arrival_s), _compact(job.duration_s), cpu, job.memory, job.gpus,
                         job.gpu_model or "", job.group or "", job.group_min or ""])
    return out.getvalue()


def _compact(number: float) -> str:
    return f"{number:.3f}".rstrip("0").rstrip(".")
