"""Small hand-built topologies for planner tests (the agent tests use real sysfs trees)."""

from __future__ import annotations

from stortune.schemas.topology import (
    Device,
    DeviceKind,
    MdInfo,
    MdMember,
    Role,
    ScsiHost,
    Topology,
    TunableState,
)


def num(value: int, maximum: int | None = None, minimum: int | None = None) -> TunableState:
    return TunableState(
        supported=True, value=value, raw=str(value), writable=True, minimum=minimum, maximum=maximum
    )


def sched(current: str, *offered: str) -> TunableState:
    raw = " ".join(f"[{s}]" if s == current else s for s in offered)
    return TunableState(supported=True, value=current, raw=raw, writable=True, choices=list(offered))


ABSENT = TunableState(supported=False, reason="queue/nr_requests is absent on this kernel/device")


def streamer_with_md() -> Topology:
    """A PERC volume sda plus an md RAID5 md0 over sdb1, sdc1, sdd1."""
    disk_q = {
        "scheduler": sched("mq-deadline", "mq-deadline", "kyber", "bfq", "none"),
        "nr_requests": num(64),
        "max_sectors_kb": num(256, maximum=1024),
        "read_ahead_kb": num(128),
    }
    devices = [
        Device(
            name="sda",
            kind=DeviceKind.DISK,
            id="wwn:naa.6001",
            rotational=True,
            vendor="DELL",
            model="PERC 5/i",
            transport="sas",
            size_bytes=2_000_000_000_000,
            scsi_host=ScsiHost(name="host0", driver="megaraid_sas"),
            tunables={**disk_q, "queue_depth": num(64)},
        ),
    ]
    for letter in "bcd":
        devices.append(
            Device(
                name=f"sd{letter}",
                kind=DeviceKind.DISK,
                id=f"serial:Z{letter}",
                rotational=True,
                vendor="ATA",
                model="ST4000NM0033-9ZM",
                transport="sata",
                scsi_host=ScsiHost(name="host1", driver="ahci"),
                partitions=[f"sd{letter}1"],
                tunables=dict(disk_q),
            )
        )
        devices.append(
            Device(
                name=f"sd{letter}1",
                kind=DeviceKind.PARTITION,
                id=f"serial:Z{letter}-part1",
                parent=f"sd{letter}",
                roles=[Role.PARTITION, Role.MD_MEMBER],
                holders=["md0"],
            )
        )
    devices.append(
        Device(
            name="md0",
            kind=DeviceKind.MD,
            id="name:md0",
            slaves=["sdb1", "sdc1", "sdd1"],
            md=MdInfo(
                level="raid5",
                chunk_bytes=524288,
                raid_disks=3,
                members=[MdMember(device=f"sd{x}1", slot=i, state=["in_sync"]) for i, x in enumerate("bcd")],
            ),
            tunables={
                "scheduler": TunableState(
                    supported=True, value="none", raw="none", writable=True, choices=["none"]
                ),
                "nr_requests": ABSENT,
                "read_ahead_kb": num(1024),
                "stripe_cache_size": num(256),
                "sync_speed_max": num(200000),
            },
        )
    )
    return Topology(
        hostname="streamer1",
        kernel="6.1.0",
        devices=devices,
        host_tunables={"dev.raid.speed_limit_min": num(1000), "dev.raid.speed_limit_max": num(200000)},
    )


def perc_volume(name: str = "sdb", *, drives: int | None = 8, level: str = "RAID5",
                strip: int | None = 256 << 10, state: str | None = "Optl",
                span_depth: int | None = None, rotational: bool | None = True,
                backup_state: str = "Optimal", **fields: object) -> Device:
    """A PERC H710 virtual drive as discovery shows it once mapped: a megaraid_sas disk
    carrying its ``VolumeRef``."""
    from stortune.schemas.controllers import BackupUnit, VolumeRef

    ref = VolumeRef(adapter="perc", controller=0, virtual_drive=0, mapped_by="wwn",
                    model="PERC H710", driver="megaraid_sas", firmware_version="21.3.5-0002",
                    raid_level=level, strip_size_bytes=strip, physical_drives=drives,
                    backup=BackupUnit(kind="cachevault", state=backup_state,
                                      optimal=backup_state == "Optimal"),
                    state=state, span_depth=span_depth)
    base: dict[str, object] = dict(
        name=name, kind=DeviceKind.DISK, id=f"wwn:naa.61866da0{name}", rotational=rotational,
        vendor="DELL", model="PERC H710", transport="sas", size_bytes=8_000_000_000_000,
        scsi_host=ScsiHost(name="host0", driver="megaraid_sas"), controller=ref)
    base.update(fields)
    return Device.model_validate(base)
