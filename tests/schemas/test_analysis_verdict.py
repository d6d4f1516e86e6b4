"""bottleneck: each layer's load against its ceiling, the limit, and USE saturation."""

from __future__ import annotations

import json
import math

from stortune.schemas.analysis.model import DeviceAnalysis, Layer, LayerKind, Part
from stortune.schemas.analysis.verdict import bottleneck, saturation
from stortune.schemas.bench.results import DeviceStats

MB = 1_000_000


def stat(name: str, relation: str, above: str | None, *, mbps: float, iops: float = 0.0,
         util: float | None = 50.0, queue: float | None = 0.5, await_ms: float | None = 2.0,
         seconds: float = 10.0) -> DeviceStats:
    ios = round(iops * seconds)
    return DeviceStats(
        device=name, relation=relation, above=above, seconds=seconds, read_ios=ios, write_ios=0,
        read_bytes=round(mbps * MB * seconds), write_bytes=0, read_iops=iops, write_iops=0.0,
        read_bytes_per_s=mbps * MB, write_bytes_per_s=0.0, util_percent=util, queue_depth=queue,
        await_ms=await_ms if ios else None)


def fc_part(host: str, devices: list[str]) -> Part:
    return Part(name=host, ceiling_bytes_per_second=797 * MB, source=f"fc_host/{host}/speed 8 Gbit",
                detail="8GFC", devices=devices)


def san_lun() -> DeviceAnalysis:
    """dm-0 over sdb (host1) and sdc (host2): two 8GFC ports, two fast array paths, a PCIe x4."""
    return DeviceAnalysis(device="dm-0", kind="dm", layers=[
        Layer(name="dm-0 multipath", kind=LayerKind.MULTIPATH, source="sum of its paths"),
        Layer(name="sdb+sdc", kind=LayerKind.DISK, source="unknown: array LUN", parts=[
            Part(name="sdb", source="unknown", devices=["sdb"]),
            Part(name="sdc", source="unknown", devices=["sdc"])]),
        Layer(name="host1+host2 qla2xxx", kind=LayerKind.PORT, ceiling_bytes_per_second=1594 * MB,
              source="2 x 8GFC", parts=[fc_part("host1", ["sdb"]), fc_part("host2", ["sdc"])]),
        Layer(name="0000:04:00.0+0000:04:00.1", kind=LayerKind.PCI, ceiling_bytes_per_second=4000 * MB,
              source="2 x PCIe 5 GT/s x4", parts=[
                  Part(name="0000:04:00.0", ceiling_bytes_per_second=2000 * MB, source="pcie",
                       devices=["sdb"]),
                  Part(name="0000:04:00.1", ceiling_bytes_per_second=2000 * MB, source="pcie",
                       devices=["sdc", "sdb"])]),  # a device listed twice counts once
    ])


def lun_stats(b: float = 770.0, c: float = 770.0, **kw: float) -> list[DeviceStats]:
    return [stat("dm-0", "target", None, mbps=b + c, iops=(b + c) * 2, util=None, queue=None),
            stat("sdb", "mpath-path", "dm-0", mbps=b, iops=b * 2, **kw),
            stat("sdc", "mpath-path", "dm-0", mbps=c, iops=c * 2, **kw)]


def no_nan(data: object) -> None:
    text = json.dumps(data)
    assert "NaN" not in text and "Infinity" not in text


# -- hostile -------------------------------------------------------------------------------------
def test_no_figures_or_no_ceilings_give_no_limit() -> None:
    empty = bottleneck(san_lun(), "seq-read", [])
    assert empty.limit is None and empty.summary == "no figures measured for the target"
    assert all(load.measured_bytes_per_second is None for load in empty.layers)
    unknown = DeviceAnalysis(device="dm-0", kind="dm", layers=[san_lun().layers[1]])
    verdict = bottleneck(unknown, "seq-read", lun_stats())
    assert verdict.limit is None and verdict.summary == "no layer with a known ceiling"
    assert verdict.layers[0].measured_bytes_per_second == 1540 * MB  # shown, though no limit
    assert bottleneck(DeviceAnalysis(device="x", kind="disk"), "s", lun_stats()).layers == []


def test_zero_seconds_backward_counters_and_nan_stay_finite() -> None:
    # zero seconds (rates 0) and counters that went backwards (0 I/Os): nothing crossed
    idle = bottleneck(san_lun(), "s", lun_stats(0.0, 0.0, seconds=0.0))
    assert idle.limit is None and idle.summary == "no I/O measured across a layer with a known ceiling"
    poisoned = [s.model_copy(update={"read_bytes_per_s": math.nan, "util_percent": math.inf,
                                     "queue_depth": math.nan, "await_ms": math.nan})
                for s in lun_stats()]
    verdict = bottleneck(san_lun(), "s", poisoned)
    no_nan(verdict.model_dump(mode="json"))
    zero_ceiling = san_lun()
    zero_ceiling.layers[2].ceiling_bytes_per_second = 0.0
    zero_ceiling.layers[3].ceiling_bytes_per_second = math.nan
    verdict = bottleneck(zero_ceiling, "s", lun_stats())
    assert verdict.limit is None
    no_nan(verdict.model_dump(mode="json"))


