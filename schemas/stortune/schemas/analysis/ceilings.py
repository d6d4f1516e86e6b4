"""Ceilings: what one link, port or disk can carry at most, from the text sysfs shows.

One function per source. Each returns a ``Ceiling`` (bytes/s, per direction, and a source
string saying which attribute said what and how the figure follows from it), or None when
the text says nothing usable ("unknown", empty, garbage, absurd figures). None means
unknown: never 0, never an exception, because sysfs text comes from drivers and firmware.

Encodings are counted: 8b/10b carries 8 data bits in 10 line bits, 64b/66b 64 in 66,
128b/130b 128 in 130, 24G SAS 128b/150b, PCIe 6.0 FLIT mode 242 of 256 bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from stortune.schemas.analysis.diskclass import MB, RAID_DRIVERS, disk_class
from stortune.schemas.analysis.model import MeasuredCeiling
from stortune.schemas.topology import Device, DeviceKind, PciLink

#: FC speed -> (GBd line rate, data bits, line bits). 1/2/4/8GFC use 8b/10b; 16/32GFC 64b/66b.
FC_LINE_RATES: Final = {
    1: (1.0625, 8, 10), 2: (2.125, 8, 10), 4: (4.25, 8, 10), 8: (8.5, 8, 10),
    16: (14.025, 64, 66), 32: (28.05, 64, 66),
}
#: The field's figure: 797 of the 850 MB/s an 8GFC link carries is FCP payload (frame
#: headers, CRC, delimiters and inter-frame fill take the rest); the same share at every speed.
FC_PAYLOAD_SHARE: Final = 797 / 850

#: SAS negotiated_linkrate Gbit -> (data bits, line bits).
SAS_ENCODING: Final = {1.5: (8, 10), 3.0: (8, 10), 6.0: (8, 10), 12.0: (8, 10), 22.5: (128, 150)}
SATA_RATES: Final = (1.5, 3.0, 6.0)
#: PCIe GT/s -> (data bits, line bits, encoding name).
PCIE_ENCODING: Final = {
    2.5: (8, 10, "8b/10b"), 5.0: (8, 10, "8b/10b"), 8.0: (128, 130, "128b/130b"),
    16.0: (128, 130, "128b/130b"), 32.0: (128, 130, "128b/130b"),
    64.0: (242, 256, "FLIT 242/256"),
}
PCIE_WIDTHS: Final = (1, 2, 4, 8, 12, 16, 32)

_FC_SPEED = re.compile(r"^\s*(\d{1,3})\s*Gbit\s*$")
_SAS_RATE = re.compile(r"^\s*(\d{1,2}(?:\.\d)?)\s*Gbit\s*$")
_SATA_SPD = re.compile(r"^\s*(\d(?:\.\d)?)\s*Gbps\s*$")
_PCIE_SPEED = re.compile(r"^\s*(\d{1,2}(?:\.\d{1,2})?)\s*GT/s(?:\s+PCIe)?\s*$")


@dataclass(frozen=True)
class Ceiling:
    bytes_per_second: float | None
    source: str
    iops: float | None = None
    estimate: bool = False
    detail: str | None = None


def mb(value: float) -> str:
    """Bytes/s as the field writes it: 1,594 MB/s."""
    return f"{value / MB:,.0f} MB/s"


def _number(match: re.Match[str] | None) -> float | None:
    if match is None:
        return None
    try:
        return float(match.group(1))
    except ValueError:
        return None


def fc_port(speed: str | None, host: str, state: str | None = None) -> Ceiling | None:
    """fc_host/HOST/speed ("8 Gbit") -> FCP payload per direction; a port not Online carries
    nothing and is unknown."""
    if speed is None:
        return None
    gbit = _number(_FC_SPEED.match(speed))
    if gbit is None or int(gbit) not in FC_LINE_RATES:
        return None
    if state is not None and state.strip().lower() != "online":
        return None
    gbaud, data, line = FC_LINE_RATES[int(gbit)]
    line_bytes = gbaud * 1e9 * data / line / 8
    payload = line_bytes * FC_PAYLOAD_SHARE
    return Ceiling(payload, f"fc_host/{host}/speed {speed.strip()}: {gbaud:g} GBd {data}b/{line}b,"
                            f" FCP payload = {mb(payload)}", detail=f"{int(gbit)}GFC")


def sas_phy(rate: str | None, phy: str) -> Ceiling | None:
    """sas_phy/PHY/negotiated_linkrate ("12.0 Gbit") -> bytes/s per direction."""
    gbit = _number(_SAS_RATE.match(rate)) if rate is not None else None
    if rate is None or gbit is None or gbit not in SAS_ENCODING:
        return None
    data, line = SAS_ENCODING[gbit]
    value = gbit * 1e9 * data / line / 8
    return Ceiling(value, f"sas_phy/{phy}/negotiated_linkrate {rate.strip()}: {data}b/{line}b ="
                          f" {mb(value)}", detail=f"{gbit:g} Gbit SAS")


def ata_link(spd: str | None, link: str) -> Ceiling | None:
    """ata_link/LINK/sata_spd ("6.0 Gbps") -> bytes/s: SATA is 8b/10b at every speed."""
    gbps = _number(_SATA_SPD.match(spd)) if spd is not None else None
    if spd is None or gbps is None or gbps not in SATA_RATES:
        return None
    value = gbps * 1e9 * 8 / 10 / 8
    return Ceiling(value, f"ata_link/{link}/sata_spd {spd.strip()}: 8b/10b = {mb(value)}",
                   detail=f"SATA {gbps:g} Gbps")


def pcie(link: PciLink) -> Ceiling | None:
    """current_link_speed x current_link_width -> bytes/s per direction, encoding counted."""
    speed, width = link.current_link_speed, link.current_link_width
    gts = _number(_PCIE_SPEED.match(speed)) if speed is not None else None
    if speed is None or gts is None or gts not in PCIE_ENCODING or width not in PCIE_WIDTHS:
        return None
    data, line, encoding = PCIE_ENCODING[gts]
    lane = gts * 1e9 * data / line / 8
    value = lane * width
    return Ceiling(value, f"{link.address} current_link_speed {speed.strip()} x{width}: {encoding}"
                          f" = {width} x {mb(lane)} = {mb(value)}",
                   detail=f"PCIe {gts:g} GT/s x{width}")


#: The detail of a probe's figure: probes only read, so it bounds reads alone.
PROBED_READ: Final = "probed read"


def measured(ceiling: MeasuredCeiling) -> Ceiling | None:
    """A probe's figure for one device alone: sequential read bytes/s and random read IOPS."""
    value = ceiling.read_bytes_per_second
    if value is None or not 0 < value < 1e15:
        return None
    run = f" {ceiling.run_id}" if ceiling.run_id else ""
    iops = ceiling.read_iops if ceiling.read_iops is not None and ceiling.read_iops > 0 else None
    extra = f", {iops:,.0f} IOPS" if iops is not None else ""
    return Ceiling(value, f"measured by probe{run}: {mb(value)} sequential read{extra}",
                   iops=iops, detail=PROBED_READ)


def disk(dev: Device) -> Ceiling:
    """A disk's class estimate, or an unknown ceiling that says why."""
    cls = disk_class(dev)
    if cls is not None:
        basis = (f"rotation rate {dev.rotation_rpm} rpm (VPD B1)" if dev.rotation_rpm not in (None, 1)
                 else "non-rotating (VPD B1)" if dev.rotation_rpm == 1
                 else "NVMe" if dev.transport == "nvme"
                 else f"rotational={int(bool(dev.rotational))}, no rotation rate")
        return Ceiling(cls.bytes_per_second, f"estimate: {cls.name} class ({basis}):"
                                             f" {mb(cls.bytes_per_second)}, {cls.iops:,.0f} IOPS",
                       iops=cls.iops, estimate=True, detail=cls.name)
    if dev.transport in ("fc", "iscsi"):
        why = f"{dev.transport} LUN of an array"
    elif dev.driver in RAID_DRIVERS:
        why = f"{dev.driver} RAID volume"
    elif dev.kind in (DeviceKind.LOOP, DeviceKind.ZRAM) or dev.transport == "virtio":
        why = "virtual device"
    else:
        why = "no device class"
    return Ceiling(None, f"{why}: unknown until measured (stortune probe)")
