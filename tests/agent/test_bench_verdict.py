"""The verdict of a benchmark run, from /proc/diskstats rewritten as the run proceeds.

The fixture hosts' procfs diskstats is rewritten by the fio seam at every step run, as the
kernel's counters would move: a RAID5 member that answers slowly in every run is named, one
slow in a single run is not, and a multipath path that carries nothing shows as idle.
"""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Callable
from pathlib import Path

import yaml

from stortune.agent import discovery
from stortune.agent.bench.cli import print_result
from stortune.agent.bench.fio import FioInvocation, FioOutcome, FioStatus
from stortune.agent.bench.manager import BenchmarkManager
from stortune.agent.kernelfs import KernelFS
from stortune.schemas.analysis.layers import device_analysis
from stortune.schemas.analysis.verdict import bottleneck
from stortune.schemas.bench.results import BenchmarkResult, DeviceStats
from stortune.schemas.bench.spec import BenchmarkSpec, parse_benchmark
from tests.agent.fakefio import FakeFio, capture
from tests.agent.test_bench_diskstats import stat_line
from tests.fixtures.scenarios import md_raid5_fileserver, san_multipath

READ = capture("fio-2.2.10-randread.json")

#: One device's cumulative counters: reads, 512-byte sectors read, read ms, busy ms.
Counters = dict[str, tuple[int, int, int, int]]


class Diskstats:
    """The fixture's /proc/diskstats as cumulative counters that runs move forward."""

    def __init__(self, fs: KernelFS, devices: dict[str, str]) -> None:
        self.fs, self.devnos = fs, devices  # name -> major:minor
        self.counters: Counters = {name: (0, 0, 0, 0) for name in devices}
        self.write()

    def add(self, name: str, reads: int, ms_per_read: float) -> None:
        r, sectors, ms, busy = self.counters[name]
        spent = round(reads * ms_per_read)
        self.counters[name] = (r + reads, sectors + reads * 8, ms + spent, busy + spent)

    def write(self) -> None:
        lines = [stat_line(name, self.devnos[name], reads=r, sectors=s, read_ms=ms, io_ms=busy,
                           weighted=ms) for name, (r, s, ms, busy) in self.counters.items()]
        (self.fs.procfs / "diskstats").write_text("\n".join(lines) + "\n")


class MovingFio(FakeFio):
    """The fake fio, moving the diskstats counters as its run ``n`` (0-based) would."""

    def __init__(self, stats: Diskstats, during: Callable[[Diskstats, int], None]) -> None:
        super().__init__(READ)
        self.stats, self.during = stats, during

    def run(self, invocation: FioInvocation, *, on_status: Callable[[FioStatus], None],
            cancel: threading.Event, on_start: Callable[[int], None] | None = None) -> FioOutcome:
        self.during(self.stats, len(self.calls))
        self.stats.write()
        return super().run(invocation, on_status=on_status, cancel=cancel, on_start=on_start)


def read_spec(device: str, repeats: int) -> BenchmarkSpec:
    return parse_benchmark(yaml.safe_load(yaml.safe_dump({
        "apiVersion": "stortune/v1", "kind": "BenchmarkSpec", "metadata": {"name": "verdict"},
        "spec": {"target": {"device": {"name": [device]}}, "repeats": repeats,
                 "workloads": [{"name": "randread", "pattern": "randread", "runtime": "1s"}]},
    })))


def run(fs: KernelFS, state: Path, fio: MovingFio, device: str, repeats: int) -> BenchmarkResult:
    fs.dev.mkdir(exist_ok=True)
    fs.device_node(device).write_bytes(b"")
    manager = BenchmarkManager(fs, state, runner=fio, sample_interval=3600)
    run_id = manager.start(read_spec(device, repeats))
    assert manager.wait(run_id, timeout=30).state == "done"
    result = manager.result(run_id)
    assert result is not None
    return result


MEMBERS = ("sdb1", "sdc1", "sdd1", "sde1", "sdf1")


def raid(fs: KernelFS) -> Diskstats:
    devnos = {"md126": "9:126"}
    for i, member in enumerate(MEMBERS):
        devnos[member[:-1]] = f"8:{16 * (i + 1)}"
        devnos[member] = f"8:{16 * (i + 1) + 1}"
    return Diskstats(fs, devnos)


def raid_run(slow: Callable[[str, int], bool]) -> Callable[[Diskstats, int], None]:
    def during(stats: Diskstats, n: int) -> None:
        stats.add("md126", 1000, 0)
        for member in MEMBERS:
            ms = 20.0 if slow(member, n) else 5.0  # each member serves 200 reads
            stats.add(member, 200, ms)
            stats.add(member[:-1], 200, ms)
    return during


def test_a_one_off_spike_of_a_member_is_not_named(tmp_path: Path) -> None:
    fs = md_raid5_fileserver(tmp_path / "host")
    fio = MovingFio(raid(fs), raid_run(lambda member, n: member == "sdc1" and n == 2))
    result = run(fs, tmp_path / "state", fio, "md126", repeats=5)
    assert len(result.runs) == 5
    assert [d.device for d in result.runs[2].devices if d.slowest] == ["sdc1"]  # the spike is seen ...
    assert result.slow_members == []  # ... and not taken for a slow drive


