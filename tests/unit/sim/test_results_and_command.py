"""What users read: the summary numbers, the table, the files, and `dds simulate` itself."""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import pytest

from dds.commands import simulate as command
from dds.sim.engine import Counters, JobRecord, Sample, SimResult
from dds.sim.results import compare, percentile, render_table, summarize

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "traces"


@pytest.mark.parametrize("values, fraction, expected", [
    pytest.param([], 0.5, None, id="empty"),
    pytest.param([5.0], 0.95, 5.0, id="single"),
    pytest.param([0.0, 10.0, 20.0, 30.0], 0.5, 15.0, id="median-between"),
    pytest.param(list(range(101)), 0.95, 95.0, id="p95"),
])
def test_percentile(values, fraction, expected):
    assert percentile(values, fraction) == expected


def result(policy: str, waits: list[float | None]) -> SimResult:
    jobs = tuple(JobRecord(name=f"j{i}", arrival_s=0.0, gpus=1, start_s=w, finish_s=None if w is None else w + 100,
                           node="n" if w is not None else None) for i, w in enumerate(waits))
    # 2 GPUs present throughout; 1 in use for the first 100 s, then none.
    timeline = (Sample(0.0, 1, 2, 0, 1), Sample(100.0, 0, 2, 0, 1))
    return SimResult(scenario="s", policy=policy, jobs=jobs, timeline=timeline, counters=Counters(gpus_attached=3),
                     end_s=200.0, total_pool_gpus=2)


def test_summary_counts_unstarted_jobs_apart_and_integrates_gpu_use():
    summary = summarize(result("best-fit", [0.0, 100.0, None]))
    assert (summary.jobs, summary.never_started) == (3, 1)
    assert (summary.wait_mean_s, summary.wait_p50_s) == (50.0, 50.0)
    assert summary.makespan_s == 200.0
    assert summary.gpu_utilization == pytest.approx(100 / 400)
    assert summary.gpus_present_avg == pytest.approx(2.0)
    assert summary.gpus_attached == 3


def test_comparison_is_relative_to_the_static_baseline_and_renders_as_a_table():
    summaries = compare([result("static", [100.0, 100.0]), result("best-fit", [0.0, 20.0])])
    assert [s.wait_vs_baseline for s in summaries] == [0.0, pytest.approx(-0.9)]
    table = render_table(summaries).splitlines()
    assert table[0].split()[:4] == ["policy", "wait", "mean", "p50"]
    assert table[3].startswith("best-fit") and "-90%" in table[3]


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    command.register(parser.add_subparsers())
    args = parser.parse_args(["simulate", *argv])
    return args.func(args)


def test_simulate_a_trace_writes_the_table_csv_and_plots(tmp_path, capsys):
    out = tmp_path / "out"
    code = run_cli("--trace", str(EXAMPLES / "small.csv"), "--policies", "static,best-fit,node-only",
                   "--out", str(out), "--progress", "never")
    assert code == 0
    printed = capsys.readouterr().out
    for policy in ("static", "best-fit", "node-only"):
        assert f"\n{policy} " in printed
    assert {p.name for p in out.iterdir()} == {"summary.csv", "jobs.csv", "timeline.csv", "wait_cdf.png",
                                                "gpus_over_time.png"}
    rows = list(csv.DictReader((out / "summary.csv").open()))
    # The bounds, always last: the trace's 8-GPU job is large on 8-slot nodes, so the reserving one is there too.
    assert [r["policy"] for r in rows] == ["static", "best-fit", "node-only", "ideal", "ideal-reserving"]
    assert all(int(r["jobs"]) == 12 for r in rows)
    assert (out / "wait_cdf.png").read_bytes()[:4] == b"\x89PNG"


