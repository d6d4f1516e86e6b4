"""Real loop devices for tests (root only), always released, also when a test fails.

Registered for the whole suite from tests/conftest.py. ``loop_devices`` hands out
existing loop devices (``losetup --find``), whose queues keep what earlier users
set; ``fresh_loop`` makes a new one and removes it afterwards, for a test (or
bench/couplings.py) that needs the kernel's defaults, including state no write
can bring back.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import random
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


def queue_attributes(name: str) -> dict[str, str]:
    """Every readable attribute under the device's queue/ (iosched/ included), by relative path;
    list attributes (scheduler) as their current choice."""
    queue = Path("/sys/block") / name / "queue"
    values: dict[str, str] = {}
    for path in sorted(queue.rglob("*")):
        if not path.is_file():
            continue
        try:
            raw = path.read_text()
        except OSError:
            continue  # write-only, or refusing reads on this device
        values[str(path.relative_to(queue))] = next(
            (w.strip("[]") for w in raw.split() if w.startswith("[")), raw.strip())
    return values


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
        # losetup -d of a device still open (a fio just killed, a prober) only marks it to be
        # detached on its last close: wait for that, so the next test starts on a settled graph.
        deadline = time.monotonic() + 10
        while _ours(loop) and time.monotonic() < deadline:
            time.sleep(0.05)
    loop.image.unlink(missing_ok=True)
    return None


# ioctls of /dev/loop-control (linux/loop.h)
_LOOP_CTL_ADD, _LOOP_CTL_REMOVE = 0x4C80, 0x4C81
#: Fresh devices are numbered from here: `losetup --find` takes the lowest free
#: index, so another process is unlikely to grab one before it is attached.
_FRESH_BASE = 512


def _retry_busy(call: Callable[[], object]) -> bool:
    """Run ``call`` until it does not fail with EBUSY (udev may hold the device for a moment)."""
    for attempt in range(10):
        try:
            call()
            return True
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise
            time.sleep(0.05 * (attempt + 1))
    return False


def _require_loop() -> None:
    if os.geteuid() != 0:
        pytest.skip("loop devices need root")
    if shutil.which("losetup") is None:
        pytest.skip("losetup is not installed (Debian package util-linux)")
    if not Path("/dev/loop-control").exists():
        pytest.skip("/dev/loop-control is missing: the loop module is not loaded")


def fill_file(path: Path, size: int) -> None:
    """``size`` bytes of zeros really written (O_DIRECT, 4 MiB at a time): a hole or an
    fallocated extent is read back as zeros without any I/O, which would measure nothing."""
    chunk = 4 << 20
    buf = mmap.mmap(-1, chunk)  # page-aligned, as O_DIRECT wants
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_DIRECT, 0o600)
    try:
        for _ in range(size // chunk):
            os.write(fd, buf)
        os.fsync(fd)
    finally:
        os.close(fd)
        buf.close()


@contextlib.contextmanager
def fresh_loop(directory: Path, size: int = 64 << 20, *, direct_io: bool = False,
               fill: bool = False) -> Iterator[str]:
    """A loop device made for the caller (LOOP_CTL_ADD) over a sparse file in ``directory``.

    Its queue has the kernel's defaults, which no write can restore on a used
    device: wbt_lat_usec, once written, is "set by the user" for good, and only
    a default-enabled throttle is switched off by bfq. The device is detached and
    removed afterwards, whatever happens; a device someone else attached in
    between is left alone.

    ``direct_io``: the loop device reads its file with O_DIRECT, past the host's page
    cache, and ``fill`` writes the file's blocks (``size`` a multiple of 4 MiB): a
    device whose reads cost real I/O, for benchmarks and tuning experiments.
    """
    ctl = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    try:
        index = _FRESH_BASE + random.randrange(1 << 16)
        while True:
            try:
                index = fcntl.ioctl(ctl, _LOOP_CTL_ADD, index)
                break
            except OSError as exc:
                if exc.errno != errno.EEXIST:
                    raise
                index += 1
        name = f"loop{index}"
        image = directory / f"fresh-{name}-{os.getpid()}.img"
        loop = _Loop(name, image, {})
        try:
            if fill:
                fill_file(image, size)
            else:
                with open(image, "wb") as fh:
                    fh.truncate(size)
            for _ in range(100):  # devtmpfs makes the node right after the add
                if Path(f"/dev/{name}").exists():
                    break
                time.sleep(0.01)
            dio = ["--direct-io=on"] if direct_io else []
            proc = subprocess.run(["losetup", *dio, f"/dev/{name}", str(image)], check=False,
                                  capture_output=True, text=True, timeout=30)
            if proc.returncode != 0:
                raise RuntimeError(f"losetup /dev/{name} failed: {proc.stderr.strip()}")
            yield name
        finally:
            problem = _release(loop)
            # Refused (EBUSY) for a device that is attached: never remove someone else's.
            with contextlib.suppress(OSError):
                _retry_busy(lambda: fcntl.ioctl(ctl, _LOOP_CTL_REMOVE, index))
            if problem:
                raise RuntimeError(problem)
    finally:
        os.close(ctl)


@pytest.fixture
def fresh_loops(tmp_path: Path) -> Callable[[], contextlib.AbstractContextManager[str]]:
    """``with fresh_loops() as name:`` a new loop device with the kernel's queue defaults."""
    _require_loop()
    return lambda: fresh_loop(tmp_path)


@pytest.fixture
def loop_devices(tmp_path: Path) -> Iterator[Callable[[int], list[str]]]:
    """A factory: ``loop_devices(n)`` attaches n fresh loop devices and returns their names.

    Each is backed by a sparse 64 MiB file in tmp_path, and is detached (with
    its queue settings put back) when the test ends, whatever its outcome.
    """
    _require_loop()
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


#: A streaming test device: 8 buffered 32K readers each read 64 MiB of it once.
STREAM_BYTES = 512 << 20


@pytest.fixture
def stream_loop(tmp_path: Path) -> Iterator[str]:
    """A new direct-I/O loop device over 512 MiB of real blocks, at read_ahead_kb 0.

    Its reads reach the disk (neither the host's page cache nor holes), so read-ahead
    decides what buffered streams get: the device for real tuning experiments. fio must
    be installed.
    """
    _require_loop()
    if shutil.which("fio") is None:
        pytest.skip("fio is not installed (Debian package fio)")
    with fresh_loop(tmp_path, STREAM_BYTES, direct_io=True, fill=True) as name:
        if (Path("/sys/block") / name / "loop" / "dio").read_text().strip() != "1":
            pytest.skip(f"the filesystem of {tmp_path} refuses direct I/O to a loop device")
        # After losetup: attaching updates the queue limits, which raises read-ahead (6.11+).
        _queue(name, "read_ahead_kb").write_text("0")
        yield name
