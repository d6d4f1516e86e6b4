"""Ceiling parsers: hostile text first (garbage, huge numbers, "unknown", empty -> None,
never an exception), then the figures the field uses."""

from __future__ import annotations

import pytest

from stortune.schemas.analysis import ceilings, diskclass
from stortune.schemas.analysis.model import MeasuredCeiling
from stortune.schemas.topology import Device, DeviceKind, PciLink

HOSTILE = ["", " ", "unknown", "Unknown", "<unknown>", "garbage", "\x00\xff", "8",
           "9" * 400 + " Gbit", "-8 Gbit", "8.5.5 Gbit", "NaN Gbit", "inf Gbit", "1e9 Gbit",
           "8 Gbit 16 Gbit", "Gbit", "8 GBIT\n\n\nx", "8 Gbps", "8 GT/s"]


@pytest.mark.parametrize("text", [*HOSTILE, "3 Gbit", "64 Gbit", "128 Gbit", "10 Gbit"])
def test_fc_speed_hostile_or_unlisted_is_unknown(text: str) -> None:
    assert ceilings.fc_port(text, "host1") is None


def test_fc_port_not_online_is_unknown() -> None:
    assert ceilings.fc_port("8 Gbit", "host1", "Linkdown") is None
    assert ceilings.fc_port(None, "host1") is None


@pytest.mark.parametrize(("speed", "mb_s"), [
    ("1 Gbit", 99.6), ("2 Gbit", 199.2), ("4 Gbit", 398.5), ("8 Gbit", 797.0),
    ("16 Gbit", 1594.0), ("32 Gbit", 3188.0),
])
def test_fc_payload_per_direction(speed: str, mb_s: float) -> None:
    c = ceilings.fc_port(speed, "host1", "Online")
    assert c is not None and c.bytes_per_second is not None
    assert c.bytes_per_second / 1e6 == pytest.approx(mb_s, abs=0.1)


def test_fc_source_says_where_the_figure_came_from() -> None:
    c = ceilings.fc_port("8 Gbit", "host1")
    assert c is not None
    assert c.source == "fc_host/host1/speed 8 Gbit: 8.5 GBd 8b/10b, FCP payload = 797 MB/s"
    assert c.detail == "8GFC" and not c.estimate


@pytest.mark.parametrize("text", [*HOSTILE, None, "Phy disabled", "Link Rate Unknown",
                                  "7.0 Gbit", "6.0 Gbps"])
def test_sas_rate_hostile_is_unknown(text: str | None) -> None:
    assert ceilings.sas_phy(text, "phy-0:0") is None


@pytest.mark.parametrize(("rate", "mb_s"), [("1.5 Gbit", 150), ("3.0 Gbit", 300),
                                            ("6.0 Gbit", 600), ("12.0 Gbit", 1200),
                                            ("22.5 Gbit", 2400)])
def test_sas_rates(rate: str, mb_s: float) -> None:
    c = ceilings.sas_phy(rate, "phy-0:3")
    assert c is not None and c.bytes_per_second == pytest.approx(mb_s * 1e6)
    assert c.source.startswith(f"sas_phy/phy-0:3/negotiated_linkrate {rate}: ")


@pytest.mark.parametrize("text", [*HOSTILE, None, "12.0 Gbps", "6.0 Gbit"])
def test_sata_spd_hostile_is_unknown(text: str | None) -> None:
    assert ceilings.ata_link(text, "link1") is None


@pytest.mark.parametrize(("spd", "mb_s"), [("1.5 Gbps", 150), ("3.0 Gbps", 300), ("6.0 Gbps", 600)])
def test_sata_rates(spd: str, mb_s: float) -> None:
    c = ceilings.ata_link(spd, "link2")
    assert c is not None and c.bytes_per_second == pytest.approx(mb_s * 1e6)
    assert c.source == f"ata_link/link2/sata_spd {spd}: 8b/10b = {mb_s:,} MB/s"


