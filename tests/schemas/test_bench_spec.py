"""The BenchmarkSpec document: units, presets, validation with field paths."""

from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from stortune.schemas import export
from stortune.schemas.bench import presets, units
from stortune.schemas.bench.spec import load_benchmark, parse_benchmark
from stortune.schemas.bench.steps import TargetFacts
from stortune.schemas.documents import DocumentError

GOOD = """
apiVersion: stortune/v1
kind: BenchmarkSpec
metadata: {name: perc-streamer-baseline, labels: {role: streamer}}
spec:
  hostSelector: {matchLabels: {role: streamer}}
  target: {device: {kind: [disk], model: "PERC.*"}}
  allowDestructive: true
  repeats: 3
  workloads:
    - {preset: iozone-seq, size: 1GiB, runtime: 2m}
    - {preset: iometer-4k, runtime: 30s, rampTime: 5s}
    - name: mixed-8k
      pattern: randrw
      rwmixread: 70
      blockSizeSplit: 4k/30:8k/50:64k/20
      iodepth: 32
      numjobs: 4
      size: 512M
      runtime: 1m
  thresholds:
    - {metric: read_bandwidth, step: "iozone-seq/t1/read", min: 386MB/s}
    - {metric: read_lat_p99, step: "iometer-4k/*", max: 20ms}
    - {metric: read_iops, step: mixed-8k, min: 25k}
"""


def problems(text: str) -> list[tuple[str, str]]:
    with pytest.raises(DocumentError) as info:
        load_benchmark(text, "b.yaml")
    return [(p.path, p.message) for p in info.value.problems]


def with_spec(**changes: object) -> str:
    doc = yaml.safe_load(GOOD)
    doc["spec"].update(changes)
    return yaml.safe_dump(doc)


def test_human_units_become_canonical_and_the_document_round_trips() -> None:
    spec = load_benchmark(GOOD)
    iozone, iometer, mixed = spec.spec.workloads
    assert iozone.size == 1 << 30 and iozone.runtime == 120.0  # type: ignore[union-attr]
    assert iometer.rampTime == 5.0  # type: ignore[union-attr]
    assert [(e.size, e.percent) for e in mixed.blockSizeSplit] == [  # type: ignore[union-attr]
        (4096, 30), (8192, 50), (65536, 20)]
    t_bw, t_lat, t_iops = spec.spec.thresholds
    assert (t_bw.min, t_lat.max, t_iops.min) == (386e6, 20_000.0, 25_000.0)
    again = parse_benchmark(json.loads(json.dumps(spec.document())))
    assert again == spec


def test_steps_expand_presets_in_order() -> None:
    steps = load_benchmark(GOOD).steps(TargetFacts(drives=1))
    names = [s.name for s in steps]
    assert names[:4] == ["iozone-seq/t1/write", "iozone-seq/t1/rewrite", "iozone-seq/t1/read",
                         "iozone-seq/t1/reread"]
    assert len([n for n in names if n.startswith("iozone-seq/")]) == 12
    assert names[12:] == ["iometer-4k/randread", "iometer-4k/randwrite", "iometer-4k/oltp", "mixed-8k"]
    mixed = steps[-1]
    assert (mixed.pattern, mixed.rwmixread, mixed.iodepth, mixed.numjobs) == ("randrw", 70, 32, 4)
    assert (mixed.ioengine, mixed.direct, mixed.repeats, mixed.runtime) == ("libaio", True, 3, 60.0)


def test_iozone_seq_is_write_rewrite_read_reread_at_1_2_10_threads() -> None:
    steps = presets.expand("iozone-seq", "iozone-seq", presets.Overrides(size=4 << 20),
                           TargetFacts(size_bytes=64 << 20))
    table = [(s.threads, s.phase, s.pattern, s.block_size) for s in steps]
    assert table == [(t, p, "read" if p in ("read", "reread") else "write", 1 << 20)
                     for t in (1, 2, 10) for p in ("write", "rewrite", "read", "reread")]
    by_phase = {s.phase: s for s in steps if s.threads == 2}
    assert by_phase["write"].fresh_file and by_phase["write"].end_fsync
    assert by_phase["read"].invalidate and not by_phase["reread"].invalidate  # re-read finds the cache
    assert all(s.ioengine == "psync" and not s.direct and not s.time_based for s in steps)


