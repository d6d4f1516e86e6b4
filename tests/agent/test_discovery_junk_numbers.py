"""Numbers no kernel writes (negative sizes, 30-digit counts, "²") in sysfs: discovery reads
them as unknown, so the topology it reports still validates on the control plane."""

from __future__ import annotations

import os
from pathlib import Path

from stortune.agent.discovery import discover
from stortune.agent.procfs import parse_meminfo_total
from stortune.schemas.topology import Topology
from tests.fixtures.scenarios import SCENARIOS


def _write(path: Path, text: str) -> None:
    os.chmod(path, 0o644)
    path.write_text(text)


def test_junk_numbers_are_unknown_and_the_topology_validates(tmp_path: Path) -> None:
    fs = SCENARIOS["md_raid5_fileserver"](tmp_path / "host")
    md = (fs.sysfs / "class/block/md126").resolve()
    sdb = (fs.sysfs / "class/block/sdb").resolve()
    _write(md / "md/raid_disks", "99999\n")
    _write(md / "md/degraded", "-1\n")
    _write(md / "md/component_size", "9" * 30 + "\n")
    _write(md / "md/chunk_size", "\u00b2\n")
    _write(sdb / "size", "-8\n")
    _write(sdb / "alignment_offset", "-7\n")
    _write(sdb / "queue/optimal_io_size", "1_048_576\n")
    topology = discover(fs)
    again = Topology.model_validate_json(topology.model_dump_json())  # what the server does
    array, disk = again.device("md126"), again.device("sdb")
    assert array is not None and array.md is not None and disk is not None
    assert (array.md.raid_disks, array.md.degraded, array.md.component_bytes, array.md.chunk_bytes) == (
        None, None, None, None)
    assert (disk.size_bytes, disk.alignment_offset, disk.optimal_io_size) == (None, None, None)


def test_an_alignment_offset_of_minus_one_is_kept(tmp_path: Path) -> None:
    fs = SCENARIOS["md_raid5_fileserver"](tmp_path / "host")
    _write((fs.sysfs / "class/block/sdb").resolve() / "alignment_offset", "-1\n")
    disk = discover(fs).device("sdb")
    assert disk is not None and disk.alignment_offset == -1


def test_a_memtotal_in_other_digits_is_unknown() -> None:
    assert parse_meminfo_total("MemTotal:       \u00b2\u00b3 kB\n") is None
    assert parse_meminfo_total("MemTotal:       \u0663\u0663 kB\n") is None
    assert parse_meminfo_total("MemTotal:       16384 kB\n") == 16384 * 1024
