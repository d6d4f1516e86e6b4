"""Sample /proc/diskstats for a target and every device beneath it while a step runs.

Two samples of a device's counters give what ``iostat -x`` shows between them:
IOPS, throughput, await (time per completed I/O), average queue size and
utilisation (time with I/O in flight). Over an md array's members, the slowest
drive stands out (``results.mark_slowest``). Reads go through the injected
``KernelFS`` procfs root, so fixture trees drive the same code.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from stortune.agent import procfs
from stortune.agent.kernelfs import KernelFS
from stortune.schemas.bench.results import DeviceStats, mark_slowest
from stortune.schemas.bench.target import Beneath

SECTOR = 512  # diskstats counts 512-byte sectors whatever the device's block size


@dataclass(frozen=True)
class Snapshot:
    at: float  # monotonic seconds
    stats: dict[str, procfs.DiskStat]


def _grew(before: int, after: int) -> int:
    # A counter that went backwards wrapped (32-bit on some kernels) or the device was
    # re-created: count nothing rather than a huge or negative figure.
    return after - before if after >= before else 0


def delta(before: procfs.DiskStat, after: procfs.DiskStat, seconds: float, *,
          relation: str = "target", above: str | None = None) -> DeviceStats:
    """One device's figures between two samples ``seconds`` apart."""
    reads, writes = _grew(before.reads, after.reads), _grew(before.writes, after.writes)
    read_ms, write_ms = _grew(before.read_ms, after.read_ms), _grew(before.write_ms, after.write_ms)
    io_ms = _grew(before.io_ms, after.io_ms)
    wall_ms = seconds * 1000
    ios = reads + writes
    read_bytes = _grew(before.sectors_read, after.sectors_read) * SECTOR
    write_bytes = _grew(before.sectors_written, after.sectors_written) * SECTOR
    # md and some dm targets complete I/O without accounting busy time: unknown, not idle.
    util = None if wall_ms <= 0 or (ios and not io_ms) else min(100.0, 100 * io_ms / wall_ms)
    rate = (lambda n: n / seconds) if seconds > 0 else (lambda n: 0.0)
    return DeviceStats(
        device=after.name, relation=relation, above=above, seconds=seconds,
        read_ios=reads, write_ios=writes, read_bytes=read_bytes, write_bytes=write_bytes,
        read_iops=rate(reads), write_iops=rate(writes), read_bytes_per_s=rate(read_bytes),
        write_bytes_per_s=rate(write_bytes), util_percent=util,
        read_await_ms=read_ms / reads if reads else None,
        write_await_ms=write_ms / writes if writes else None,
        await_ms=(read_ms + write_ms) / ios if ios else None,
        queue_depth=_grew(before.weighted_ms, after.weighted_ms) / wall_ms if wall_ms > 0 else None,
    )


def between(first: Snapshot, last: Snapshot, devices: Sequence[Beneath]) -> list[DeviceStats]:
    """Figures of every watched device present in both samples, slowest members marked."""
    seconds = last.at - first.at
    out = [delta(first.stats[b.device], last.stats[b.device], seconds, relation=b.relation,
                 above=b.above)
           for b in devices if b.device in first.stats and b.device in last.stats]
    return mark_slowest(out)


class DiskstatsSampler:
    """Samples in a thread every ``interval`` s from ``start()`` to ``stop()``.

    ``on_tick`` gets the target's figures over the last interval (live progress);
    ``stop()`` returns every watched device's figures over the whole span.
    """

    def __init__(self, fs: KernelFS, devices: Sequence[Beneath], *, interval: float = 1.0,
                 clock: Callable[[], float] = time.monotonic,
                 on_tick: Callable[[DeviceStats], None] | None = None) -> None:
        self.fs = fs
        self.devices = list(devices)
        self.interval = interval
        self.clock = clock
        self.on_tick = on_tick
        self.problems: list[str] = []
        self._first: Snapshot | None = None
        self._last: Snapshot | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> Snapshot:
        text = self.fs.read_table("diskstats")
        if text is None:
            if not self.problems:
                self.problems.append("cannot read diskstats under the procfs root: no device figures")
            return Snapshot(self.clock(), {})
        wanted = {b.device for b in self.devices}
        stats, problems = procfs.parse_diskstats(text)
        self.problems += [p for p in problems if p not in self.problems][:5]
        return Snapshot(self.clock(), {k: v for k, v in stats.items() if k in wanted})

    def start(self) -> None:
        self._first = self._last = self.sample()
        if self.devices:
            self._thread = threading.Thread(target=self._loop, name="stortune-diskstats", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._tick()

    def _tick(self) -> None:
        previous, current = self._last, self.sample()
        self._last = current
        target = self.devices[0].device if self.devices else None
        if self.on_tick is None or previous is None or target is None:
            return
        if target in previous.stats and target in current.stats:
            self.on_tick(delta(previous.stats[target], current.stats[target],
                               current.at - previous.at))

    def stop(self) -> list[DeviceStats]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._first is None:
            return []
        return between(self._first, self.sample(), self.devices)
