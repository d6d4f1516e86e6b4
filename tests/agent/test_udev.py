"""udev rules name each device by the most stable key udev sees: md arrays by their UUID."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from stortune.agent import local, udev
from stortune.schemas.profile import StorageProfile
from stortune.schemas.topology import Device, DeviceKind, DmInfo, MdInfo
from tests.conftest import Golden
from tests.fixtures.scenarios import SCENARIOS

PROFILE = """
apiVersion: stortune/v1
kind: StorageProfile
metadata: {name: arrays-and-disks}
spec:
  rules:
    - name: arrays
      match: {kind: [md]}
      settings: {read_ahead_kb: 8192}
    - name: disks
      match: {kind: [disk]}
      settings: {read_ahead_kb: 256}
"""


def rules(scenario: str, tmp_path: Path) -> list[str]:
    fs = SCENARIOS[scenario](tmp_path / scenario)
    doc = tmp_path / "profile.yaml"
    doc.write_text(PROFILE)
    profiles: list[StorageProfile] = local.read_profiles([str(doc)])
    planned = local.plan(fs, profiles)
    return udev.render(profiles, planned.topology, planned.plan).splitlines()


@pytest.mark.parametrize("scenario", ["md_raid5_fileserver", "lvm_on_md"])
def test_rules_match_golden(scenario: str, tmp_path: Path, golden: Golden) -> None:
    golden.check(f"udev/{scenario}.json", rules(scenario, tmp_path))


def test_an_md_array_is_keyed_by_its_uuid_not_its_kernel_name(tmp_path: Path) -> None:
    """md126 is renumbered md127 by the next assembly; the array's UUID is what stays."""
    lines = rules("md_raid5_fileserver", tmp_path)
    (array,) = [line for line in lines if 'ATTR{queue/read_ahead_kb}="8192"' in line]
    assert 'ATTR{md/uuid}=="8c5e2f1a-3b4d-4e6f-9a7b-1c2d3e4f5a6b"' in array
    assert "KERNEL==" not in array
    assert "# md126 by array UUID (mdadm: 8c5e2f1a:3b4d4e6f:9a7b1c2d:3e4f5a6b)" in lines
    assert not any("no stable id" in line for line in lines)


def test_an_array_whose_kernel_shows_no_uuid_falls_back_to_its_name(tmp_path: Path) -> None:
    """Linux before 5.7 has no md/uuid: the kernel name is all there is, and the rule says so."""
    lines = rules("lvm_on_md", tmp_path)
    (array,) = [line for line in lines if 'ATTR{queue/read_ahead_kb}="8192"' in line]
    assert 'KERNEL=="md0"' in array
    assert "# md0 by kernel name (no stable id)" in lines


def md(uuid_text: str | None, metadata: str = "1.2") -> Device:
    return Device(name="md5", kind=DeviceKind.MD, id="md5",
                  md=MdInfo(level="raid1", uuid=uuid_text, metadata_version=metadata))


@pytest.mark.parametrize(("uuid_text", "metadata"), [
    ("00000000-0000-0000-0000-000000000000", "external:imsm"),  # the kernel never read the superblock
    ("00000000-0000-0000-0000-000000000000", "1.2"),
    ("8c5e2f1a-3b4d-4e6f-9a7b-1c2d3e4f5a6b", "external:/md127/0"),
    ('8c5e2f1a" RUN+="/bin/sh -c reboot', "1.2"),                # a hostile sysfs value
    ("8c5e2f1a-3b4d-4e6f-9a7b-1c2d3e4f5a6b\nKERNEL==\"sda", "1.2"),
    ("not-a-uuid", "1.2"),
    ("", "1.2"),
    (None, "1.2"),
])
def test_hostile_or_empty_uuids_are_not_keys(uuid_text: str | None, metadata: str) -> None:
    key, what = udev.device_key(md(uuid_text, metadata))
    assert key == 'KERNEL=="md5"' and "no stable id" in what