@pytest.mark.parametrize(("preset", "drives", "depth"), [
    ("iometer-4k", 1, 4), ("iometer-4k", 12, 24), ("iometer-64k", 5, 10), ("seq-1m", 3, 6),
    ("oltp-8k", 8, 64), ("oltp-8k", 40, 80),
])
def test_outstanding_ios_scale_with_the_arrays_drives(preset: str, drives: int, depth: int) -> None:
    steps = presets.expand(preset, preset, presets.Overrides(), TargetFacts(drives=drives))
    assert {s.iodepth * s.numjobs for s in steps} == {depth}
    assert all(s.iodepth * s.numjobs >= presets.OUTSTANDING_PER_DRIVE * drives for s in steps)


def test_presets_are_what_the_field_runs() -> None:
    facts = TargetFacts()
    iometer = presets.expand("iometer-4k", "x", presets.Overrides(), facts)
    assert [(s.pattern, s.rwmixread, s.block_size) for s in iometer] == [
        ("randread", None, 4096), ("randwrite", None, 4096), ("randrw", 67, 4096)]
    big = presets.expand("iometer-64k", "x", presets.Overrides(), facts)
    assert [s.block_size for s in big] == [65536] * 3
    seq = presets.expand("seq-64k", "x", presets.Overrides(), facts)
    assert [(s.pattern, s.block_size) for s in seq] == [("read", 65536), ("write", 65536)]
    stream, = presets.expand("stream-32k", "x", presets.Overrides(), facts)
    assert (stream.block_size, stream.direct, stream.numjobs, stream.pattern) == (32768, False, 8, "read")
    oltp, = presets.expand("oltp-8k", "x", presets.Overrides(), facts)
    assert (oltp.pattern, oltp.rwmixread, oltp.block_size, oltp.iodepth) == ("randrw", 70, 8192, 64)
    assert presets.names("seq-1m", "after") == ["after/read", "after/write"]


@pytest.mark.parametrize(("change", "path", "message"), [
    ({"workloads": [{"preset": "iometer-9k"}]}, "spec.workloads[0].preset", "iozone-seq"),
    ({"workloads": [{"preset": "seq-1m", "size": "12 parsecs"}]}, "spec.workloads[0].size",
     "is not a size"),
    ({"workloads": [{"name": "w", "pattern": "read", "blockSize": "4q"}]},
     "spec.workloads[0].blockSize", "is not a size"),
    ({"workloads": [{"name": "w", "pattern": "read", "rwmixread": 70}]}, "spec.workloads[0]",
     "rwmixread applies to rw and randrw"),
    ({"workloads": [{"name": "w", "pattern": "randread", "iodepth": 8, "ioengine": "psync"}]},
     "spec.workloads[0]", "needs an asynchronous ioengine"),
    ({"workloads": [{"name": "w", "pattern": "randrw", "blockSizeSplit": "4k/50:64k/40"}]},
     "spec.workloads[0]", "add up to 100"),
    ({"workloads": [{"name": "w", "pattern": "read", "runtime": "soon"}]},
     "spec.workloads[0].runtime", "is not a duration"),
    ({"thresholds": [{"metric": "read_bandwidth", "min": "386Mb/s"}]}, "spec.thresholds[0].min",
     "lower-case b means bits"),
    ({"thresholds": [{"metric": "read_speed", "min": 1}]}, "spec.thresholds[0].metric", "unknown metric"),
    ({"thresholds": [{"metric": "read_lat_p99"}]}, "spec.thresholds[0]", "give min, max or both"),
    ({"thresholds": [{"metric": "read_iops", "step": "nope/*", "min": 1}]}, "spec",
     "thresholds[0].step 'nope/*' matches no step"),
    ({"target": {"device": {"name": ["sdb"]}, "file": {"path": "/srv/x", "size": "1G"}}},
     "spec.target", "exactly one"),
    ({"target": {"file": {"path": "/dev/sdb", "size": "1G"}}}, "spec.target.file.path",
     "use target.device"),
    ({"target": {"file": {"path": "relative/x", "size": "1G"}}}, "spec.target.file.path",
     "absolute path"),
    ({"target": {"device": {}}}, "spec.target.device", "at least one criterion"),
    ({"workloads": [{"preset": "seq-1m"}, {"preset": "seq-1m"}]}, "spec",
     "'seq-1m/read' appears twice"),
])
def test_errors_name_the_field(change: dict[str, object], path: str, message: str) -> None:
    found = problems(with_spec(**change))
    assert any(p == path and message in m for p, m in found), found


