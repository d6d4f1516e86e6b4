"""The raw-device signature check asks libblkid (util-linux's wipefs) what a device holds, and
refuses a destructive run when it finds something or cannot tell.

Real loop devices (root): labels this test writes itself in the layouts libblkid's probes look
for (Ceph BlueStore's header at byte 0; ZFS uberblocks in the first vdev label), which the
hand-written magic table this replaced did not know. A clean device passes. Then wipefs itself,
replaced on the tool path by scripts that misbehave, to show the check fails closed.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import struct
from pathlib import Path

import pytest
import yaml

from stortune.agent import discovery
from stortune.agent.bench.errors import UnsafeTargetError
from stortune.agent.bench.signatures import PROBE_MAX_OUTPUT, ProbeError, Signature, parse_listing, probe
from stortune.agent.bench.targets import check_safety, resolve
from stortune.agent.kernelfs import KernelFS
from stortune.agent.tools import ToolRunner
from stortune.schemas.bench.spec import BenchmarkSpec, parse_benchmark
from tests.fixtures.sysfs_builder import SysfsBuilder

HOST = KernelFS.at()
root_only = pytest.mark.root


def spec(device: str) -> BenchmarkSpec:
    return parse_benchmark(yaml.safe_load(yaml.safe_dump({
        "apiVersion": "stortune/v1", "kind": "BenchmarkSpec", "metadata": {"name": "sig"},
        "spec": {"target": {"device": {"kind": ["loop"], "name": [device]}}, "allowDestructive": True,
                 "workloads": [{"preset": "seq-1m", "runtime": "1s"}]},
    })))


def refusals(fs: KernelFS, device: str, tools: ToolRunner | None = None) -> list[str]:
    """Every reason a destructive seq-1m on ``device`` is refused ([] when it may run)."""
    s = spec(device)
    resolved = resolve(fs, s, discovery.discover(fs))
    try:
        if tools is None:
            check_safety(resolved, s.steps(resolved.info.facts), s.spec.allowDestructive)
        else:
            check_safety(resolved, s.steps(resolved.info.facts), s.spec.allowDestructive, tools=tools)
    except UnsafeTargetError as err:
        return err.reasons
    return []


# -- labels, written from the on-disk formats -----------------------------------------------------
def write_bluestore_label(node: Path) -> None:
    """A Ceph BlueStore OSD's block device starts with the text "bluestore block device", a
    newline, the OSD's uuid and a newline, followed by the encoded label."""
    fd = os.open(node, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.pwrite(fd, b"bluestore block device\n9d1c6a52-2f0e-4c7b-8a43-5e6f7a8b9c0d\n", 0)
        os.fsync(fd)
    finally:
        os.close(fd)


def write_zfs_label(node: Path) -> None:
    """A ZFS vdev keeps four 256 KiB labels (two at the start, two at the end); the second half
    of each holds 1 KiB uberblocks starting with the magic 0x00bab10c. libblkid wants four of
    them before it calls a device a zfs_member: here, the first four slots of label L0."""
    fd = os.open(node, os.O_WRONLY | os.O_CLOEXEC)
    try:
        for slot in range(4):
            magic_version_txg = struct.pack("<QQQ", 0x00BAB10C, 5000, 100 + slot)
            os.pwrite(fd, magic_version_txg, 128 * 1024 + slot * 1024)
        os.fsync(fd)
    finally:
        os.close(fd)


@root_only
def test_a_ceph_bluestore_label_on_a_loop_device_is_found_and_the_write_refused(loop_device: str) -> None:
    write_bluestore_label(Path("/dev") / loop_device)
    assert refusals(HOST, loop_device) == [
        f"{loop_device} holds ceph_bluestore (other), signature at byte 0"]


@root_only
def test_a_zfs_label_on_a_loop_device_is_found_and_the_write_refused(loop_device: str) -> None:
    write_zfs_label(Path("/dev") / loop_device)
    (reason,) = refusals(HOST, loop_device)
    # libblkid names the last uberblock it counted; its usage class varies between releases
    assert reason.startswith(f"{loop_device} holds zfs_member (")
    assert reason.endswith(f"signature at byte {128 * 1024 + 3 * 1024}")


@root_only
def test_a_clean_loop_device_may_be_written(loop_device: str) -> None:
    assert refusals(HOST, loop_device) == []


# -- the probe fails closed -------------------------------------------------------------------------
@pytest.fixture
def fixture_host(tmp_path: Path) -> KernelFS:
    """loop5 on a fixture sysfs; its node is a 64 MiB sparse file in the fixture's /dev."""
    b = SysfsBuilder(tmp_path / "host")
    _, loop = b.loop(5, size=131072, backing_file="/var/tmp/sig.img")
    b.write(f"{loop}/ro", "0")
    fs = b.finish()
    fs.dev.mkdir()
    with open(fs.device_node("loop5"), "wb") as fh:
        fh.truncate(64 << 20)
    return fs


def fake_wipefs(where: Path, script: str) -> ToolRunner:
    """A tool path whose only wipefs is ``script`` (sh)."""
    where.mkdir(exist_ok=True)
    exe = where / "wipefs"
    exe.write_text("#!/bin/sh\n" + script + "\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return ToolRunner([where], timeout=2.0, max_output=PROBE_MAX_OUTPUT)


def only_probe_reason(fs: KernelFS, tools: ToolRunner) -> str:
    (reason,) = refusals(fs, "loop5", tools)
    assert reason.startswith("cannot tell what loop5 holds, so it is not written: "), reason
    return reason.split(": ", 1)[1]


def test_hostile_probe_missing_tool_refuses(fixture_host: KernelFS, tmp_path: Path) -> None:
    empty = tmp_path / "no-tools"
    empty.mkdir()
    reason = only_probe_reason(fixture_host, ToolRunner([empty]))
    assert reason == "wipefs (util-linux) is not installed on the agent's tool path; install" \
                     " util-linux, or give serve --tool-path"


def test_hostile_probe_hanging_tool_is_killed_and_refuses(fixture_host: KernelFS, tmp_path: Path) -> None:
    tools = fake_wipefs(tmp_path / "t", "exec sleep 600")
    assert only_probe_reason(fixture_host, tools) == "wipefs did not answer within 2 s"


@pytest.mark.parametrize(("script", "reason"), [
    ("echo 'wipefs: error: /dev/x: probing initialization failed: Device or resource busy' >&2; exit 1",
     "wipefs failed with exit status 1: wipefs: error: /dev/x: probing initialization failed: Device..."),
    ("exit 2", "wipefs failed with exit status 2"),
    ("kill -9 $$", "wipefs failed with exit status -9"),
    ("printf 'TYPE=ext4\\n'", "wipefs printed something other than its JSON listing: 'TYPE=ext4'"),
    ("printf ''", "wipefs printed something other than its JSON listing: ''"),
    ("printf '\\377\\376garbage'", "wipefs printed something other than its JSON listing: '??garbage'"),
    ("printf '[]'", "wipefs's listing has no list of signatures"),
    ("printf '{\"signatures\": {}}'", "wipefs's listing has no list of signatures"),
    ("printf '{\"signatures\": [{\"offset\": \"0x438\"}]}'",
     "wipefs's listing: signature 0 has no type or offset"),
    ("printf '{\"signatures\": [{\"type\": \"ext4\", \"offset\": \"-0x1\"}]}'",
     "wipefs's listing: signature 0 has no type or offset"),
    ("printf '{\"signatures\": [{\"type\": \"ext4\", \"offset\": true}]}'",
     "wipefs's listing: signature 0 has no type or offset"),
    ("head -c 3000000 /dev/zero",
     f"wipefs printed more than {PROBE_MAX_OUTPUT} bytes, which is not its listing"),
])
def test_hostile_probe_output_or_exit_status_refuses(fixture_host: KernelFS, tmp_path: Path,
                                                     script: str, reason: str) -> None:
    assert only_probe_reason(fixture_host, fake_wipefs(tmp_path / "t", script)) == reason


def test_hostile_probe_deeply_nested_json_refuses_without_a_recursion_error() -> None:
    with pytest.raises(ProbeError, match="something other than its JSON listing"):
        parse_listing(b"[" * 500_000 + b"]" * 500_000)


def test_hostile_probe_names_are_cleaned_and_a_crowd_is_counted(fixture_host: KernelFS,
                                                                 tmp_path: Path) -> None:
    items = [{"type": "x\x1b[31mred\u202e" * 9, "offset": "0x0", "usage": "filesystem\n"}]
    items += [{"type": f"raid{i}", "offset": str(4096 * i), "usage": "raid"} for i in range(1, 2000)]
    listing = tmp_path / "listing.json"
    listing.write_text(json.dumps({"signatures": items}))
    reasons = refusals(fixture_host, "loop5", fake_wipefs(tmp_path / "t", f"cat '{listing}'"))
    assert reasons[0] == ("loop5 holds x??31mred?x??31mred?x??31mred?x??31mred?x??31mred?x??31mred?... "
                          "(filesystem), signature at byte 0")
    assert reasons[1:8] == [f"loop5 holds raid{i} (raid), signature at byte {4096 * i}" for i in range(1, 8)]
    assert reasons[8:] == ["loop5 holds 1992 more signature(s)"]


def test_the_listing_wipefs_prints_is_read_in_offset_order() -> None:
    out = (b'{\n   "signatures": [\n      {"type": "PMBR", "offset": "0x1fe", "usage": "partition table"},\n'
           b'      {"type": "gpt", "offset": "0x200", "usage": "partition table"},\n'
           b'      {"type": "gpt", "offset": "0x3fffe00", "usage": "partition table"},\n'
           b'      {"type": "ext4", "offset": "0x438", "usage": null}\n   ]\n}\n')
    assert parse_listing(out) == [Signature("PMBR", "partition table", 510),
                                  Signature("gpt", "partition table", 512),
                                  Signature("ext4", "", 1080),
                                  Signature("gpt", "partition table", 0x3fffe00)]
    assert parse_listing(b'{"signatures": []}') == []


@pytest.mark.skipif(shutil.which("wipefs") is None, reason="wipefs is not installed (util-linux)")
def test_the_real_probe_reads_a_plain_image_file(tmp_path: Path) -> None:
    image = tmp_path / "osd.img"
    with open(image, "wb") as fh:
        fh.truncate(8 << 20)
    assert probe(image, ToolRunner()) == []
    write_bluestore_label(image)
    assert probe(image, ToolRunner()) == [Signature("ceph_bluestore", "other", 0)]