def test_mdadm_spelling_of_the_uuid_follows_the_metadata_version() -> None:
    """What `mdadm --detail` prints: 1.x superblocks keep the bytes in order; 0.90 ones hold host-order
    words, which md/uuid shows byte by byte, reversed on a little-endian host."""
    array = uuid.UUID("8c5e2f1a-3b4d-4e6f-9a7b-1c2d3e4f5a6b")
    assert udev.mdadm_uuid(array, "1.2") == "8c5e2f1a:3b4d4e6f:9a7b1c2d:3e4f5a6b"
    assert udev.mdadm_uuid(array, "0.90", "little") == "1a2f5e8c:6f4e4d3b:2d1c7b9a:6b5a4f3e"
    assert udev.mdadm_uuid(array, "0.90", "big") == "8c5e2f1a:3b4d4e6f:9a7b1c2d:3e4f5a6b"
    key, what = udev.device_key(md("8c5e2f1a-3b4d-4e6f-9a7b-1c2d3e4f5a6b", "0.90"))
    assert key == 'ATTR{md/uuid}=="8c5e2f1a-3b4d-4e6f-9a7b-1c2d3e4f5a6b"'
    assert what == f"md5 by array UUID (mdadm: {udev.mdadm_uuid(array, '0.90')})"


# -- values the device reports, put into a rule ----------------------------------------------------
def disk(**facts: str) -> Device:
    return Device(name="sdc", kind=DeviceKind.DISK, id=facts.pop("id", "name:sdc"), **facts)  # type: ignore[arg-type]


@pytest.mark.parametrize(("facts", "key"), [
    # udev reads a match value as a glob: '*', '?', '[...]' and '|' (alternatives) match other devices.
    # A serial is matched as udev spells ID_SERIAL_SHORT, which keeps none of them.
    ({"serial": "*"}, 'ENV{ID_SERIAL_SHORT}=="_"'),
    ({"serial": "ZA1|*"}, 'ENV{ID_SERIAL_SHORT}=="ZA1__"'),
    ({"serial": "ZA[0-9]?"}, 'ENV{ID_SERIAL_SHORT}=="ZA_0-9__"'),
    # A line break starts a rule of the device's choosing; a backslash escapes the closing quote.
    ({"serial": 'ZA1\nACTION=="add", RUN+="/bin/sh"'},
     'ENV{ID_SERIAL_SHORT}=="ZA1_ACTION==_add___RUN+=__bin_sh_"'),
    ({"serial": "ZA1\\"}, 'ENV{ID_SERIAL_SHORT}=="ZA1_"'),
    # A WWN is matched as the kernel shows it, or not at all.
    ({"id": "wwn:naa.5000c500*", "wwn": "naa.5000c500*"}, 'KERNEL=="sdc"'),
    ({"id": "wwn:naa.5|*", "wwn": "naa.5|*", "serial": "ZA1"}, 'ENV{ID_SERIAL_SHORT}=="ZA1"'),
    ({"id": "wwn:t10.ATA_X\\x01Y", "wwn": "t10.ATA     X\\x01Y"}, 'KERNEL=="sdc"'),  # the kernel's escape
])
def test_hostile_device_reported_values_never_reach_a_rule_as_patterns(facts: dict[str, str],
                                                                       key: str) -> None:
    """A serial or WWN comes from the device (a USB stick, an iSCSI target): a rule keyed by one holding
    a glob character applied this device's settings to every disk at boot."""
    found, what = udev.device_key(disk(**facts))
    assert found == key
    assert "\n" not in what


def test_hostile_a_dm_name_cannot_break_out_of_its_comment(tmp_path: Path) -> None:
    dev = Device(name="dm-3", kind=DeviceKind.DM, id="uuid:CRYPT-x",
                 dm=DmInfo(name='x\nACTION=="add", RUN+="/bin/sh -c reboot"', uuid="CRYPT-LUKS2-abc-x"))
    key, what = udev.device_key(dev)
    assert key == 'ENV{DM_UUID}=="CRYPT-LUKS2-abc-x"' and "\n" not in what


def test_a_t10_wwid_is_matched_as_the_kernel_shows_it() -> None:
    """ATTRS{wwid} is the attribute as the kernel prints it, spaces and all; the topology's id
    replaced each run of spaces with '_', so a rule keyed by the id never matched."""
    wwid = "t10.ATA     QEMU HARDDISK                           QM00005"
    key, what = udev.device_key(disk(id="wwn:t10.ATA_QEMU_HARDDISK_QM00005", wwn=wwid))
    assert key == f'ATTRS{{wwid}}=="{wwid}"' and what == "sdc by WWN"


def test_a_serial_is_matched_as_udev_spells_id_serial_short() -> None:
    """udev's ID_SERIAL_SHORT replaces whitespace runs, and characters it does not keep, with '_'."""
    key, _ = udev.device_key(disk(serial="WD-WCC 4E1234  ", id="serial:WD-WCC_4E1234"))
    assert key == 'ENV{ID_SERIAL_SHORT}=="WD-WCC_4E1234"'
