"""Settings stay applied: re-applied at start (after a reboot) and on hot-plug."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

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
    try:
        time.sleep(1.0)
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
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "device graph changed" in err
