"""Keeping settings applied: at start, after reboots, and when disks come and go.

Kernel settings vanish at reboot and a hot-plugged disk starts with kernel
defaults, so the agent re-applies the last desired state it received when it
starts and whenever the device graph changes. Changes are noticed through
uevents when the agent manages the real /sys, else by a periodic rescan (which
also runs alongside the events). Each pass re-reads everything
(level-triggered): no event needs to be seen for the next pass to converge.

The uevents come straight from the kernel's netlink socket, the one udev
reads, with no udev library in between (pyudev and ctypes cost the idle agent
about 1 MiB). While udevd runs the agent takes udevd's re-broadcast, sent once
its rules ran, so a distribution's rule that sets a new disk's scheduler runs
before the agent applies the profile, not after it.
"""

from __future__ import annotations

import logging
import select
import signal
import socket
import threading
from pathlib import Path
from types import FrameType
from typing import Protocol

from stortune.agent import corrections, local, trials
from stortune.agent.journal import HostBusyError
from stortune.agent.kernelfs import KernelFS
from stortune.schemas import stripecache
from stortune.schemas.corrections import Cause, Trigger

log = logging.getLogger("stortune.agent.daemon")


class Waiter(Protocol):
    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` s; True when a block device event arrived."""
        ...

    def close(self) -> None: ...


class _Sleeper:
    def __init__(self, stop: threading.Event) -> None:
        self._stop = stop

    def wait(self, timeout: float) -> bool:
        self._stop.wait(timeout)
        return False

    def close(self) -> None:
        pass


NETLINK_KOBJECT_UEVENT = 15  # linux/netlink.h
#: Multicast groups of that socket: the kernel's uevents, and udevd's once its rules ran.
KERNEL_EVENTS, UDEV_EVENTS = 1, 2
#: udevd's control socket, there while udevd runs (libudev looks for it too).
UDEVD_CONTROL = Path("/run/udev/control")
#: A burst (a disk and its partitions) ends after this long without another event.
_BURST_S = 0.2


def is_block_event(message: bytes) -> bool:
    """Whether a uevent is about a block device.

    Kernel messages are ``ACTION@DEVPATH`` then ``KEY=VALUE`` strings, udevd's
    a binary header then the same strings; all NUL-separated either way.
    """
    return b"SUBSYSTEM=block" in message.split(b"\0")


class UeventWaiter:
    """Wakes on block-device uevents; otherwise returns at the timeout.

    Sending to these groups takes CAP_NET_ADMIN, and an event only causes a
    rescan that re-reads everything, so what a message says is never trusted
    beyond "look again".
    """

    def __init__(self, stop: threading.Event, group: int) -> None:
        self._stop = stop
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC,
                                   NETLINK_KOBJECT_UEVENT)
        try:
            self._sock.bind((0, group))
        except OSError:
            self._sock.close()
            raise

    def wait(self, timeout: float) -> bool:
        block = False
        deadline = timeout
        # The first event may come at any time up to ``timeout``; then drain the burst
        # it starts, so that one rescan covers a disk and all its partitions.
        while select.select([self._sock], [], [], deadline)[0]:
            try:
                block = is_block_event(self._sock.recv(1 << 16)) or block
            except OSError as exc:  # ENOBUFS: events were dropped; look again to be safe
                log.debug("uevents lost (%s)", exc)
                block = True
            deadline = _BURST_S
        return block and not self._stop.is_set()

    def close(self) -> None:
        self._sock.close()


def make_waiter(fs: KernelFS, stop: threading.Event) -> Waiter:
    if fs.sysfs.resolve() == Path("/sys"):
        group = UDEV_EVENTS if UDEVD_CONTROL.exists() else KERNEL_EVENTS
        try:
            return UeventWaiter(stop, group)
        except OSError as exc:
            log.info("uevents unavailable (%s); rescanning periodically", exc)
    return _Sleeper(stop)


def converge(fs: KernelFS, state_dir: Path, *,
             ram_share: float = stripecache.DEFAULT_RAM_SHARE, trigger: Trigger = "rescan",
             cause: Cause = "runtime") -> local.Report | None:
    """One pass: re-apply the stored desired state if there is one.

    What it sets back that stortune had applied is a correction, kept with ``cause`` and
    ``trigger`` for the control plane (``corrections``): it never sees that drift otherwise."""
    desired = local.saved_desired(state_dir)
    if desired is None:
        return None
    # Held to the control plane's share stored with them as much as the Apply that sent them was.
    before = local.plan(fs, desired.profiles, state_dir,
                        ram_share=stripecache.tightest(ram_share, desired.ram_share))
    report = local.converge(fs, desired.profiles, state_dir, desired.generations, ram_share=ram_share,
                            asked_share=desired.ram_share)
    changed = [r for r in report.rows if r.status == "applied"]
    _corrected(state_dir, before, changed, cause, trigger)
    if not report.ok:
        log.error("re-apply failed: %s", "; ".join(report.messages))
        return report
    if report.rejected:  # the rest was applied; these stay as they are until the profile changes
        log.warning("re-apply: %d setting(s) cannot be set: %s", len(report.rejected),
                    "; ".join(f"{r.device}/{r.tunable}={r.after}: {r.message}" for r in report.rejected))
    if changed:
        log.info("re-applied %d setting(s): %s", len(changed),
                 ", ".join(f"{r.device}/{r.tunable}={r.after}" for r in changed))
    return report


def _corrected(state_dir: Path, before: local.Planned, changed: list[local.ReportRow], cause: Cause,
               trigger: Trigger) -> None:
    written = {(r.device, r.tunable) for r in changed}
    drifted = corrections.drifted(before.topology, before.plan.desired)
    for c in corrections.add(state_dir, [w for w in drifted if (w.device, w.tunable) in written],
                             cause, trigger):
        log.warning("corrected: %s", c.drift_message())


def start_cause(fs: KernelFS, state_dir: Path) -> Cause:
    """Why values found changed at this start had changed (``corrections.start``)."""
    return corrections.start(state_dir, local.host_info(fs).get("boot_id", ""))


def run(fs: KernelFS, state_dir: Path, interval: float, *, once: bool = False,
        stop: threading.Event | None = None,
        ram_share: float = stripecache.DEFAULT_RAM_SHARE) -> int:
    stop = stop or threading.Event()
    retry = False
    try:
        recovered = trials.recover(fs, state_dir, ram_share=ram_share)
        if recovered:
            log.warning("finished what an interruption left: %s", recovered)
        report = converge(fs, state_dir, ram_share=ram_share, trigger="start",
                          cause=start_cause(fs, state_dir))
    except HostBusyError as exc:
        if once:
            raise
        log.info("re-apply postponed: %s", exc)
        report, retry = None, True
    if once:
        return 0 if report is None or (report.ok and not report.rejected) else 1

    def _stop(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
    waiter = make_waiter(fs, stop)
    last = local.discover(fs).structure_hash()
    log.info("watching for device changes (rescan every %.0f s)", interval)
    try:
        while not stop.is_set():
            event = waiter.wait(interval)
            if stop.is_set():
                break
            current = local.discover(fs).structure_hash()
            if current != last or event or retry:
                log.info("device graph changed (%s -> %s): converging", last, current)
                last = current
                try:
                    converge(fs, state_dir, ram_share=ram_share)
                    retry = False
                except HostBusyError as exc:
                    # Nothing changes under a benchmark or an experiment; the next rescan tries again.
                    log.info("re-apply postponed: %s", exc)
                    retry = True
    finally:
        waiter.close()
    return 0