@pytest.mark.parametrize(("speed", "width"), [
    *((text, 8) for text in HOSTILE if text != "8 GT/s"), (None, 8), ("Unknown speed", 8),
    ("8.0 GT/s PCIe", None),
    ("8.0 GT/s PCIe", 0), ("8.0 GT/s PCIe", 3), ("8.0 GT/s PCIe", 10**12), ("8.0 GT/s PCIe", -4),
    ("7.0 GT/s PCIe", 4), ("2.5 GT/s PCIe x", 8),
])
def test_pcie_hostile_is_unknown(speed: str | None, width: int | None) -> None:
    # model_construct: the model refuses a negative or absurd width; the parser must not rely on it
    assert ceilings.pcie(PciLink.model_construct(address="0000:01:00.0", current_link_speed=speed,
                                                 current_link_width=width)) is None


@pytest.mark.parametrize(("speed", "width", "mb_s"), [
    ("2.5 GT/s", 8, 2000), ("2.5 GT/s PCIe", 8, 2000), ("5 GT/s", 8, 4000),
    ("5.0 GT/s PCIe", 8, 4000), ("8.0 GT/s PCIe", 4, 3938.5), ("16.0 GT/s PCIe", 16, 31507.7),
    ("32.0 GT/s PCIe", 4, 15753.8), ("64.0 GT/s PCIe", 1, 7562.5),
])
def test_pcie_links(speed: str, width: int, mb_s: float) -> None:
    c = ceilings.pcie(PciLink(address="0000:04:00.0", current_link_speed=speed,
                              current_link_width=width))
    assert c is not None and c.bytes_per_second is not None
    assert c.bytes_per_second / 1e6 == pytest.approx(mb_s, abs=0.1)
    assert c.source.startswith(f"0000:04:00.0 current_link_speed {speed} x{width}: ")


@pytest.mark.parametrize("value", [None, 0.0, -5.0, float("nan"), float("inf"), 1e300])
def test_a_measured_figure_that_is_not_one_is_ignored(value: float | None) -> None:
    # the model refuses negative and non-finite figures now; one stored before is still ignored
    stored = MeasuredCeiling.model_construct(device="sdb", read_bytes_per_second=value)
    assert ceilings.measured(stored) is None


def test_measured_figure() -> None:
    c = ceilings.measured(MeasuredCeiling(device="sdb", read_bytes_per_second=183e6,
                                          read_iops=352, run_id="p1"))
    assert c is not None and (c.bytes_per_second, c.iops, c.estimate) == (183e6, 352, False)
    assert c.source == "measured by probe p1: 183 MB/s sequential read, 352 IOPS"


def disk(**kw: object) -> Device:
    return Device.model_validate({"name": "sdx", "kind": DeviceKind.DISK, "id": "name:sdx", **kw})


@pytest.mark.parametrize(("kw", "cls"), [
    ({"rotation_rpm": 5400}, diskclass.HDD_5400), ({"rotation_rpm": 7200}, diskclass.HDD_7200),
    ({"rotation_rpm": 10000}, diskclass.HDD_10K), ({"rotation_rpm": 10025}, diskclass.HDD_10K),
    ({"rotation_rpm": 15000}, diskclass.HDD_15K), ({"rotation_rpm": 1}, diskclass.SATA_SSD),
    ({"rotational": True, "transport": "sas"}, diskclass.HDD_7200),
    ({"rotational": False, "transport": "sata"}, diskclass.SATA_SSD),
    ({"transport": "nvme", "rotational": False}, diskclass.NVME_SSD),
    ({"transport": "fc", "rotational": True}, None),
    ({"driver": "megaraid_sas", "rotational": True}, None),
    ({"transport": "virtio", "rotational": True}, None),
    ({}, None),
])
def test_device_class(kw: dict[str, object], cls: diskclass.DiskClass | None) -> None:
    assert diskclass.disk_class(disk(**kw)) == cls
    c = ceilings.disk(disk(**kw))
    assert c.estimate == (cls is not None)
    assert (c.bytes_per_second is None) == (cls is None)
    if cls is None:
        assert "unknown until measured" in c.source