def test_a_slow_raid5_member_is_named_across_the_runs(tmp_path: Path) -> None:
    fs = md_raid5_fileserver(tmp_path / "host")
    # sdd1 (the misaligned member) answers in 20 ms against its peers' 5 ms, except in one run
    fio = MovingFio(raid(fs), raid_run(lambda member, n: member == "sdd1" and n != 1))
    result = run(fs, tmp_path / "state", fio, "md126", repeats=5)
    (slow,) = result.slow_members
    assert (slow.group, slow.member, slow.runs_slow, slow.runs, slow.peers) == ("md126", "sdd1", 4, 5, 4)
    assert slow.message == "sdd1: await 4.0 x its 4 peers' median in 4 of 5 runs"
    # the agent's own output says so
    out = io.StringIO()
    print_result(result, out=out)
    assert "  slow member of md126: sdd1: await 4.0 x its 4 peers' median in 4 of 5 runs" in \
        out.getvalue().splitlines()
    # stored as such: a new manager reads it back from the agent's store
    again = BenchmarkManager(fs, tmp_path / "state", runner=fio).result(result.run_id)
    assert again is not None and again.slow_members == result.slow_members


def san(fs: KernelFS) -> Diskstats:
    return Diskstats(fs, {"sda": "8:0", "sdb": "8:16", "sdc": "8:32", "sdd": "8:48", "sde": "8:64",
                          "dm-0": "253:0", "dm-1": "253:1"})


def test_an_idle_path_of_a_multipath_lun_is_shown(tmp_path: Path) -> None:
    fs = san_multipath(tmp_path / "host")

    def during(stats: Diskstats, n: int) -> None:  # mpatha's I/O all goes down sdb: sdc idles
        stats.add("dm-0", 400, 2.0)
        stats.add("sdb", 400, 2.0)
        stats.add("dm-1", 50, 1.0)  # another LUN's traffic is not this run's

    result = run(fs, tmp_path / "state", MovingFio(san(fs), during), "dm-0", repeats=3)
    rows = {(s.group, s.path): s for s in result.balance}
    assert set(rows) == {("dm-0", "sdb"), ("dm-0", "sdc"), ("ports", "host1"), ("ports", "host2")}
    idle = rows[("dm-0", "sdc")]
    assert (idle.idle, idle.share, idle.even_share, idle.port) == (True, 0.0, 0.5, "host2")
    busy = rows[("dm-0", "sdb")]
    assert (busy.idle, busy.share, busy.ios, busy.port) == (False, 1.0, 1200, "host1")
    assert rows[("ports", "host2")].idle and rows[("ports", "host1")].share == 1.0
    assert result.slow_members == []  # an idle path is not a slow one: it has no await at all


def test_a_result_stored_before_the_verdict_still_loads(tmp_path: Path) -> None:
    fs = md_raid5_fileserver(tmp_path / "host")
    fio = MovingFio(raid(fs), raid_run(lambda member, n: member == "sdd1"))
    result = run(fs, tmp_path / "state", fio, "md126", repeats=3)
    assert result.slow_members
    stored = tmp_path / "state" / "bench" / result.run_id / "result.json"
    old = json.loads(stored.read_text())
    for key in ("bottlenecks", "slow_members", "balance"):
        del old[key]
    stored.write_text(json.dumps(old))
    again = BenchmarkManager(fs, tmp_path / "state", runner=fio).result(result.run_id)
    assert again is not None and again.runs == result.runs
    assert (again.bottlenecks, again.slow_members, again.balance) == ([], [], [])


# -- the bottleneck through the real layer analysis of the fixture hosts -------------------------
def test_the_fc_ports_of_the_san_host_are_its_limit(tmp_path: Path) -> None:
    """The issue's SAN figures: 2 x 8GFC = 1,594 MB/s, 1,540 MB/s measured over 10 s."""
    topology = discovery.discover(san_multipath(tmp_path))
    analysis = device_analysis(topology, "dm-0")
    figures = [delta_stats("dm-0", "target", None, 1540), delta_stats("sdb", "mpath-path", "dm-0", 770),
               delta_stats("sdc", "mpath-path", "dm-0", 770)]
    verdict = bottleneck(analysis, "seq-read", figures)
    assert verdict.summary == "host1+host2 qla2xxx, 2 x 8GFC = 1,594 MB/s: measured 1,540 MB/s, 97 %"
    assert [load.kind for load in verdict.layers] == [layer.kind for layer in analysis.layers]
    unknown = [load.layer for load in verdict.layers if load.ceiling_bytes_per_second is None]
    assert "sdb+sdc" in unknown  # array LUNs: no class ceiling, shown, never the limit


def delta_stats(name: str, relation: str, above: str | None, mbps: int) -> DeviceStats:
    nbytes = mbps * 1_000_000 * 10
    ios = nbytes // (1 << 20)
    return DeviceStats(device=name, relation=relation, above=above, seconds=10.0, read_ios=ios,
                       write_ios=0, read_bytes=nbytes, write_bytes=0, read_iops=ios / 10, write_iops=0.0,
                       read_bytes_per_s=nbytes / 10, write_bytes_per_s=0.0, util_percent=60.0,
                       await_ms=3.0, queue_depth=0.8)


def test_every_run_carries_its_bottleneck_per_step(tmp_path: Path) -> None:
    fs = md_raid5_fileserver(tmp_path / "host")
    fio = MovingFio(raid(fs), raid_run(lambda member, n: member == "sdd1"))
    result = run(fs, tmp_path / "state", fio, "md126", repeats=3)
    (verdict,) = result.bottlenecks  # one step: its three repeats averaged
    assert (verdict.step, verdict.device) == ("randread", "md126")
    assert [load.kind for load in verdict.layers][:2] == ["filesystem", "md"]
    assert verdict.limit is not None and verdict.limit.layer in ("md126 raid5", "sdb..sdf")
    assert "sdd1" in {s.device for s in verdict.saturated}  # its await is 4 x its peers'
    out = io.StringIO()
    print_result(result, out=out)
    assert f"  randread: limit {verdict.summary}" in out.getvalue().splitlines()
