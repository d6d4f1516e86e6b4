"""What names a filesystem leaves no trace in a redacted bundle: on a fixture host, and on this
machine with a real filesystem mounted at a customer's path (issue 26, point 7)."""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stortune.agent.diagnostics import ToolRunner, collect
from stortune.agent.kernelfs import KernelFS
from stortune.agent.local import host_info
from stortune.schemas.bundle import pack
from stortune.schemas.redact import redact
from tests.agent.test_diagnostics import NOW, archive, fixture_bundle

LABEL = "acme données"  # 13 bytes: an ext4 label holds 16


def everything(files: dict[str, bytes]) -> str:
    """Every member's name and text, lower case."""
    return "\n".join(f"{name}\n{body.decode('utf-8', 'replace')}" for name, body in files.items()).lower()


def test_hostile_a_mountpoint_and_its_label_leave_no_trace_in_names_or_contents(tmp_path: Path) -> None:
    """The streamer's xfs on /srv/video, labelled "video": its xfs_info output was srv_video.txt."""
    _, _, bundle = fixture_bundle("perc_streamer", tmp_path)
    assert "video" in everything(archive(pack(bundle)))
    redacted, mapping = redact(bundle)
    assert "video" not in everything(archive(pack(redacted)))
    assert set(mapping.values["mountpoint"].values()) == {"/srv/video", "/mnt/media"}  # and the NFS mount
    assert set(mapping.values["label"].values()) == {"video"}


def _root_uuid(tools: ToolRunner) -> str | None:
    """The root filesystem's UUID: lsblk's, else the kernel's message when it mounted it."""
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    source = [ln.split(" - ", 1)[1].split()[1] for ln in lines if ln.split()[4] == "/"][-1]
    if tools.which("lsblk") and source.startswith("/dev/"):
        found = subprocess.run(["lsblk", "-dno", "UUID", source], capture_output=True, text=True,
                               check=False, timeout=30).stdout.strip()
        if found:
            return found
    dmesg = subprocess.run(["dmesg"], capture_output=True, text=True, check=False, timeout=30).stdout
    name = re.escape(source.removeprefix("/dev/"))
    mounted = re.findall(rf"\({name}\): mounted filesystem ([0-9a-fA-F-]{{36}})", dmesg)
    return mounted[-1] if mounted else None


@contextlib.contextmanager
def _mounted(device: str, where: Path) -> Iterator[None]:
    where.mkdir()
    if subprocess.run(["mount", device, str(where)], capture_output=True, check=False, timeout=60).returncode:
        pytest.skip(f"cannot mount {device} here")
    try:
        yield
    finally:
        subprocess.run(["umount", str(where)], check=True, timeout=60)


def test_hostile_a_bundle_from_this_machine_names_no_filesystem_mountpoint_or_host(
        tmp_path: Path, fresh_loops: Callable[[], contextlib.AbstractContextManager[str]]) -> None:
    """A real ext4 (random UUID, a label with a space and non-ASCII) mounted at a path with a
    space in it, then the bundle `stortune-agent diag` makes of this machine: its UUID (in the
    kernel's mount message), mountpoint (mountinfo, topology, lsblk), the root filesystem's UUID
    and the hostname are all masked."""
    if shutil.which("mkfs.ext4") is None or shutil.which("mount") is None:
        pytest.skip("mkfs.ext4 and mount are needed (Debian packages e2fsprogs, mount)")
    fs_uuid = str(uuid.uuid4())
    mountpoint = tmp_path / "customer acme"
    tools = ToolRunner(timeout=30)
    fs = KernelFS.at()
    with fresh_loops() as name:
        subprocess.run(["mkfs.ext4", "-q", "-F", "-U", fs_uuid, "-L", LABEL, f"/dev/{name}"], check=True,
                       timeout=60)
        with _mounted(f"/dev/{name}", mountpoint):
            bundle = collect(fs, tools=tools, now=NOW)
    clear = everything(bundle.files)
    assert str(mountpoint).lower() in clear and "customer\\040acme" in clear  # topology, mountinfo
    if fs_uuid not in clear:
        pytest.skip("the kernel log is not readable here: the new filesystem's UUID was not collected")
    boot_id = host_info(fs).get("boot_id")
    redacted, mapping = redact(bundle, known=[("bootid", boot_id)] if boot_id else [])
    text = everything(archive(pack(redacted)))
    assert fs_uuid not in text and fs_uuid.replace("-", "") not in text
    assert "customer" not in text and "acme" not in text and "donn" not in text
    assert fs_uuid in mapping.values["uuid"].values()
    assert str(mountpoint) in mapping.values["mountpoint"].values()
    root_uuid = _root_uuid(tools)
    if root_uuid is not None and root_uuid.strip("0-"):  # the nil UUID names no filesystem and stays
        assert root_uuid.lower() not in text
    # every filesystem the kernel says it mounted, this host's root included, is masked
    assert re.findall(r"mounted filesystem (?!0{8}-0{4}-0{4}-0{4}-0{12})[0-9a-f]{8}-", text) == []
    host = bundle.info.host
    if host and host != "unknown":
        word = rf"(?<![a-z0-9]){re.escape(host.lower())}(?![a-z0-9])(?!\.[a-z0-9_])"
        assert re.findall(rf".{{0,30}}{word}.{{0,30}}", text) == []
