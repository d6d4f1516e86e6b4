"""Keeping settings applied: at start, after reboots, and when disks come and go.

Kernel settings vanish at reboot and a hot-plugged disk starts with kernel
defaults, so the agent re-applies the last desired state it received when it
starts and whenever the device graph changes. Changes are noticed through
udev events when pyudev can watch the real /sys, else by a periodic rescan.
Each pass re-reads everything (level-triggered): no event needs to be seen
for the next pass to converge.
"""

from __future__ import annotations

import logging
import select
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Protocol

from stortune.agent import local
from stortune.agent.journal import BenchmarkBusyError
from stortune.agent.kernelfs import KernelFS

log = logging.getLogger("stortune.agent.daemon")


class Waiter(Protocol):
    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` s; True when a block device event arrived."""
        ...


class _Sleeper:
    def __init__(self, stop: threading.Event) -> None:
        self._stop = stop

    def wait(self, timeout: float) -> bool:
        self._stop.wait(timeout)
        return False


class _UdevWaiter:
    """Wakes on udev block events; falls back to the timeout when none come."""

    def __init__(self, stop: threading.Event) -> None:
        import pyudev

        self._stop = stop
        self._monitor = pyudev.Monitor.from_netlink(pyudev.Context())
        self._monitor.filter_by(subsystem="block")
        self._monitor.start()

    def wait(self, timeout: float) -> bool:
        ready, _, _ = select.select([self._monitor], [], [], timeout)
        if not ready:
            return False
        # Drain the burst (a disk brings its partitions): one rescan for all.
        while self._monitor.poll(timeout=0.2) is not None:
            pass
        return not self._stop.is_set()


def make_waiter(fs: KernelFS, stop: threading.Event) -> Waiter:
    if fs.sysfs.resolve() == Path("/sys"):
        try:
            return _UdevWaiter(stop)
        except Exception as exc:
            log.info("udev events unavailable (%s); rescanning periodically", exc)
    return _Sleeper(stop)


def converge(fs: KernelFS, state_dir: Path) -> local.Report | None:
    """One pass: re-apply the stored desired state if there is one."""
    desired = local.saved_desired(state_dir)
    if desired is None:
        return None
    report = local.converge(fs, desired.profiles, state_dir, desired.generations)
    changed = [r for r in report.rows if r.status == "applied"]
    if not report.ok:
        log.error("re-apply failed: %s", "; ".join(report.messages))
    elif changed:
        log.info("re-applied %d setting(s): %s", len(changed),
                 ", ".join(f"{r.device}/{r.tunable}={r.after}" for r in changed))
    return report


def run(fs: KernelFS, state_dir: Path, interval: float, *, once: bool = False,
        stop: threading.Event | None = None) -> int:
    stop = stop or threading.Event()
    retry = False
    try:
        recovered = local.recover(fs, state_dir)
        if recovered:
            log.warning("finished an interrupted transaction: %s", recovered)
        report = converge(fs, state_dir)
    except BenchmarkBusyError as exc:
        if once:
            raise
        log.info("re-apply postponed: %s", exc)
        report, retry = None, True
    if once:
        return 0 if report is None or report.ok else 1

    def _stop(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
    waiter = make_waiter(fs, stop)
    last = local.discover(fs).structure_hash()
    log.info("watching for device changes (rescan every %.0f s)", interval)
    while not stop.is_set():
        event = waiter.wait(interval)
        if stop.is_set():
            break
        current = local.discover(fs).structure_hash()
        if current != last or event or retry:
            log.info("device graph changed (%s -> %s): converging", last, current)
            last = current
            try:
                converge(fs, state_dir)
                retry = False
            except BenchmarkBusyError as exc:
                # Nothing changes under a benchmark; the next rescan tries again.
                log.info("re-apply postponed: %s", exc)
                retry = True
    return 0