@pytest.mark.parametrize(("change", "path"), [
    # Hostile: pydantic's lax mode turned these into numbers and booleans; strings where the
    # schema says integer or boolean are refused, whatever they spell.
    ({"allowDestructive": "yes"}, "spec.allowDestructive"),
    ({"allowDestructive": "false"}, "spec.allowDestructive"),
    ({"allowDestructive": 1}, "spec.allowDestructive"),
    ({"repeats": "3"}, "spec.repeats"),
    ({"repeats": 3.0}, "spec.repeats"),
    ({"workloads": [{"name": "w", "pattern": "read", "iodepth": "32"}]}, "spec.workloads[0].iodepth"),
    ({"workloads": [{"name": "w", "pattern": "read", "numjobs": True}]}, "spec.workloads[0].numjobs"),
    ({"workloads": [{"name": "w", "pattern": "read", "direct": "no"}]}, "spec.workloads[0].direct"),
    ({"workloads": [{"name": "w", "pattern": "rw", "rwmixread": 70.0}]}, "spec.workloads[0].rwmixread"),
    ({"workloads": [{"name": "w", "pattern": "read", "repeats": "2"}]}, "spec.workloads[0].repeats"),
    ({"workloads": [{"name": "w", "pattern": "randrw", "blockSizeSplit": [
        {"size": "4k", "percent": "50"}, {"size": "64k", "percent": 50}]}]},
     "spec.workloads[0].blockSizeSplit[0].percent"),
    ({"workloads": [{"name": "w", "pattern": "read", "blockSize": 4096.0}]}, "spec.workloads[0].blockSize"),
    ({"workloads": [{"preset": "seq-1m", "direct": "true"}]}, "spec.workloads[0].direct"),
    ({"workloads": [{"preset": "seq-1m", "repeats": "2"}]}, "spec.workloads[0].repeats"),
    ({"target": {"file": {"path": "/srv/x", "size": "1G", "keep": "yes"}}}, "spec.target.file.keep"),
    ({"workloads": [{"name": "w", "pattern": "randrw", "blockSizeSplit": "4k/5O:64k/50"}]},
     "spec.workloads[0].blockSizeSplit"),
])
def test_scalars_are_typed_strictly(change: dict[str, object], path: str) -> None:
    found = problems(with_spec(**change))
    assert path in [p for p, _ in found], found


def test_block_size_split_text_still_reads_its_percentages() -> None:
    spec = load_benchmark(with_spec(thresholds=[], workloads=[{"name": "w", "pattern": "randrw",
                                                "blockSizeSplit": "4k/30: 8k/50 :64k/20"}]))
    (step,) = spec.steps(TargetFacts())
    assert [(e.size, e.percent) for e in step.block_size_split or []] == [(4096, 30), (8192, 50), (65536, 20)]


def test_writing_to_a_raw_device_needs_allow_destructive() -> None:
    found = problems(with_spec(allowDestructive=False))
    assert any(p == "spec" and "allowDestructive is not true" in m and "iozone-seq/t1/write" in m
               for p, m in found)
    # reads alone are fine, and so are writes to a file target
    load_benchmark(with_spec(allowDestructive=False, thresholds=[],
                             workloads=[{"preset": "stream-32k"}]))
    load_benchmark(with_spec(allowDestructive=False,
                             target={"file": {"path": "/srv/bench/x.dat", "size": "8GiB"}}))


