"""Real loop devices for tests (root only), always released, also when a test fails.

Registered for the whole suite from tests/conftest.py.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

# Restored in this order when a loop device is released: the scheduler first,
# because switching it resets nr_requests; read_ahead_kb last, because since
# Linux 6.11 any queue-limits update (max_sectors_kb, add_random, iostats) raises
# read-ahead to at least twice max_sectors_kb. The kernel keeps a loop queue's
# settings across losetup -d, so a wrong order leaks into the next test.
_LOOP_QUEUE_ATTRS = (
    "scheduler",
    "nr_requests",
    "max_sectors_kb",
    "rq_affinity",
    "nomerges",
    "add_random",
    "iostats",
    "wbt_lat_usec",
    "read_ahead_kb",
)


@dataclass
class _Loop:
    name: str
    image: Path
    saved: dict[str, str]


def _queue(name: str, attr: str) -> Path:
    return Path("/sys/block") / name / "queue" / attr


def _snapshot(name: str) -> dict[str, str]:
    saved: dict[str, str] = {}
    for attr in _LOOP_QUEUE_ATTRS:
        try:
            raw = _queue(name, attr).read_text().strip()
        except OSError:
            continue
        if attr == "scheduler":
            raw = next((w.strip("[]") for w in raw.split() if w.startswith("[")), raw)
        saved[attr] = raw
    return saved


def _ours(loop: _Loop) -> bool:
    """Is /dev/<name> still attached to our image? Never touch a device that is not."""
    try:
        backing = (Path("/sys/block") / loop.name / "loop" / "backing_file").read_text().strip()
    except OSError:
        return False
    return os.path.realpath(backing) == os.path.realpath(loop.image)


def _release(loop: _Loop) -> str | None:
    if _ours(loop):
        # The queue outlives the attachment (the scheduler survives losetup -d),
        # so put back what the test may have changed before handing it back.
        for attr, raw in loop.saved.items():
            with contextlib.suppress(OSError):
                _queue(loop.name, attr).write_text(raw)
        for attempt in range(5):
            proc = subprocess.run(
                ["losetup", "-d", f"/dev/{loop.name}"],
                check=False,
                capture_output=True,
                text=True,
                timeout=30,
            )
            if proc.returncode == 0 or not _ours(loop):
                break
            time.sleep(0.2 * (attempt + 1))  # udev may hold it open for a moment
        else:
            return f"could not detach /dev/{loop.name}: {proc.stderr.strip()}"
    loop.image.unlink(missing_ok=True)
    return None


@pytest.fixture
def loop_devices(tmp_path: Path) -> Iterator[Callable[[int], list[str]]]:
    """A factory: ``loop_devices(n)`` attaches n fresh loop devices and returns their names.

    Each is backed by a sparse 64 MiB file in tmp_path, and is detached (with
    its queue settings put back) when the test ends, whatever its outcome.
    """
    if os.geteuid() != 0:
        pytest.skip("loop devices need root")
    if shutil.which("losetup") is None:
        pytest.skip("losetup is not installed (Debian package util-linux)")
    if not Path("/dev/loop-control").exists():
        pytest.skip("/dev/loop-control is missing: the loop module is not loaded")
    created: list[_Loop] = []
    backing = tmp_path / "loop-images"
    backing.mkdir()

    def make(n: int = 1) -> list[str]:
        names: list[str] = []
        for _ in range(n):
            image = backing / f"image{len(created)}.img"
            with open(image, "wb") as fh:
                fh.truncate(64 << 20)
            proc = subprocess.run(
                ["losetup", "--find", "--show", str(image)],
                check=False,
                capture_output=True,
                text=True,
                timeout=30,
            )
            if proc.returncode != 0:
                image.unlink()
                pytest.fail(f"losetup --find --show failed: {proc.stderr.strip()}")
            name = Path(proc.stdout.strip()).name
            created.append(_Loop(name, image, _snapshot(name)))
            names.append(name)
        return names

    try:
        yield make
    finally:
        problems = [p for loop in reversed(created) if (p := _release(loop))]
        if problems:
            pytest.fail("; ".join(problems))


@pytest.fixture
def loop_device(loop_devices: Callable[[int], list[str]]) -> str:
    return loop_devices(1)[0]
