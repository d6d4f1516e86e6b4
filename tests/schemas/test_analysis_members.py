"""slow_members and balance: hostile figures first, then the slow drive and the idle path."""

from __future__ import annotations

import json
import math

from stortune.schemas.analysis.members import PORTS, balance, slow_members, unbalanced
from stortune.schemas.bench.results import DeviceStats
from stortune.schemas.topology import Device, DeviceKind, DmInfo, ScsiHost, Topology


def stat(name: str, *, above: str | None = "md0", relation: str = "md-member", ios: int = 100,
         await_ms: float | None = 5.0, util: float | None = 40.0, nbytes: int | None = None,
         seconds: float = 10.0) -> DeviceStats:
    nbytes = ios * 4096 if nbytes is None else nbytes
    return DeviceStats(
        device=name, relation=relation, above=above, seconds=seconds, read_ios=ios, write_ios=0,
        read_bytes=nbytes, write_bytes=0, read_iops=ios / seconds if seconds else 0.0, write_iops=0.0,
        read_bytes_per_s=nbytes / seconds if seconds else 0.0, write_bytes_per_s=0.0,
        util_percent=util, await_ms=await_ms if ios else None, read_await_ms=await_ms if ios else None)


MEMBERS = ("sdb", "sdc", "sdd", "sde", "sdf")


def raid_run(slow: dict[str, float] | None = None, **kw: object) -> list[DeviceStats]:
    """One run of five members answering in 5 ms, ``slow`` members in their own time."""
    slow = slow or {}
    return [stat(m, await_ms=slow.get(m, 5.0), **kw) for m in MEMBERS]  # type: ignore[arg-type]


def no_nan(data: object) -> None:
    text = json.dumps(data)
    assert "NaN" not in text and "Infinity" not in text


# -- hostile inputs --------------------------------------------------------------------------
def test_nothing_to_compare_names_nothing() -> None:
    assert slow_members([]) == []
    assert slow_members([[], [], []]) == []
    # a single member has no peers, however slow it is
    assert slow_members([[stat("sdb", await_ms=500.0)]] * 5) == []
    # the target and the disks under partitions are not peers of anything
    runs = [[stat("md0", relation="target", above=None, await_ms=900.0),
             stat("sdb", relation="disk", above="sdb1", await_ms=900.0)]] * 5
    assert slow_members(runs) == []


def test_zero_seconds_backward_counters_and_nan_figures_are_not_slowness() -> None:
    # counters that went backwards reach the model as 0 I/Os (sampler._grew): no await
    idle = [[*raid_run()[:4], stat("sdf", ios=0, await_ms=None, util=0.0)]] * 5
    assert slow_members(idle) == []
    # zero seconds: rates 0, but await is per I/O and still compares
    zero = [raid_run({"sdd": 20.0}, seconds=0.0)] * 3
    assert [m.member for m in slow_members(zero)] == ["sdd"]
    # NaN and infinite figures (hand-made or corrupt) are dropped, never propagated
    nan = [[*raid_run()[:4], stat("sdf", await_ms=math.nan, util=math.inf)]] * 5
    found = slow_members(nan)
    assert found == []
    no_nan([m.model_dump(mode="json") for m in slow_members(zero)])


def test_peers_answering_in_no_time_give_no_ratio() -> None:
    # sub-millisecond peers show 0 ms await in diskstats: dividing by them would be infinite
    runs = [[stat(m, await_ms=0.0 if m != "sdd" else 3.0) for m in MEMBERS]] * 5
    assert slow_members(runs) == []


def test_too_few_runs_or_a_one_off_spike_name_nobody() -> None:
    assert slow_members([raid_run({"sdd": 30.0})] * 2) == []  # slow, but only two runs
    spike = [raid_run(), raid_run({"sdd": 40.0}), raid_run(), raid_run(), raid_run()]
    assert slow_members(spike) == []
    # slow in 3 of 5 runs is below 2/3 ... and 4 of 5 is not
    three = [raid_run({"sdd": 20.0})] * 3 + [raid_run()] * 2
    assert slow_members(three) == []
    four = [raid_run({"sdd": 20.0})] * 4 + [raid_run()]
    assert [m.member for m in slow_members(four)] == ["sdd"]


# -- the slow member ---------------------------------------------------------------------------
def test_a_persistently_slow_member_is_named_with_its_ratio() -> None:
    runs = [raid_run({"sdd": a}) for a in (15.5, 16.0, 14.0, 15.0, 15.8)]
    (slow,) = slow_members(runs)
    assert (slow.group, slow.member, slow.runs_slow, slow.runs, slow.peers) == ("md0", "sdd", 5, 5, 4)
    assert slow.ratio == 3.1
    assert slow.message == "sdd: await 3.1 x its 4 peers' median in 5 of 5 runs"


