"""The procfs parsers on text as kernels print it."""

from __future__ import annotations

from stortune.agent import procfs


def test_mountinfo_fields_escapes_and_optional_fields() -> None:
    text = (
        "22 1 8:2 / / rw,relatime shared:1 - ext4 /dev/sda2 rw,errors=remount-ro\n"
        r"41 22 259:3 / /data/fast\040scratch rw,noatime shared:30 master:2 - xfs"
        r" /dev/nvme0n1p3 rw,attr2,inode64" "\n"
        r"42 22 0:51 /sub\134dir /mnt/tab\011ed rw - btrfs /dev/sdb rw,space_cache=v2" "\n"
        "43 22 0:52 / /empty rw - tmpfs none \n"
    )
    mounts, problems = procfs.parse_mountinfo(text)
    assert problems == []
    root, scratch, btrfs, tmpfs = mounts
    assert (root.mount_id, root.parent_id, root.devno) == (22, 1, "8:2")
    assert root.optional == ("shared:1",)
    assert root.super_options == ("rw", "errors=remount-ro")
    assert scratch.mountpoint == "/data/fast scratch"
    assert scratch.optional == ("shared:30", "master:2")
    assert (scratch.fstype, scratch.source) == ("xfs", "/dev/nvme0n1p3")
    assert btrfs.root == "/sub\\dir"
    assert btrfs.mountpoint == "/mnt/tab\ted"
    assert btrfs.optional == ()
    assert (btrfs.major, btrfs.minor) == (0, 51)
    assert tmpfs.super_options == ()


def test_mountinfo_skips_a_malformed_line_and_says_which() -> None:
    text = "22 1 8:2 / / rw - ext4 /dev/sda2 rw\nnot a mountinfo line\n23 22 8:1 / /boot rw\n"
    mounts, problems = procfs.parse_mountinfo(text)
    assert [m.mountpoint for m in mounts] == ["/"]
    assert len(problems) == 2
    assert problems[0].startswith("mountinfo line 2 skipped")
    assert "separator" in problems[1]


MDSTAT = """\
Personalities : [raid1] [raid10] [raid6] [raid5] [raid4]
md126 : active raid5 sdf1[5] sde1[3] sdd1[2](F) sdc1[1] sdb1[0]
      15627540480 blocks super 1.2 level 5, 512k chunk, algorithm 2 [5/4] [UU_UU]
      [===>.................]  recovery = 17.3% (676089856/3906885120) finish=331.2min speed=162574K/sec
      bitmap: 0/30 pages [0KB], 65536KB chunk

md0 : active raid10 sdd2[3] sdc2[2] sdb2[1] sda2[0]
      7812718592 blocks super 1.2 512K chunks 2 near-copies [4/4] [UUUU]

md1 : active (auto-read-only) raid1 sdh1[1] sdg1[0](W)
      1048512 blocks [2/2] [UU]
        resync=PENDING

md127 : inactive sdi[0](S)
      976631512 blocks super external:imsm

unused devices: <none>
"""


def test_mdstat_arrays_members_and_progress() -> None:
    arrays, problems = procfs.parse_mdstat(MDSTAT)
    assert problems == []
    assert list(arrays) == ["md126", "md0", "md1", "md127"]
    md126 = arrays["md126"]
    assert (md126.active, md126.level, md126.metadata, md126.chunk_kib) == (True, "raid5", "1.2", 512)
    assert (md126.raid_disks, md126.active_disks, md126.status) == (5, 4, "UU_UU")
    assert (md126.action, md126.progress_percent) == ("recovery", 17.3)
    assert md126.blocks == 15627540480
    assert procfs.MdStatMember("sdd1", 2, ("F",)) in md126.members
    md0 = arrays["md0"]
    assert (md0.level, md0.chunk_kib, md0.status) == ("raid10", 512, "UUUU")
    md1 = arrays["md1"]
    assert (md1.read_only, md1.level, md1.metadata, md1.action) == (
        "auto-read-only", "raid1", None, "resync")
    assert md1.members[1] == procfs.MdStatMember("sdg1", 0, ("W",))
    md127 = arrays["md127"]
    assert (md127.active, md127.level, md127.metadata) == (False, None, "external:imsm")
    assert md127.members == [procfs.MdStatMember("sdi", 0, ("S",))]


def test_partitions_table() -> None:
    text = "major minor  #blocks  name\n\n   8        0  976762584 sda\n 259        1     524288 nvme0n1p1\n"
    entries, problems = procfs.parse_partitions(text + "garbage\n")
    assert entries["sda"].devno == "8:0"
    assert entries["nvme0n1p1"] == procfs.PartitionEntry(259, 1, 524288, "nvme0n1p1")
    assert problems == ["partitions line 5 skipped: 'garbage'"]


def test_unescape_octal_leaves_plain_text_alone() -> None:
    assert procfs.unescape_octal("/plain") == "/plain"
    assert procfs.unescape_octal(r"/a\040b\134c") == "/a b\\c"
