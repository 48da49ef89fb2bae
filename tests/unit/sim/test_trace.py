"""Reading users' traces: both formats, and errors that say where and what."""

from __future__ import annotations

import pytest

from dds.sim.trace import Job, TraceError, dump_csv, load_trace, parse_csv, parse_jsonl

GiB = 2**30


def test_csv_trace_reads_quantities_and_sorts_by_arrival():
    text = ("# two jobs\n"
            "name,arrival_s,duration_s,cpu,memory,gpus,gpu_model\n"
            "late,60,300,500m,16Gi,2,A30\n"
            "early,0,120.5,40,34359738368,1,\n")
    assert parse_csv(text) == (
        Job("early", 0.0, 120.5, 40_000, 32 * GiB, 1, None),
        Job("late", 60.0, 300.0, 500, 16 * GiB, 2, "A30"),
    )


def test_jsonl_trace_accepts_numbers_and_strings():
    text = ('{"name": "a", "arrival_s": 0, "duration_s": 10, "cpu": 4, "memory": "8Gi", "gpus": 1}\n'
            '\n'
            '{"name": "b", "arrival_s": "5", "duration_s": 10, "cpu": "1.5", "memory": 1024, "gpus": 0, '
            '"gpu_model": "H100"}\n')
    assert parse_jsonl(text) == (
        Job("a", 0.0, 10.0, 4000, 8 * GiB, 1, None),
        Job("b", 5.0, 10.0, 1500, 1024, 0, "H100"),
    )


def test_written_csv_reads_back_the_same_jobs():
    jobs = (Job("x", 0.0, 1.5, 250, GiB, 0, None), Job("y", 2.25, 300.0, 80_000, 64 * GiB, 8, "V100"))
    assert parse_csv(dump_csv(jobs)) == jobs


HEADER = "name,arrival_s,duration_s,cpu,memory,gpus\n"


@pytest.mark.parametrize("text, message", [
    pytest.param("", "the trace is empty", id="empty"),
    pytest.param("name,arrival_s,cpu,memory,gpus\na,0,1,1,1\n", "header lacks column(s) duration_s",
                 id="missing-column"),
    pytest.param(HEADER.replace("gpus", "gpus,colour") + "a,0,1,1,1,1,red\n", "unknown column(s) colour",
                 id="unknown-column"),
    pytest.param(HEADER + "a,0,1,1,1\n", "<csv>:2: 5 value(s) for 6 column(s)", id="short-row"),
    pytest.param(HEADER + "a,soon,1,1,1,1\n", "<csv>:2: field 'arrival_s' must be a number, got 'soon'",
                 id="bad-number"),
    pytest.param(HEADER + "a,0,0,1,1,1\n", "<csv>:2: field 'duration_s' must be > 0", id="zero-duration"),
    pytest.param(HEADER + "a,-1,5,1,1,1\n", "field 'arrival_s' must be >= 0", id="negative-arrival"),
    pytest.param(HEADER + "a,0,5,lots,1,1\n", "<csv>:2: field 'cpu' is not a quantity: 'lots'", id="bad-cpu"),
    pytest.param(HEADER + "a,0,5,1,1,1.5\n", "field 'gpus' must be a whole number >= 0, got '1.5'",
                 id="fractional-gpus"),
    pytest.param(HEADER + "a,0,5,1,,1\n", "<csv>:2: field 'memory' is missing or empty", id="empty-memory"),
    pytest.param(HEADER + "a,0,5,1,1,1\na,3,5,1,1,1\n", "<csv>:3: job name 'a' already used on line 2",
                 id="duplicate-name"),
])
def test_csv_errors_name_the_line_and_field(text, message):
    with pytest.raises(TraceError) as error:
        parse_csv(text)
    assert message in str(error.value)


@pytest.mark.parametrize("text, message", [
    pytest.param('{"name": "a"\n', "<jsonl>:1: not JSON", id="not-json"),
    pytest.param('[1, 2]\n', "<jsonl>:1: each line must be a JSON object, got list", id="not-object"),
    pytest.param('{"name": "a", "arrival_s": 0, "duration_s": 1, "cpu": 1, "memory": 1, "gpus": 1, "gpu": 2}\n',
                 "<jsonl>:1: unknown field(s) gpu", id="unknown-field"),
    pytest.param('{"name": "a", "arrival_s": 0, "duration_s": 1, "cpu": 1, "memory": 1}\n',
                 "<jsonl>:1: field 'gpus' is missing or empty", id="missing-field"),
    pytest.param('{"name": "a", "arrival_s": true, "duration_s": 1, "cpu": 1, "memory": 1, "gpus": 1}\n',
                 "field 'arrival_s' must be a number, got True", id="boolean"),
    pytest.param("\n# nothing\n", "the trace has no jobs", id="no-jobs"),
])
def test_jsonl_errors_name_the_line_and_field(text, message):
    with pytest.raises(TraceError) as error:
        parse_jsonl(text)
    assert message in str(error.value)


def test_load_trace_picks_the_format_from_the_extension(tmp_path):
    (tmp_path / "t.jsonl").write_text('{"name": "a", "arrival_s": 0, "duration_s": 1, "cpu": 1, "memory": 1, '
                                      '"gpus": 1}\n')
    assert [j.name for j in load_trace(tmp_path / "t.jsonl")] == ["a"]
    (tmp_path / "t.txt").write_text("x")
    with pytest.raises(TraceError, match=r"t.txt: unknown trace format '.txt'; use .csv or .jsonl"):
        load_trace(tmp_path / "t.txt")
    with pytest.raises(TraceError, match=r"missing.csv: cannot read trace"):
        load_trace(tmp_path / "missing.csv")


def test_the_example_traces_load():
    from pathlib import Path

    examples = Path(__file__).resolve().parents[3] / "examples" / "traces"
    csv_jobs = load_trace(examples / "small.csv")
    assert csv_jobs == load_trace(examples / "small.jsonl")
    assert len(csv_jobs) >= 10


def test_gang_columns_round_trip_and_default_to_the_whole_group():
    from dds.sim.trace import gang_minimums

    jobs = parse_csv("name,arrival_s,duration_s,cpu,memory,gpus,group,group_min\n"
                     "w-0,0,60,1,1Gi,2,ddp,\nw-1,0,60,1,1Gi,2,ddp,\nsolo,5,60,1,1Gi,1,,\n")
    assert [j.group for j in jobs] == ["ddp", "ddp", None]
    assert gang_minimums(jobs) == {"ddp": 2}
    assert parse_csv(dump_csv(jobs)) == jobs


def test_a_group_min_larger_than_the_group_is_an_error():
    import pytest

    with pytest.raises(TraceError, match="group 'ddp' needs 3 jobs"):
        parse_csv("name,arrival_s,duration_s,cpu,memory,gpus,group,group_min\nw-0,0,60,1,1Gi,2,ddp,3\n")