def test_without_await_the_utilisation_compares() -> None:
    runs = [[stat(m, await_ms=None, util=95.0 if m == "sdc" else 30.0) for m in MEMBERS]] * 3
    # await is None although I/O completed (a hand-built figure): util speaks
    (slow,) = slow_members(runs)
    assert slow.member == "sdc" and slow.message.startswith("sdc: util 3.2 x")


def test_paths_of_two_luns_are_compared_within_their_own_lun() -> None:
    runs = [[stat("sdb", above="dm-0", relation="mpath-path", await_ms=2.0),
             stat("sdc", above="dm-0", relation="mpath-path", await_ms=9.0),
             stat("sdd", above="dm-1", relation="mpath-path", await_ms=9.0),
             stat("sde", above="dm-1", relation="mpath-path", await_ms=9.0)]] * 3
    (slow,) = slow_members(runs)
    assert (slow.group, slow.member, slow.peers) == ("dm-0", "sdc", 1)
    assert slow.message == "sdc: await 4.5 x its peer's median in 3 of 3 runs"


# -- balance -----------------------------------------------------------------------------------
def device(name: str, kind: DeviceKind = DeviceKind.DISK, **kw: object) -> Device:
    return Device(name=name, kind=kind, id=f"name:{name}", **kw)  # type: ignore[arg-type]


def san() -> Topology:
    """Two LUNs, each over two paths, one path on each of two FC ports."""
    devices = []
    for lun, paths in (("dm-0", ("sdb", "sdc")), ("dm-1", ("sdd", "sde"))):
        for i, p in enumerate(paths):
            devices.append(device(p, holders=[lun], scsi_host=ScsiHost(name=f"host{i + 1}",
                                                                         driver="qla2xxx")))
        devices.append(device(lun, DeviceKind.DM, slaves=list(paths),
                              dm=DmInfo(name=f"mpath{lun[-1]}", type="multipath", paths=list(paths))))
    devices.append(device("sda"))
    return Topology(hostname="db01", devices=devices)


def path(name: str, above: str, nbytes: int, ios: int) -> DeviceStats:
    return stat(name, above=above, relation="mpath-path", ios=ios, nbytes=nbytes)


def test_balance_with_nothing_measured_or_garbage_is_empty_and_finite() -> None:
    assert balance(san(), []) == []
    assert balance(Topology(), [path("sdb", "dm-0", 100, 1)]) == []
    # zero bytes but I/Os counted (discards, flushes): shares by I/O count, never 0/0
    shares = balance(san(), [path("sdb", "dm-0", 0, 3), path("sdc", "dm-0", 0, 1)])
    assert [(s.path, s.share) for s in shares if s.group == "dm-0"] == [("sdb", 0.75), ("sdc", 0.25)]
    no_nan([s.model_dump(mode="json") for s in shares])


def test_an_idle_path_and_its_idle_port_are_listed() -> None:
    # dm-0's I/O all went down sdb (host1); sdc is absent from the figures entirely
    shares = balance(san(), [path("sdb", "dm-0", 8 << 20, 200), path("sdd", "dm-1", 4 << 20, 100),
                             path("sde", "dm-1", 4 << 20, 100)])
    rows = {(s.group, s.path): s for s in shares}
    assert set(rows) == {("dm-0", "sdb"), ("dm-0", "sdc"), ("dm-1", "sdd"), ("dm-1", "sde"),
                         (PORTS, "host1"), (PORTS, "host2")}
    sdc = rows[("dm-0", "sdc")]
    assert (sdc.idle, sdc.share, sdc.even_share, sdc.bytes, sdc.port) == (True, 0.0, 0.5, 0, "host2")
    assert rows[("dm-0", "sdb")].share == 1.0 and not rows[("dm-0", "sdb")].idle
    assert rows[("dm-1", "sdd")].share == 0.5
    host1, host2 = rows[(PORTS, "host1")], rows[(PORTS, "host2")]
    assert (host1.bytes, host2.bytes) == (12 << 20, 4 << 20)
    assert (host1.share, host2.share, host1.even_share) == (0.75, 0.25, 0.5)
    assert [(s.group, s.path) for s in unbalanced(shares)] == [("dm-0", "sdb"), ("dm-0", "sdc")]


def test_repeats_add_up_per_path() -> None:
    run = [path("sdb", "dm-0", 1000, 10), path("sdc", "dm-0", 3000, 30)]
    shares = {s.path: s for s in balance(san(), run + run) if s.group == "dm-0"}
    assert (shares["sdb"].bytes, shares["sdb"].ios, shares["sdc"].share) == (2000, 20, 0.75)
