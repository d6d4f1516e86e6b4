"""Reading tunables through the catalog: current value, bounds, writability."""

from __future__ import annotations

from pathlib import Path

from stortune.agent.kernelfs import KernelFS
from stortune.schemas import catalog
from stortune.schemas.catalog import Tunable, TunableValueError
from stortune.schemas.topology import TEXT_MAX, DeviceKind, TunableState


def read_state(fs: KernelFS, tunable: Tunable, device: str | None,
               directory: Path | None = None) -> TunableState:
    """The tunable as the kernel shows it now; absent means unsupported, never an error."""
    path = fs.tunable_path(tunable, device, directory)
    raw = fs.read(path)
    if raw is None:
        return TunableState(supported=False, reason=f"{tunable.path} is absent on this kernel/device")
    if len(raw) > TEXT_MAX:  # no sysfs attribute is longer than a page: not one to tune
        return TunableState(supported=False, reason=f"{tunable.path} is longer than a sysfs page")
    try:
        value, choices = tunable.parse(raw)
    except TunableValueError as exc:
        return TunableState(supported=False, raw=raw.strip(), reason=str(exc))
    maximum = tunable.maximum
    if tunable.bound_by and device is not None:
        bound = fs.read((directory or fs.block_dir(device)) / tunable.bound_by)
        if bound is not None and bound.strip().isdigit():
            maximum = min(int(bound), maximum) if maximum is not None else int(bound)
    return TunableState(
        supported=True,
        value=value,
        raw=raw.strip(),
        writable=fs.is_writable(path),
        choices=choices,
        minimum=tunable.minimum,
        maximum=maximum,
    )


def read_device(fs: KernelFS, device: str, kind: DeviceKind,
                directory: Path | None = None) -> dict[str, TunableState]:
    """Every catalog tunable that applies to this kind of device."""
    if directory is None:
        directory = fs.block_dir(device)
    return {t.name: read_state(fs, t, device, directory) for t in catalog.kernel_for_kind(kind)}


def read_host(fs: KernelFS) -> dict[str, TunableState]:
    return {t.name: read_state(fs, t, None) for t in catalog.kernel_for_kind(DeviceKind.HOST)}
