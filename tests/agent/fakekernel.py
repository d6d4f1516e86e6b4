"""A tiny fake sysfs/procfs builder for executor and journal tests."""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from stortune.agent.kernelfs import KernelFS, KernelWriteError
from stortune.schemas.catalog import Tunable
from stortune.schemas.plan import Change, Source
from stortune.schemas.topology import DeviceKind

FAKE_QUEUE = {
    "scheduler": "[none] mq-deadline kyber bfq\n",
    "nr_requests": "128\n",
    "max_sectors_kb": "1280\n",
    "max_hw_sectors_kb": "1280\n",
    "read_ahead_kb": "128\n",
}


def make_fake_kernel(root: Path, devices: dict[str, dict[str, str]]) -> KernelFS:
    """A sysfs/procfs pair under root; /sys/block/NAME is a symlink as on a real host.

    Plain files do not behave like sysfs (no brackets after writing the
    scheduler, no side effects), which is enough for the journal's logic.
    """
    sysfs, procfs = root / "sys", root / "proc"
    (sysfs / "block").mkdir(parents=True, exist_ok=True)
    procfs.mkdir(exist_ok=True)
    for name, attrs in devices.items():
        real = sysfs / "devices" / "virtual" / "block" / name
        (real / "queue").mkdir(parents=True)
        (sysfs / "block" / name).symlink_to(Path("../devices/virtual/block") / name)
        for attr, text in attrs.items():
            (real / "queue" / attr).write_text(text)
    return KernelFS.at(sysfs, procfs)


@dataclass(frozen=True)
class PickyKernel(KernelFS):
    """Plain files plus what a real queue does with values it will not hold, which no planner can
    foresee: above ``refuses[tunable]`` the write fails with EINVAL (nr_requests over the depth of a
    queue without a scheduler), above ``clamps[tunable]`` it succeeds but keeps the limit (a
    driver's can_queue). Every write is logged as (device, tunable, text)."""

    refuses: Mapping[str, int] = field(default_factory=dict, compare=False)
    clamps: Mapping[str, int] = field(default_factory=dict, compare=False)
    writes: list[tuple[str, str, str]] = field(default_factory=list, compare=False)

    @classmethod
    def over(cls, fs: KernelFS, *, refuses: Mapping[str, int] | None = None,
             clamps: Mapping[str, int] | None = None) -> PickyKernel:
        return cls(fs.sysfs, fs.procfs, fs.dev, fs.controllers, refuses=refuses or {},
                   clamps=clamps or {})

    def write_tunable(self, tunable: Tunable, device: str | None, text: str) -> None:
        self.writes.append((device or "host", tunable.name, text))
        name = tunable.name
        if name in self.refuses and int(text) > self.refuses[name]:
            raise KernelWriteError(errno.EINVAL, os.strerror(errno.EINVAL), name)
        if name in self.clamps:
            text = str(min(int(text), self.clamps[name]))
        super().write_tunable(tunable, device, text)


def queue_file(fs: KernelFS, device: str, attr: str) -> Path:
    return fs.sysfs / "block" / device / "queue" / attr


def read_queue(fs: KernelFS, device: str, attr: str) -> str:
    return queue_file(fs, device, attr).read_text().strip()


def change(
    device: str,
    tunable: str,
    current: int | str | None,
    desired: int | str,
    *,
    device_id: str | None = None,
    kind: DeviceKind = DeviceKind.LOOP,
) -> Change:
    """A hand-built plan entry; the id defaults to one derived from the name."""
    return Change(
        device=device,
        device_id=device_id or f"name:{device}",
        kind=kind,
        tunable=tunable,
        current=current,
        desired=desired,
        source=Source(profile="test", rule="by-hand"),
    )
