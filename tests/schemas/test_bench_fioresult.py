"""fio's JSON as it really comes: several versions and modes, captured in tests/fixtures/fio."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stortune.schemas.bench.fioresult import FioOutputError, parse

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "fio"


def text(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def raw(name: str) -> dict[str, Any]:
    body = text(name)
    data: dict[str, Any] = json.loads(body[body.index("{"):])
    return data


def test_a_mixed_job_has_both_directions_in_bytes_and_microseconds() -> None:
    job = raw("fio-3.33-randrw.json")["jobs"][0]
    result = parse(text("fio-3.33-randrw.json"))
    assert result.ok and result.fio_version == "fio-3.33" and result.preamble == []
    for name in ("read", "write"):
        d = getattr(result, name)
        assert d.bandwidth == job[name]["bw_bytes"]
        assert d.io_bytes == job[name]["io_bytes"]
        assert d.iops == pytest.approx(job[name]["iops"])
        assert d.clat_mean_us == pytest.approx(job[name]["clat_ns"]["mean"] / 1000)
        assert d.lat_mean_us == pytest.approx(job[name]["lat_ns"]["mean"] / 1000)
        assert d.percentiles_us["p99"] == job[name]["clat_ns"]["percentile"]["99.000000"] / 1000
        assert d.percentiles_us["p999"] == job[name]["clat_ns"]["percentile"]["99.900000"] / 1000
    m = result.metrics()
    assert m["total_bandwidth"] == job["read"]["bw_bytes"] + job["write"]["bw_bytes"]
    assert m["cpu_sys"] == job["sys_cpu"]


def test_an_idle_direction_has_no_percentiles_and_no_metrics() -> None:
    data = raw("fio-3.33-lat-percentiles.json")["jobs"][0]
    assert data["write"]["clat_ns"]["N"] == 0 and "percentile" not in data["write"]["clat_ns"]
    result = parse(text("fio-3.33-lat-percentiles.json"))
    assert not result.write.has_io and result.write.percentiles_us == {}
    assert not any(k.startswith("write_") for k in result.metrics())


def test_percentiles_under_lat_ns_are_used_when_clat_has_none() -> None:
    data = raw("fio-3.33-lat-percentiles.json")["jobs"][0]["read"]
    assert "percentile" not in data["clat_ns"] and "percentile" in data["lat_ns"]
    result = parse(text("fio-3.33-lat-percentiles.json"))
    assert result.read.percentiles_us["p50"] == data["lat_ns"]["percentile"]["50.000000"] / 1000


def test_group_reporting_gives_one_entry_for_the_group() -> None:
    data = raw("fio-3.33-group-reporting.json")
    assert data["jobs"][0]["job options"]["numjobs"] == "4"
    result = parse(text("fio-3.33-group-reporting.json"))
    assert len(result.jobs) == 1
    assert result.read.bandwidth == data["jobs"][0]["read"]["bw_bytes"]


def test_jobs_without_group_reporting_add_up() -> None:
    jobs = raw("fio-3.33-two-jobs.json")["jobs"]
    result = parse(text("fio-3.33-two-jobs.json"))
    assert len(result.jobs) == 2
    assert result.read.bandwidth == sum(j["read"]["bw_bytes"] for j in jobs)
    assert result.read.iops == pytest.approx(sum(j["read"]["iops"] for j in jobs))
    assert result.read.total_ios == sum(j["read"]["total_ios"] for j in jobs)
    # percentiles of separate jobs cannot be merged: the worst job's, never better
    assert result.read.percentiles_us["p99"] == max(
        j["read"]["clat_ns"]["percentile"]["99.000000"] for j in jobs) / 1000
    weights = [j["read"]["total_ios"] for j in jobs]
    means = [j["read"]["lat_ns"]["mean"] / 1000 for j in jobs]
    assert result.read.lat_mean_us == pytest.approx(
        sum(m * w for m, w in zip(means, weights, strict=True)) / sum(weights))


def test_a_job_failing_mid_run_is_an_error_with_what_it_measured() -> None:
    result = parse(text("fio-3.33-enospc.json"))
    assert not result.ok
    assert result.errors == ["job full: error 28 (ENOSPC)"]
    assert result.write.io_bytes > 0  # what it wrote before the disk filled
    assert "No space left" in text("fio-3.33-enospc.stderr")  # the reason is on stderr


def test_text_before_the_json_is_kept_as_preamble() -> None:
    result = parse(text("fio-3.33-setup-error.json"))
    assert not result.ok and result.errors == ["job notdir: error 20 (ENOTDIR)"]
    assert any("Not a directory" in line for line in result.preamble)
    assert not result.read.has_io and result.metrics() == {}
    note = parse(text("fio-3.33-stdout-note.txt"))
    assert note.ok and note.preamble[0].startswith("note: both iodepth >= 1")
    assert note.read.has_io


def test_fio_2_reports_kib_and_microseconds() -> None:
    data = raw("fio-2.2.10-randread.json")["jobs"][0]["read"]
    assert "bw_bytes" not in data and "io_kbytes" not in data and "clat_ns" not in data
    result = parse(text("fio-2.2.10-randread.json"))
    assert result.fio_version == "fio-2.2.10"
    assert result.read.bandwidth == data["bw"] * 1024
    assert result.read.io_bytes == data["io_bytes"] * 1024
    assert result.read.clat_mean_us == data["clat"]["mean"]  # already microseconds
    assert result.read.percentiles_us == {"p50": 628, "p95": 1576, "p99": 2384, "p999": 5664}
    # fio 2 prints zeros for the idle direction: that is no data, not a 0 µs latency
    assert result.write.percentiles_us == {} and result.write.lat_mean_us is None


def test_fio_3_1_has_nanoseconds_but_no_bw_bytes() -> None:
    data = raw("fio-3.1-seqwrite-grouped.json")["jobs"][0]["write"]
    assert "bw_bytes" not in data and "N" not in data["clat_ns"]
    result = parse(text("fio-3.1-seqwrite-grouped.json"))
    assert result.write.bandwidth == data["bw"] * 1024 == 500 * 2**20
    assert result.write.io_bytes == data["io_bytes"]
    assert result.write.percentiles_us["p99"] == pytest.approx(10551.296)
    assert result.read.percentiles_us == {}
    assert result.metrics()["write_iops"] == 500


@pytest.mark.parametrize("body", ["", "fio: failed parsing bs=4q\n", '{"not": "fio"}\n',
                                  text("fio-3.33-randrw.json")[:2000]])
def test_output_without_a_result_says_what_fio_printed(body: str) -> None:
    with pytest.raises(FioOutputError, match="holds no JSON result") as err:
        parse(body)
    if "bs=4q" in body:
        assert "failed parsing bs=4q" in str(err.value)


def _mutate(data: Any, drops: list[int], counter: list[int]) -> Any:
    """Drop the dict entries whose visiting order is in ``drops``."""
    if isinstance(data, dict):
        out = {}
        for key, value in data.items():
            counter[0] += 1
            if counter[0] in drops:
                continue
            out[key] = _mutate(value, drops, counter)
        return out
    if isinstance(data, list):
        return [_mutate(v, drops, counter) for v in data]
    return data


@settings(max_examples=60, deadline=None)
@given(drops=st.lists(st.integers(min_value=1, max_value=400), max_size=12))
def test_a_result_missing_any_fields_still_parses_or_says_why(drops: list[int]) -> None:
    data = _mutate(raw("fio-3.33-randrw.json"), drops, [0])
    try:
        result = parse("fio: warning\n" + json.dumps(data, indent=2))
    except FioOutputError:
        assert "jobs" not in data
        return
    for d in (result.read, result.write):
        assert d.bandwidth >= 0 and d.iops >= 0
        assert all(v >= 0 for v in d.percentiles_us.values())
