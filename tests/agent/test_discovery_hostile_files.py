"""Attributes that are not what sysfs ever holds: a FIFO, a link out of the root, a huge
file, a directory, a VPD page with garbage lengths. Discovery must finish, read none of
them as a value, and report a topology the control plane accepts."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest

from stortune.agent.discovery import _rotation_rpm, discover
from stortune.agent.kernelfs import KernelFS
from stortune.schemas.topology import Topology
from tests.fixtures.scenarios import SCENARIOS

SDB_SCSI = "devices/pci0000:00/0000:00:17.0/ata2/host1/target1:0:0/1:0:0:0"
SDA_LINK = "devices/pci0000:00/0000:00:17.0/ata1/link1/ata_link/link1"
MD = "devices/virtual/block/md126/md"


def _replace_with_fifo(path: Path) -> Path:
    path.unlink()
    os.mkfifo(path)
    return path


def _release(fifos: list[Path]) -> None:
    """Open the write end of every FIFO a reader is blocked on, so a hung test can end."""
    for fifo in fifos:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            continue  # nobody is reading it
        os.close(fd)


def _discover_bounded(fs: KernelFS, fifos: list[Path]) -> Topology:
    """discover() in a thread: a read blocked on a FIFO fails the test instead of hanging it."""
    box: list[Topology] = []
    worker = threading.Thread(target=lambda: box.append(discover(fs)), daemon=True)
    worker.start()
    worker.join(60)
    hung = worker.is_alive()
    for _ in range(1000):
        if not worker.is_alive():
            break
        _release(fifos)
        worker.join(0.05)
    assert not hung, "discovery blocked reading a FIFO"
    assert box, "discovery raised"
    return Topology.model_validate_json(box[0].model_dump_json())  # what the server does


def test_fifos_in_place_of_attributes_are_skipped_without_blocking(tmp_path: Path) -> None:
    fs = SCENARIOS["md_raid5_fileserver"](tmp_path / "host")
    sys = fs.sysfs
    fifos = [
        _replace_with_fifo(sys / SDA_LINK / "sata_spd"),           # read
        _replace_with_fifo(sys / SDB_SCSI / "vpd_pgb1"),           # read_bytes
        _replace_with_fifo(sys / MD / "sync_completed"),
        _replace_with_fifo(sys / MD / "sync_speed_min"),
        _replace_with_fifo(fs.procfs / "meminfo"),                 # read_table
        _replace_with_fifo((sys / "class/block/sdc").resolve() / "queue/scheduler"),  # tunables
    ]
    topology = _discover_bounded(fs, fifos)
    sda, sdb, sdc, md = (topology.device(n) for n in ("sda", "sdb", "sdc", "md126"))
    assert sda is not None and sda.link_rate is None
    assert sdb is not None and sdb.rotation_rpm is None
    assert md is not None and md.md is not None
    assert (md.md.sync_completed, md.md.sync_speed_min_kib) == (None, None)
    assert md.md.sync_speed_max_kib is not None  # the regular file next to them is still read
    assert topology.memory_bytes is None
    assert sdc is not None and not sdc.tunables["scheduler"].supported


def test_links_out_of_the_sysfs_root_are_not_followed(tmp_path: Path) -> None:
    fs = SCENARIOS["md_raid5_fileserver"](tmp_path / "host")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("SECRET 3.0 Gbps\n")
    (outside / "meminfo").write_text("MemTotal:       1024 kB\n")
    (outside / "b1").write_bytes(bytes([0, 0xB1, 0, 0x3C, 0x1C, 0x20]) + bytes(58))  # 7200 rpm
    link_dir = outside / "link1"
    link_dir.mkdir()
    (link_dir / "sata_spd").write_text("1.5 Gbps\n")

    sdb_scsi = fs.sysfs / SDB_SCSI
    for attr in ("model", "vendor"):
        (sdb_scsi / attr).unlink()
        (sdb_scsi / attr).symlink_to(outside / "secret")
    (sdb_scsi / "vpd_pgb1").unlink()
    (sdb_scsi / "vpd_pgb1").symlink_to(outside / "b1")
    (fs.procfs / "meminfo").unlink()
    (fs.procfs / "meminfo").symlink_to(outside / "meminfo")
    # a directory link on the way: .../link1/ata_link/link1 -> outside
    ata_link = fs.sysfs / SDA_LINK
    shutil.rmtree(ata_link)
    ata_link.symlink_to(link_dir)

    topology = _discover_bounded(fs, [])
    assert "SECRET" not in topology.model_dump_json()
    sda, sdb = topology.device("sda"), topology.device("sdb")
    assert sdb is not None and (sdb.model, sdb.vendor, sdb.rotation_rpm) == (None, None, None)
    assert sda is not None and sda.link_rate is None
    assert topology.memory_bytes is None


def test_a_link_inside_the_root_is_still_followed(tmp_path: Path) -> None:
    fs = SCENARIOS["md_raid5_fileserver"](tmp_path / "host")
    sdb_scsi = fs.sysfs / SDB_SCSI
    (sdb_scsi / "model").unlink()
    (fs.sysfs / "model-elsewhere").write_text("WDC WD40EFRX\n")
    (sdb_scsi / "model").symlink_to(fs.sysfs / "model-elsewhere")
    sdb = discover(fs).device("sdb")
    assert sdb is not None and sdb.model == "WDC WD40EFRX"


def test_huge_files_and_directories_are_bounded(tmp_path: Path) -> None:
    fs = SCENARIOS["md_raid5_fileserver"](tmp_path / "host")
    sdb_scsi = fs.sysfs / SDB_SCSI
    (sdb_scsi / "model").write_text("M" * (8 << 20))  # a sysfs attribute is one page
    sata_spd = fs.sysfs / SDA_LINK / "sata_spd"
    sata_spd.unlink()
    sata_spd.mkdir()
    # /proc tables are read whole, but not without end: a sparse 1 GiB meminfo
    with open(fs.procfs / "meminfo", "r+b") as fh:
        fh.truncate(1 << 30)
    topology = _discover_bounded(fs, [])
    sda, sdb = topology.device("sda"), topology.device("sdb")
    assert sdb is not None and sdb.model is None
    assert sda is not None and sda.link_rate is None
    assert topology.memory_bytes is None


@pytest.mark.parametrize("page", [
    b"",
    bytes([0, 0xB1, 0xFF, 0xFF]),                       # a page length of 65535, 4 bytes given
    bytes([0, 0xB1, 0, 0x3C, 0x1C]),                   # cut inside the rotation rate
    bytes([0, 0xB0, 0, 0x3C, 0x1C, 0x20]) + bytes(58),  # another page
    bytes([0, 0xB1, 0, 0x3C, 0xFF, 0xFF]) + bytes(58),  # reserved rate
    bytes([0, 0xB1, 0, 0x3C, 0x00, 0x02]) + bytes(58),  # reserved rate
    bytes([0, 0xB1, 0, 0x3C, 0x1C, 0x20]) + bytes(1 << 16),  # longer than its length says
])
def test_vpd_b1_pages_with_garbage_lengths_are_unknown_or_read_at_fixed_offsets(
        page: bytes) -> None:
    expected = 7200 if page[:2] == b"\x00\xb1" and page[4:6] == b"\x1c\x20" else None
    assert _rotation_rpm(page) == expected
