"""Bundle packing: the manifest describes every file, and an archive that does not match it is refused."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from datetime import UTC, datetime

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from stortune.schemas.bundle import (
    MANIFEST,
    Bundle,
    BundleError,
    BundleInfo,
    check_path,
    pack,
    unpack,
    verify,
)

NOW = datetime(2024, 5, 14, 9, 30, 5, tzinfo=UTC)


def sample() -> Bundle:
    bundle = Bundle(info=BundleInfo(collector="stortune-agent 0.1.0", created=NOW, host="db01"))
    bundle.add("topology.json", '{"hostname": "db01"}\n', source="generated", origin="discovery")
    bundle.add("proc/mdstat", "Personalities : [raid1]\n", source="file", origin="/proc/mdstat")
    bundle.add("commands/lsblk.json", b'{"blockdevices": []}\n', source="command",
               origin="lsblk -J -O", argv=["/usr/bin/lsblk", "-J", "-O"], exit_code=0,
               duration_seconds=0.012)
    bundle.put("commands/raw.bin", bytes(range(256)))
    bundle.fail("smartctl -j -a /dev/sda", "exit status 2")
    return bundle


def members(data: bytes) -> dict[str, bytes]:
    out = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for m in tar:
            if m.isfile():
                f = tar.extractfile(m)
                assert f is not None
                out[m.name] = f.read()
    return out


def repack(files: dict[str, bytes], *, extra: list[tarfile.TarInfo] | None = None) -> bytes:
    """An archive with exactly these members (names as given), for tampering tests."""
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb") as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra or []:
            tar.addfile(info)
    return raw.getvalue()


def test_manifest_lists_every_file_with_its_sha256() -> None:
    bundle = sample()
    files = members(pack(bundle))
    root = "stortune-diag-db01-20240514T093005Z"
    assert set(files) == {f"{root}/{MANIFEST}", *(f"{root}/{p}" for p in bundle.files)}
    manifest = json.loads(files[f"{root}/{MANIFEST}"])
    listed = {e["path"]: e for e in manifest["files"]}
    assert set(listed) == set(bundle.files)
    for path, data in bundle.files.items():
        assert files[f"{root}/{path}"] == data
        assert listed[path] == {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert manifest["format"] == "stortune-diagnostics/1"
    assert manifest["host"] == "db01" and manifest["created"] == "2024-05-14T09:30:05Z"
    assert [c["path"] for c in manifest["collected"]] == ["topology.json", "proc/mdstat",
                                                          "commands/lsblk.json"]
    assert manifest["collected"][2]["argv"] == ["/usr/bin/lsblk", "-J", "-O"]
    assert manifest["failed"] == [{"what": "smartctl -j -a /dev/sda", "reason": "exit status 2",
                                   "path": None}]
    assert manifest["redaction"] is None


def test_round_trip_and_byte_identical_repack() -> None:
    bundle = sample()
    data = pack(bundle)
    assert verify(data) == []
    back = unpack(data)
    assert back.files == bundle.files
    assert back.info == bundle.info
    assert pack(back) == data
    assert pack(sample()) == data  # no timestamps or names of the packing moment leak in


def test_a_path_cannot_be_a_file_and_a_directory() -> None:
    bundle = sample()
    with pytest.raises(ValueError, match="clashes with 'proc/mdstat'"):
        bundle.put("proc/mdstat/x", b"")
    with pytest.raises(ValueError, match=r"clashes with 'commands/lsblk\.json'"):
        bundle.put("commands", b"")


def test_adding_a_file_again_replaces_it_and_its_record() -> None:
    bundle = sample()
    bundle.add("proc/mdstat", "other\n", source="control-plane", origin="server")
    assert bundle.files["proc/mdstat"] == b"other\n"
    assert [c.source for c in bundle.info.collected if c.path == "proc/mdstat"] == ["control-plane"]


@pytest.mark.parametrize("path", ["/etc/passwd", "../x", "a/../b", "a//b", "a/", "", ".", "a/./b",
                                  "a\\b", "a\x00b", "a\nb", MANIFEST])
def test_unsafe_paths_are_refused(path: str) -> None:
    with pytest.raises(ValueError, match=r"bundle path|manifest"):
        check_path(path)
    with pytest.raises(ValueError):
        sample().put(path, b"x")


def tampered() -> tuple[str, dict[str, bytes]]:
    files = members(pack(sample()))
    root = next(iter(files)).split("/")[0]
    return root, files


def test_a_changed_file_fails_verification() -> None:
    root, files = tampered()
    files[f"{root}/proc/mdstat"] = b"Personalities : [raid5]\n"
    data = repack(files)
    assert verify(data) == ["proc/mdstat: size or sha256 differs from the manifest"]
    with pytest.raises(BundleError, match="proc/mdstat"):
        unpack(data)


def test_missing_and_extra_files_fail_verification() -> None:
    root, files = tampered()
    del files[f"{root}/topology.json"]
    files[f"{root}/extra.txt"] = b"x"
    assert verify(repack(files)) == [
        "topology.json: listed in the manifest but not in the archive",
        "extra.txt: in the archive but not in the manifest",
    ]


def test_manifest_missing_or_invalid() -> None:
    root, files = tampered()
    assert verify(repack({k: v for k, v in files.items() if not k.endswith(MANIFEST)})) == [
        "manifest.json is missing"]
    files[f"{root}/{MANIFEST}"] = b'{"format": "something-else/9"}'
    problems = verify(repack(files))
    assert len(problems) == 1 and problems[0].startswith("manifest.json is invalid")


def test_links_traversal_and_second_roots_are_refused() -> None:
    root, files = tampered()
    link = tarfile.TarInfo(f"{root}/proc/evil")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/shadow"
    data = repack({**files, "other/x": b"x", f"{root}/../y": b"y"}, extra=[link])
    problems = verify(data)
    assert f"other/x: outside the bundle's one top directory {root!r}" in problems
    assert any("'../y'" in p for p in problems)
    assert f"{root}/proc/evil: not a regular file (links and devices are refused)" in problems
    with pytest.raises(BundleError):
        unpack(data)


def test_not_an_archive_and_size_limit() -> None:
    assert verify(b"definitely not gzip")[0].startswith("not a readable tar.gz archive")
    data = pack(sample())
    assert verify(data, max_bytes=100)[-1] == "more than 100 bytes unpacked; refused"


_segment = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789._-", min_size=1, max_size=12).filter(
    lambda s: s not in (".", ".."))
_paths = st.lists(_segment, min_size=1, max_size=4).map("/".join).filter(lambda p: p != MANIFEST)


@settings(max_examples=60, deadline=None)
@given(files=st.dictionaries(_paths, st.binary(max_size=300), max_size=8),
       host=st.text(min_size=1, max_size=20))
def test_pack_unpack_round_trips(files: dict[str, bytes], host: str) -> None:
    # a file and a directory of the same name cannot both exist in an archive
    assume(not any(b.startswith(f"{a}/") for a in files for b in files))
    bundle = Bundle(info=BundleInfo(collector="t", created=NOW, host=host))
    for path, data in files.items():
        bundle.put(path, data)
    data = pack(bundle)
    assert verify(data) == []
    back = unpack(data)
    assert back.files == files and back.info == bundle.info
    assert pack(back) == data
