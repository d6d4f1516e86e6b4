"""Settings stay applied: re-applied at start (after a reboot) and on hot-plug."""

from __future__ import annotations

import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fixtures.sysfs_builder import SysfsBuilder

PROFILE = """
apiVersion: stortune/v1
kind: StorageProfile
metadata: {name: loops}
spec:
  rules:
    - name: all-loops
      match: {kind: [loop]}
      settings: {read_ahead_kb: 4096, nr_requests: 64}
"""


def agent(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stortune.agent.cli", *args], capture_output=True,
                          text=True, timeout=60, check=False)


def queue_value(b: SysfsBuilder, dev: str, attr: str) -> str:
    return (b.sys / "class/block" / dev / "queue" / attr).read_text().strip()


def build(tmp_path: Path) -> tuple[SysfsBuilder, list[str]]:
    b = SysfsBuilder(tmp_path / "host")
    b.loop(0, size=1 << 21, backing_file="/srv/images/a.img")
    b.finish()
    roots = ["--sysfs", str(b.sys), "--procfs", str(b.proc)]
    return b, roots


def test_start_reapplies_the_last_desired_state(tmp_path: Path) -> None:
    b, roots = build(tmp_path)
    doc, state = tmp_path / "p.yaml", str(tmp_path / "state")
    doc.write_text(PROFILE)
    assert agent("apply", "-f", str(doc), "--state-dir", state, *roots).returncode == 0
    assert queue_value(b, "loop0", "read_ahead_kb") == "4096"
    # A reboot puts the kernel defaults back.
    b.write("devices/virtual/block/loop0/queue/read_ahead_kb", "128", 0o644)
    b.write("devices/virtual/block/loop0/queue/nr_requests", "128", 0o644)
    result = agent("serve", "--once", "--state-dir", state, *roots)
    assert result.returncode == 0, result.stderr
    assert queue_value(b, "loop0", "read_ahead_kb") == "4096"
    assert queue_value(b, "loop0", "nr_requests") == "64"
    assert "re-applied 2 setting(s)" in result.stderr


def test_hot_plugged_device_gets_its_settings(tmp_path: Path) -> None:
    b, roots = build(tmp_path)
    doc, state = tmp_path / "p.yaml", str(tmp_path / "state")
    doc.write_text(PROFILE)
    assert agent("apply", "-f", str(doc), "--state-dir", state, *roots).returncode == 0
    proc = subprocess.Popen([sys.executable, "-m", "stortune.agent.cli", "serve", "--state-dir",
                             state, "--rescan-interval", "0.2", *roots],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen: list[str] = []
    try:
        # Plugged in once the daemon watches (its first look at the devices is done), not after a
        # guessed delay: a slow start would find loop1 already there and never see it arrive.
        assert proc.stderr is not None
        for line in proc.stderr:
            seen.append(line)
            if "watching for device changes" in line:
                break
        b.loop(1, size=1 << 21, backing_file="/srv/images/b.img")  # plugged in
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if queue_value(b, "loop1", "read_ahead_kb") == "4096":
                break
            time.sleep(0.1)
        assert queue_value(b, "loop1", "read_ahead_kb") == "4096"
        assert queue_value(b, "loop1", "nr_requests") == "64"
    finally:
        proc.terminate()
        _, rest = proc.communicate(timeout=20)
    err = "".join(seen) + rest
    assert proc.returncode == 0, err
    assert "device graph changed" in err


# -- uevents ----------------------------------------------------------------------------------
def test_block_uevents_are_told_from_others_in_both_formats() -> None:
    from stortune.agent.daemon import is_block_event

    kernel = b"change@/devices/virtual/block/loop3\0ACTION=change\0DEVPATH=/devices/virtual/block/loop3\0" \
             b"SUBSYSTEM=block\0MAJOR=7\0MINOR=3\0DEVNAME=loop3\0DEVTYPE=disk\0SEQNUM=1012\0"
    # udevd's re-broadcast: "libudev" magic and a binary header, then the properties
    header = b"libudev\0" + struct.pack(">I", 0xFEEDCAFE) + struct.pack("<7I", 40, 40, 60, 0, 0, 0, 0)
    udev = header + b"ACTION=add\0DEVPATH=/devices/pci0000:00/host2/block/sdc\0SUBSYSTEM=block\0" \
                    b"DEVNAME=/dev/sdc\0ID_MODEL=PERC_H730\0"
    net = b"add@/devices/virtual/net/veth0\0ACTION=add\0SUBSYSTEM=net\0INTERFACE=veth0\0"
    lookalike = b"add@/devices/x\0ACTION=add\0SUBSYSTEM=block_extra\0ID_NOTE=SUBSYSTEM=blocked\0"
    assert is_block_event(kernel) and is_block_event(udev)
    assert not is_block_event(net) and not is_block_event(lookalike)


@pytest.mark.root
def test_a_loop_device_attached_wakes_the_uevent_waiter(loop_devices: Callable[[int], list[str]]) -> None:
    """The kernel's own event for a device this test attaches (udevd does not run here)."""
    from stortune.agent.daemon import KERNEL_EVENTS, UeventWaiter

    stop = threading.Event()
    try:
        waiter = UeventWaiter(stop, KERNEL_EVENTS)
    except OSError as exc:
        pytest.skip(f"no uevent socket here: {exc}")
    try:
        # The timeout answers False once the events of devices released just before (by the test
        # that ran before this one) have been read.
        for _ in range(50):
            if waiter.wait(0.2) is False:
                break
        else:
            pytest.fail("block device events never stopped arriving")
        loop_devices(1)
        assert waiter.wait(10) is True
        assert waiter.wait(0.5) is False  # the burst was drained: one rescan for it
    finally:
        waiter.close()