def test_kind_and_api_version_are_checked() -> None:
    assert problems(GOOD.replace("kind: BenchmarkSpec", "kind: StorageProfile")) == [
        ("kind", "'StorageProfile' is not a BenchmarkSpec document")]
    assert problems(GOOD + "---\n" + GOOD)[0][1] == "expected one BenchmarkSpec document, found 2"


def test_json_schema_lists_presets_and_metrics() -> None:
    schema = json.loads(export.render()["benchmarkspec.schema.json"])
    defs = schema["$defs"]
    assert set(defs["PresetRef"]["properties"]["preset"]["enum"]) == set(presets.PRESET_NAMES)
    assert "read_lat_p99" in defs["Threshold"]["properties"]["metric"]["enum"]
    assert schema["properties"]["kind"]["const"] == "BenchmarkSpec"


# -- units -------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "value"), [
    ("386MB/s", 386e6), ("1.2GB/s", 1.2e9), ("500MiB/s", 500 * 2**20), ("100 KiB/s", 102400.0),
    (5e8, 5e8),
])
def test_rates_follow_datasheets(text: object, value: float) -> None:
    assert units.parse_rate(text) == pytest.approx(value)


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30), ("500ms", 0.5), ("2m", 120), ("1h", 3600),
                                               ("2min", 120), (45, 45)])
def test_durations(text: object, seconds: float) -> None:
    assert units.parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(("text", "us"), [("20ms", 20_000), ("500us", 500), ("1.5ms", 1500), (800, 800),
                                          ("2s", 2e6)])
def test_latencies_are_microseconds(text: object, us: float) -> None:
    assert units.parse_latency(text) == pytest.approx(us)


@given(st.integers(min_value=0, max_value=10**9))
def test_durations_round_trip_to_the_millisecond(ms: int) -> None:
    assert units.parse_duration(units.format_duration(ms / 1000)) == pytest.approx(ms / 1000)


@given(st.floats(min_value=0, max_value=1e6, allow_nan=False), st.sampled_from(["KB", "MB", "GB"]))
def test_decimal_rates_scale_by_powers_of_ten(x: float, unit: str) -> None:
    scale = {"KB": 1e3, "MB": 1e6, "GB": 1e9}[unit]
    text = f"{x:.3f}"
    assert units.parse_rate(f"{text}{unit}/s") == pytest.approx(float(text) * scale)


@pytest.mark.parametrize(("workload", "field"), [
    ({"name": "w", "pattern": "randread", "blockSize": "4KB"}, "blockSize is 4000 bytes"),
    ({"name": "w", "pattern": "randrw", "blockSizeSplit": "4k/50:6KB/50"},
     "blockSizeSplit[1].size is 6000 bytes"),
    ({"name": "w", "pattern": "read", "blockSize": 1000}, "blockSize is 1000 bytes"),
])
def test_hostile_a_direct_block_size_that_is_no_sector_multiple_is_refused_before_fio_fails(
    workload: dict[str, object], field: str,
) -> None:
    """`4KB` is 4000 bytes under the one size rule: fio refuses such direct I/O only once the run
    started on the host, so the document says so at once, with the spelling meant."""
    ((path, message),) = problems(with_spec(workloads=[workload], thresholds=[]))
    assert path == "spec.workloads[0]" and message.startswith(field) and "4KiB or 4k" in message
    # Buffered I/O has no such rule, and 4KiB is what was meant.
    load_benchmark(with_spec(workloads=[{**workload, "direct": False}], thresholds=[]))
    fixed = {k: (v.replace("KB", "KiB") if isinstance(v, str) else 4096) for k, v in workload.items()
             if k not in ("name", "pattern")}
    load_benchmark(with_spec(workloads=[{**workload, **fixed}], thresholds=[]))
