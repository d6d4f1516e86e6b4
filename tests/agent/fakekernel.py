"""A tiny fake sysfs/procfs builder for executor and journal tests."""

from __future__ import annotations

from pathlib import Path

from stortune.agent.kernelfs import KernelFS
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
