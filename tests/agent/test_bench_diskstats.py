"""/proc/diskstats: the parser, per-device figures, and the slow member of an md RAID5."""

from __future__ import annotations

from pathlib import Path

import pytest

from stortune.agent import discovery, procfs
from stortune.agent.bench.sampler import DiskstatsSampler, delta
from stortune.schemas.bench.target import beneath
from tests.fixtures.scenarios import md_raid5_fileserver

# kernel 6.x: 20 fields (with discard and flush counters)
LINE_6X = "   8      16 sdb 120 3 9600 480 40 2 3200 160 0 600 640 0 0 0 0 12 4"
# kernel 4.4: 14 fields, no discard or flush counters
LINE_44 = "   9     126 md126 5000 0 400000 0 2000 0 160000 0 0 0 0"


def test_diskstats_fields_by_kernel_generation() -> None:
    stats, problems = procfs.parse_diskstats("\n".join([LINE_6X, LINE_44, "garbage here", ""]))
    assert problems == ["diskstats line 3 skipped (2 fields, at least 14 expected): 'garbage here'"]
    sdb, md = stats["sdb"], stats["md126"]
    assert (sdb.devno, sdb.reads, sdb.sectors_read, sdb.read_ms, sdb.writes, sdb.io_ms) == (
        "8:16", 120, 9600, 480, 40, 600)
    assert (sdb.weighted_ms, sdb.discards, sdb.flushes, sdb.flush_ms) == (640, 0, 12, 4)
    assert md.discards is None and md.flushes is None


def stat_line(name: str, devno: str, *, reads: int = 0, sectors: int = 0, read_ms: int = 0,
              writes: int = 0, wsectors: int = 0, write_ms: int = 0, io_ms: int = 0,
              weighted: int = 0) -> str:
    major, minor = devno.split(":")
    return (f"{major:>4} {minor:>7} {name} {reads} 0 {sectors} {read_ms} {writes} 0 {wsectors}"
            f" {write_ms} 0 {io_ms} {weighted} 0 0 0 0 0 0")


def one(line: str) -> procfs.DiskStat:
    stats, problems = procfs.parse_diskstats(line)
    assert problems == []
    (stat,) = stats.values()
    return stat


def test_figures_between_two_samples() -> None:
    before = one(stat_line("sdb", "8:16", reads=100, sectors=800, read_ms=50, io_ms=100, weighted=60))
    after = one(stat_line("sdb", "8:16", reads=1100, sectors=8800, read_ms=4050, writes=500,
                          wsectors=4000, write_ms=1000, io_ms=9100, weighted=5060))
    d = delta(before, after, 10.0)
    assert (d.read_ios, d.write_ios, d.read_bytes, d.write_bytes) == (1000, 500, 8000 * 512, 4000 * 512)
    assert (d.read_iops, d.write_iops) == (100.0, 50.0)
    assert d.read_bytes_per_s == 8000 * 512 / 10
    assert d.util_percent == pytest.approx(90.0)
    assert (d.read_await_ms, d.write_await_ms, d.await_ms) == (4.0, 2.0, 5000 / 1500)
    assert d.queue_depth == pytest.approx(0.5)


def test_a_counter_that_went_back_counts_nothing_and_md_busy_time_is_unknown() -> None:
    assert delta(one(stat_line("md0", "9:0", reads=500)), one(stat_line("md0", "9:0", reads=100)),
                 1.0).read_ios == 0
    # md completes I/O without accounting busy time: unknown, not idle
    assert delta(one(stat_line("md0", "9:0")), one(stat_line("md0", "9:0", reads=9)),
                 1.0).util_percent is None


def write_diskstats(proc: Path, slow: str, seconds: int) -> None:
    """The md array and its members after ``seconds`` of reading; ``slow`` answers 5x slower."""
    lines = [stat_line("md126", "9:126", reads=40 * seconds * 5, sectors=40 * seconds * 5 * 1024)]
    for i, member in enumerate(("sdb1", "sdc1", "sdd1", "sde1", "sdf1")):
        disk = member[:-1]
        reads = 40 * seconds
        ms = reads * (25 if member == slow else 5)
        busy = min(seconds * 1000, ms)
        for name, minor in ((disk, 16 * (i + 1)), (member, 16 * (i + 1) + 1)):
            lines.append(stat_line(name, f"8:{minor}", reads=reads, sectors=reads * 1024, read_ms=ms,
                                   io_ms=busy, weighted=ms))
    (proc / "diskstats").write_text("\n".join(lines) + "\n")


def test_the_slow_member_of_a_raid5_stands_out(tmp_path: Path) -> None:
    fs = md_raid5_fileserver(tmp_path)
    watched = beneath(discovery.discover(fs), "md126")
    write_diskstats(fs.procfs, "sdd1", 0)
    clock = iter([100.0, 110.0])
    sampler = DiskstatsSampler(fs, watched, interval=3600, clock=lambda: next(clock))
    sampler.start()
    write_diskstats(fs.procfs, "sdd1", 10)
    stats = {d.device: d for d in sampler.stop()}
    assert set(stats) == {b.device for b in watched}
    assert [name for name, d in stats.items() if d.slowest] == ["sdd1"]
    slow, fast = stats["sdd1"], stats["sdb1"]
    assert (slow.relation, slow.above) == ("md-member", "md126")
    assert (slow.read_iops, slow.await_ms, fast.await_ms) == (40.0, 25.0, 5.0)
    assert slow.util_percent == 100.0 and fast.util_percent == pytest.approx(20.0)
    assert stats["md126"].read_iops == 200.0 and stats["md126"].relation == "target"
    assert stats["sdd"].relation == "disk" and not stats["sdd"].slowest
    assert sampler.problems == []


def test_a_missing_diskstats_is_reported_not_fatal(tmp_path: Path) -> None:
    fs = md_raid5_fileserver(tmp_path)
    sampler = DiskstatsSampler(fs, beneath(discovery.discover(fs), "md126"), interval=3600)
    sampler.start()
    assert sampler.stop() == []
    assert sampler.problems == ["cannot read diskstats under the procfs root: no device figures"]