def test_simulate_a_builtin_workload_and_save_its_trace(tmp_path, capsys):
    saved = tmp_path / "w1.csv"
    code = run_cli("--workload", "kubecomp-w1", "--jobs", "8", "--policies", "static", "--no-files",
                   "--progress", "never", "--save-trace", str(saved))
    assert code == 0
    assert "workload kubecomp-w1" in capsys.readouterr().out
    assert not saved.exists()  # --no-files writes nothing


@pytest.mark.parametrize("argv, message", [
    pytest.param(("--policies", "best-fit,fastest"), "unknown policy fastest; known: all, node-only", id="policy"),
    pytest.param(("--workload", "nope"), "unknown workload 'nope'", id="workload"),
    pytest.param(("--trace", "missing.csv"), "missing.csv: cannot read trace", id="trace-missing"),
])
def test_bad_input_exits_2_with_a_clear_message(argv, message, capsys):
    assert run_cli(*argv, "--no-files", "--progress", "never") == 2
    assert message in capsys.readouterr().err


def test_bad_trace_line_is_named(tmp_path, capsys):
    trace = tmp_path / "bad.csv"
    trace.write_text("name,arrival_s,duration_s,cpu,memory,gpus\na,0,10,1,1Gi,two\n")
    assert run_cli("--trace", str(trace), "--no-files", "--progress", "never") == 2
    assert f"{trace}:2: field 'gpus' must be a number, got 'two'" in capsys.readouterr().err


def test_list_names_workloads_and_policies(capsys):
    assert run_cli("--list") == 0
    printed = capsys.readouterr().out
    assert "kubecomp-w4" in printed and "static-concentrated" in printed


def test_progress_bar_redraws_only_when_the_percentage_moves():
    import io

    from dds.sim.progress import ProgressBar

    stream = io.StringIO()
    bar = ProgressBar("best-fit", stream=stream, width=10, enabled=True)
    for done in (0, 0, 1, 1, 2, 4):
        bar.update(done, 4)
    bar.close()
    frames = stream.getvalue().split("\r")[1:]
    assert [f.split("]")[1].split()[0] for f in frames] == ["0%", "25%", "50%", "100%"]
    assert frames[-1].endswith("4/4 jobs\n")
    silent = io.StringIO()
    ProgressBar("x", stream=silent, enabled=False).update(1, 2)
    assert silent.getvalue() == ""


def test_without_matplotlib_simulate_still_writes_its_results_and_says_why_no_plots(tmp_path, capsys, monkeypatch):
    # A plain `pip install dds` has no matplotlib (it is the `sim` extra): a one-line note, not a traceback.
    monkeypatch.setattr(command, "_have_matplotlib", lambda: False)
    out = tmp_path / "out"
    code = run_cli("--trace", str(EXAMPLES / "small.csv"), "--policies", "static", "--out", str(out),
                   "--progress", "never")
    assert code == 0
    assert "note: no plots (matplotlib is not installed: pip install 'dds[sim]')" in capsys.readouterr().out
    assert {p.name for p in out.iterdir()} == {"summary.csv", "jobs.csv", "timeline.csv"}


def test_a_policy_that_left_jobs_unrun_is_warned_about_and_the_columns_are_explained():
    from dds.sim.results import render_legend, unrun_warning

    summaries = compare([result("static", [100.0, 100.0]), result("node-only", [0.0, None])])
    assert unrun_warning(summaries) == (
        "warning: jobs never ran under node-only (1 of 2): their waits are missing from the wait columns, so those "
        "policies look better on wait than they are; compare them on 'never ran' first")
    assert unrun_warning(compare([result("static", [1.0])])) is None
    legend = render_legend()
    header = render_table(summaries).splitlines()[0]
    assert "stranded GPU-h" in header and "GPU-hours" in legend
    assert "(lower is better)" in legend and "(higher is better)" in legend


def test_stranded_gpu_seconds_are_shown_as_gpu_hours():
    from dataclasses import replace

    summary = replace(summarize(result("best-fit", [0.0])), gpu_stranded_s=5400.0)
    row = render_table([summary]).splitlines()[2]
    assert " 1.5 " in row
