"""Redaction of what names a filesystem: UUIDs, partition UUIDs, labels, mountpoints, and values
that merely hold a token-shaped part (issue 26, point 7).

The fixture files (tests/fixtures/redact_fs/) are in the tools' own formats: ``lsblk -J -o
NAME,UUID,PARTUUID,LABEL,MOUNTPOINT`` and ``lsblk -J -O``, ``blkid``, the kernel's mount
messages, /proc/self/mountinfo (octal escapes, /dev/disk/by-* sources) and ``mdadm --detail``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from stortune.schemas.bundle import Bundle, BundleInfo
from stortune.schemas.redact import TOKEN, Kind, RedactionMapping, Redactor, redact
from stortune.schemas.topology import Device, DeviceKind, Mount, Topology

FIXTURES = Path(__file__).parents[1] / "fixtures" / "redact_fs"
NOW = datetime(2024, 5, 14, 9, 30, tzinfo=UTC)
BACKING = "/srv/HOST-2024/customer-acme.img"
LOOP_MOUNT = "/srv/HOST-2024/customer-acme"
LABEL = 'acme données "prod"'
DATA_MOUNT = "/srv/acme data"
DATA_UUID = "c0ffee00-1234-4abc-8def-00112233aabb"
MD_UUID = "8c5e2f1a-3b4d-4e6f-9a7b-1c2d3e4f5a6b"
#: Lower-cased pieces of every identifier in the fixtures; none may survive in any spelling.
SECRETS = ("customer-acme", "host-2024", "acme", "données", "donn\\u00e9es", "alice", "files01",
           "5d0c8e1a", "1b2c3d4e", "c0ffee00", "8c5e2f1a", "4e5f6a7b", "e3b1a2c4", "7a6b5c4d",
           "9f8e7d6c", "a1b2-c3d4")
#: What names nothing: standard mountpoints, tools' default labels, the nil UUID, a GPT type GUID.
KEPT = ('"mountpoint": "/"', '"mountpoint": "/boot/efi"', '"mountpoint": "/var"', '"cloudimg-rootfs"',
        '"UEFI"', '"label": "Ω"', "00000000-0000-0000-0000-000000000000",
        '"parttype": "0fc63daf-8483-4772-8e79-3d69d8e47de4"', '"parttypename": "Linux filesystem"')


def fixture_bundle() -> Bundle:
    b = Bundle(info=BundleInfo(collector="stortune-agent 0.1.0", created=NOW, host="vm"))
    topo = Topology(hostname="vm", devices=[
        Device(name="loop4", kind=DeviceKind.LOOP, id=f"loop:{BACKING}",
               mounts=[Mount(mountpoint=LOOP_MOUNT, fstype="ext4", source="/dev/loop4", options=["rw"])]),
        Device(name="vdb1", kind=DeviceKind.PARTITION, id="name:vdb1",
               mounts=[Mount(mountpoint=DATA_MOUNT, fstype="xfs", source="/dev/vdb1", options=["rw"])]),
    ])
    b.add("topology.json", topo.model_dump_json(indent=2), source="generated", origin="discovery")
    for name, path in [("lsblk.json", "commands/lsblk-columns.json"), ("lsblk-O.json", "commands/lsblk.json"),
                       ("blkid.txt", "commands/blkid.txt"), ("dmesg.txt", "kernel/storage-messages.txt"),
                       ("mountinfo", "proc/self/mountinfo"),
                       ("mdadm-detail-md0.txt", "commands/mdadm-detail/md0.txt")]:
        b.add(path, (FIXTURES / name).read_text(), source="command", origin=name)
    # the control plane writes JSON with non-ASCII escaped: another spelling of the same names
    notes = {"mountpoint": DATA_MOUNT, "note": f"label {LABEL} is full"}
    b.add("control-plane/notes.json", json.dumps(notes), source="control-plane", origin="notes")
    return b


def texts(bundle: Bundle) -> dict[str, str]:
    return {path: data.decode() for path, data in bundle.files.items()}


def test_hostile_a_value_holding_a_token_shaped_part_is_masked() -> None:
    """A backing file, a mountpoint and a label with HOST-2024 in them were left whole in clear:
    a value with any token-shaped part counted as redacted already."""
    r = Redactor()
    assert r.add("path", BACKING) == "PATH-0001"
    assert r.add("mountpoint", LOOP_MOUNT) == "MNT-0001"
    assert r.add("label", "HOST-2024 acme") == "LABEL-0001"  # starts with the token's shape
    assert r.add("serial", "SERIAL-0001X") == "SERIAL-0001"
    line = (f'{{"name": "loop4", "label": "HOST-2024 acme", "back-file": "{BACKING}"}}\n'
            f"xfs filesystem being mounted at {LOOP_MOUNT} supports timestamps; SN SERIAL-0001X\n")
    out = r.redact_text(line)
    assert out == ('{"name": "loop4", "label": "LABEL-0001", "back-file": "PATH-0001"}\n'
                   "xfs filesystem being mounted at /MNT-0001 supports timestamps; SN SERIAL-0001\n")
    # unseeded, the keys find them too
    assert Redactor().redact_text(f'"back-file": "{BACKING}", "label": "HOST-2024 acme"') == (
        '"back-file": "PATH-0001", "label": "LABEL-0001"')


def test_hostile_a_whole_token_is_left_and_a_known_word_does_not_eat_one() -> None:
    """What makes redacting twice change nothing: a value that *is* a token is not masked again,
    and a known value shorter than a token it starts (host "boot" and BOOT-0001) leaves it whole."""
    r = Redactor()
    assert r.add("label", "LABEL-0001") is None and r.add("mountpoint", "/MNT-0001") is None
    assert r.add("hostname", "boot") == "HOST-0001" and r.add("hostname", "label") == "HOST-0002"
    boot_id = "5f1c2a9e-7b3d-4e8f-a1c2-9d8e7f6a5b4c"
    assert r.add("label", "acme-data") == "LABEL-0001"
    out = r.redact_text(f'boot {boot_id} "bootId": "{boot_id}" label acme-data')
    assert out == 'HOST-0001 BOOT-0001 "bootId": "BOOT-0001" HOST-0002 LABEL-0001'
    assert r.redact_text(out) == out and Redactor().redact_text(out) == out


def test_hostile_every_filesystem_identifier_is_masked_in_every_spelling() -> None:
    """Upper- and lower-case UUIDs, mdadm's 8:8:8:8, a label with spaces, quotes and non-ASCII
    as JSON, blkid, udev's by-label link inside mountinfo's escapes and ASCII-escaped JSON print it."""
    bundle = fixture_bundle()
    clear = "\n".join(texts(bundle).values()).lower()
    assert all(secret in clear for secret in SECRETS), [s for s in SECRETS if s not in clear]
    red, mapping = redact(bundle)
    for path, body in texts(red).items():
        low = f"{path}\n{body}".lower()
        assert [s for s in SECRETS if s in low] == [], path
    assert set(mapping.values) >= {"uuid", "partuuid", "label", "mountpoint", "path"}
    assert red.info.redaction is not None
    assert {"uuid", "partuuid", "label", "mountpoint"} <= set(red.info.redaction.masked)


def test_standard_mountpoints_default_labels_and_the_nil_uuid_stay() -> None:
    red, mapping = redact(fixture_bundle())
    everything = "\n".join(texts(red).values())
    assert [k for k in KEPT if k not in everything] == []
    assert "27 1 252:1 / / rw" in texts(red)["proc/self/mountinfo"]
    assert "/dev/disk/by-label/UEFI" in texts(red)["proc/self/mountinfo"]
    originals = {v for kind in mapping.values.values() for v in kind.values()}
    assert not originals & {"/", "/boot/efi", "/var", "UEFI", "cloudimg-rootfs", "Ω"}


def token_of(mapping: RedactionMapping, kind: Kind, original: str) -> str:
    (token,) = [t for t, v in mapping.values[kind].items() if v.lower() == original.lower()]
    return token


def test_one_value_is_one_token_in_every_file() -> None:
    red, mapping = redact(fixture_bundle())
    text = texts(red)
    fs = token_of(mapping, "uuid", DATA_UUID)
    for path in ("commands/lsblk.json", "commands/lsblk-columns.json", "commands/blkid.txt",
                 "kernel/storage-messages.txt"):
        assert fs in text[path], path
    assert f"/dev/disk/by-uuid/{fs} " in text["proc/self/mountinfo"]
    assert "Mounting V5 Filesystem " + fs in text["kernel/storage-messages.txt"]  # written in upper case
    md = token_of(mapping, "uuid", MD_UUID)  # lsblk's dashes, mdadm's colons: one array
    assert f'"uuid": "{md}"' in text["commands/lsblk-columns.json"]
    assert f"UUID : {md}" in text["commands/mdadm-detail/md0.txt"]
    label = token_of(mapping, "label", LABEL)
    assert f'"label": "{label}"' in text["commands/lsblk.json"]
    assert f'LABEL="{label}"' in text["commands/blkid.txt"]
    assert f"/dev/disk/by-label/{label} " in text["proc/self/mountinfo"]
    assert f"label {label} is full" in text["control-plane/notes.json"]
    mount = token_of(mapping, "mountpoint", DATA_MOUNT)
    assert f" / /{mount} rw" in text["proc/self/mountinfo"]
    assert f"mounted at /{mount} supports" in text["kernel/storage-messages.txt"]
    assert f'"mountpoint": "/{mount}"' in text["commands/lsblk.json"]
    assert f'"mountpoint": "/{mount}"' in text["control-plane/notes.json"]
    # the topology still validates: a masked mountpoint is still an absolute path
    topo = Topology.model_validate_json(text["topology.json"])
    assert [m.mountpoint for d in topo.devices for m in d.mounts] == [
        f"/{token_of(mapping, 'mountpoint', LOOP_MOUNT)}", f"/{mount}"]
    assert topo.devices[0].id == f"loop:{token_of(mapping, 'path', BACKING)}"


def test_redacting_twice_changes_nothing() -> None:
    red, mapping = redact(fixture_bundle())
    again, fresh = redact(red)
    assert again.files == red.files, [p for p in red.files if again.files[p] != red.files[p]]
    assert fresh.values == {}
    reused, same = redact(red, mapping=mapping)
    assert reused.files == red.files and same == mapping
    assert all(mapping.original(t) is not None for body in texts(red).values() for t in TOKEN.findall(body))


@pytest.mark.parametrize(("kind", "value"), [
    ("uuid", "mpath-3600a0b800029ab4c00001a2b5f3c4d5e"),  # a dm uuid under "uuid": the WWN's business
    ("uuid", "LVM-abc"), ("uuid", "00000000-0000-0000-0000-000000000000"), ("uuid", "0000-0000"),
    ("partuuid", "not-a-uuid"), ("label", "ab"), ("label", "EFI System Partition"),
    ("mountpoint", "/boot/efi/"), ("mountpoint", "/proc/sys/fs/binfmt_misc"), ("mountpoint", "relative"),
])
def test_what_is_not_an_identifier_of_its_kind_is_not_masked(kind: Kind, value: str) -> None:
    assert Redactor().add(kind, value) is None


def test_hostile_a_host_named_like_a_standard_directory_redacts_to_a_fixed_point() -> None:
    """Host "srv" is masked in /srv (a word is a word): the second redaction must not take the
    /HOST-0001 that leaves for a mountpoint of its own, with the mapping or without."""
    b = Bundle(info=BundleInfo(collector="t", created=NOW, host="srv"))
    b.add("proc/self/mountinfo", "40 27 252:33 / /srv rw,relatime - xfs /dev/vdc1 rw\n"
          "41 27 252:34 / /var/lib rw,relatime - xfs /dev/vdc2 rw\n", source="file", origin="mountinfo")
    red, mapping = redact(b, known=[("hostname", "srv"), ("hostname", "lib")])
    assert texts(red)["proc/self/mountinfo"].splitlines()[0].split()[4] == "/HOST-0001"
    assert texts(red)["proc/self/mountinfo"].splitlines()[1].split()[4] == "/var/HOST-0002"
    assert "mountpoint" not in mapping.values
    assert redact(red)[0].files == red.files
    assert redact(red, mapping=mapping)[0].files == red.files


def test_hostile_a_path_as_long_as_linux_allows_and_mounts_nested_deep_are_masked() -> None:
    """A mountpoint or backing file of 4000 characters made the literal trie recurse once per
    character (RecursionError, a 500); 300 mounts each inside the last nest its groups as deep."""
    long_mount = "/srv/" + "/".join(["customer-acme"] * 285)  # 4 + 285 * 14 characters
    nested = ["/srv" + "/d" * n for n in range(1, 301)]
    lines = [f"{40 + i} 27 0:{50 + i} / {m} rw - tmpfs tmpfs rw" for i, m in enumerate([long_mount, *nested])]
    r = Redactor()
    out = r.redact_text("\n".join(lines) + f"\nback-file: {long_mount}.img\n")
    assert "customer-acme" not in out and "/d/d" not in out
    assert [ln.split()[4] for ln in out.splitlines()[:3]] == ["/MNT-0001", "/MNT-0002", "/MNT-0003"]
    assert out.splitlines()[-1] == "back-file: PATH-0001"
    assert r.redact_text(out) == out