def test_a_single_device_has_no_peers_to_stand_out_from() -> None:
    alone = [stat("sdb", "mpath-path", "dm-0", mbps=10, iops=10, await_ms=80.0, util=20.0, queue=0.2)]
    assert saturation(alone) == []


# -- the verdict -----------------------------------------------------------------------------------
def test_the_fc_ports_are_the_limit_of_a_saturated_lun() -> None:
    verdict = bottleneck(san_lun(), "seq-read", lun_stats())
    assert verdict.step == "seq-read" and verdict.device == "dm-0"
    loads = {load.layer: load for load in verdict.layers}
    assert loads["dm-0 multipath"].measured_bytes_per_second == 1540 * MB
    assert loads["dm-0 multipath"].share is None  # no ceiling: shown, never the limit
    assert loads["0000:04:00.0+0000:04:00.1"].measured_bytes_per_second == 1540 * MB
    assert loads["0000:04:00.0+0000:04:00.1"].share == round(1540 / 4000, 4)
    assert verdict.limit is not None and verdict.limit.layer == "host1+host2 qla2xxx"
    assert verdict.limit.share == round(1540 / 1594, 4)
    assert verdict.summary == "host1+host2 qla2xxx, 2 x 8GFC = 1,594 MB/s: measured 1,540 MB/s, 97 %"


def test_iops_decide_when_they_are_the_tighter_ceiling() -> None:
    analysis = DeviceAnalysis(device="md0", kind="md", layers=[
        Layer(name="md0 raid5", kind=LayerKind.MD, source="sum of members",
              ceiling_bytes_per_second=750 * MB, ceiling_iops=400),
        Layer(name="sdb..sdf", kind=LayerKind.DISK, source="7.2k class", estimate=True,
              ceiling_bytes_per_second=750 * MB, ceiling_iops=400, parts=[
                  Part(name=d, source="7.2k class", estimate=True, detail="7.2k HDD",
                       ceiling_bytes_per_second=150 * MB, ceiling_iops=80, devices=[d])
                  for d in ("sdb", "sdc", "sdd", "sde", "sdf")]),
    ])
    stats = [stat("md0", "target", None, mbps=1.2, iops=300, util=None)]
    stats += [stat(d, "md-member", "md0", mbps=0.3, iops=76, util=97.0, queue=3.0, await_ms=12.0)
              for d in ("sdb", "sdc", "sdd", "sde", "sdf")]
    verdict = bottleneck(analysis, "rand-read", stats)
    assert verdict.limit is not None and verdict.limit.layer == "sdb..sdf"
    assert verdict.summary == "sdb..sdf, 5 x 7.2k HDD = 400 IOPS: measured 380 IOPS, 95 % (estimated ceiling)"
    assert [s.device for s in verdict.saturated] == ["sdb", "sdc", "sdd", "sde", "sdf"]
    assert verdict.saturated[0].reasons == ["util 97 %", "queue 3.0"]


def test_repeats_are_averaged_and_a_slow_path_saturates() -> None:
    first = lun_stats(700.0, 700.0)
    second = lun_stats(800.0, 800.0)
    second[2] = second[2].model_copy(update={"await_ms": 9.0, "util_percent": 99.0})
    verdict = bottleneck(san_lun(), "seq-read", first + second)
    assert verdict.limit is not None and verdict.limit.measured_bytes_per_second == 1500 * MB
    (sdc,) = verdict.saturated
    assert sdc.device == "sdc" and sdc.peers_await_ms == 2.0 and sdc.await_ms == 5.5
    assert sdc.reasons == ["await 5.5 ms = 2.8 x its peers' median"]


def test_a_probe_read_figure_bounds_reads_not_writes() -> None:
    """A probe only reads: a write step is not judged against the disk's probed read figure
    (a loop device over the page cache writes far faster than it reads back)."""
    from stortune.schemas.analysis.layers import device_analysis
    from stortune.schemas.analysis.model import MeasuredCeiling
    from stortune.schemas.topology import Device, DeviceKind, Topology

    topology = Topology(devices=[Device(name="loop0", kind=DeviceKind.LOOP, id="loop:/x.img")])
    probed = {"loop0": MeasuredCeiling(device="loop0", read_bytes_per_second=996e6, read_iops=58_000.0)}
    analysis = device_analysis(topology, "loop0", probed)

    def step(read: float, write: float) -> list[DeviceStats]:
        return [DeviceStats(device="loop0", relation="target", seconds=10.0, read_ios=1, write_ios=1,
                            read_bytes=int(read * 10), write_bytes=int(write * 10), read_iops=10.0,
                            write_iops=10.0, read_bytes_per_s=read, write_bytes_per_s=write,
                            util_percent=93.0)]

    reads = bottleneck(analysis, "seq/read", step(998e6, 0.0))
    assert reads.limit is not None and reads.limit.share == 1.002
    assert reads.summary == "loop0, probed read = 996 MB/s: measured 998 MB/s, 100 %"
    writes = bottleneck(analysis, "seq/write", step(0.0, 2592e6))
    assert writes.limit is None and writes.layers[0].share is None
    assert writes.layers[0].ceiling_bytes_per_second == 996e6  # shown, not judged
