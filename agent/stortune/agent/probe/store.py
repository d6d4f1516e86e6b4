"""Probe runs on disk, under the agent's state directory; the ceilings they measured.

    <state>/probes/<probe id>/
        status.json     the latest RunProgress
        result.json     the ProbeResult, written at the end (atomically)
        steps/NN-<name>/job.fio, fio.json, stderr.txt
    <state>/probes/measured.json
        the latest MeasuredCeiling per device over all probes: what ``stortune-agent
        analyze`` on this host takes as measured ceilings (``load_measured``)
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from stortune.agent.bench.errors import BenchmarkError, UnknownRunError
from stortune.agent.journal import atomic_write
from stortune.schemas.analysis.model import MeasuredCeiling
from stortune.schemas.analysis.probe import ProbeResult
from stortune.schemas.bench.results import RunProgress

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_SLUG = re.compile(r"[^A-Za-z0-9_.-]+")
MEASURED = "measured.json"
_CEILINGS: TypeAdapter[list[MeasuredCeiling]] = TypeAdapter(list[MeasuredCeiling])


def check_probe_id(probe_id: str) -> str:
    if not _ID.fullmatch(probe_id) or ".." in probe_id:
        raise BenchmarkError(f"probe id {probe_id!r} must be 1-128 of [A-Za-z0-9_.-], starting"
                             " alphanumeric")
    return probe_id


def probes_dir(state_dir: Path) -> Path:
    return state_dir / "probes"


def load_measured(state_dir: Path) -> list[MeasuredCeiling]:
    """The ceilings probes measured on this host, the latest per device; [] when none (or the
    file cannot be read: an analysis then falls back to the device classes)."""
    try:
        return _CEILINGS.validate_json((probes_dir(state_dir) / MEASURED).read_bytes())
    except (OSError, ValidationError):
        return []


def merge_measured(state_dir: Path, fresh: list[MeasuredCeiling]) -> list[MeasuredCeiling]:
    """Replace the stored ceilings of the devices ``fresh`` measured; keep the others."""
    by_device = {c.device: c for c in load_measured(state_dir)}
    by_device.update({c.device: c for c in fresh})
    merged = [by_device[d] for d in sorted(by_device)]
    atomic_write(probes_dir(state_dir) / MEASURED, _CEILINGS.dump_json(merged, indent=1, by_alias=True))
    return merged


class ProbeStore:
    def __init__(self, state_dir: Path) -> None:
        self.root = probes_dir(state_dir)

    def dir(self, probe_id: str) -> Path:
        return self.root / check_probe_id(probe_id)

    def create(self, probe_id: str) -> Path:
        path = self.dir(probe_id)
        if path.exists():
            raise BenchmarkError(f"a probe {probe_id!r} already exists on this agent; choose another id")
        (path / "steps").mkdir(parents=True, mode=0o700)
        return path

    def step_dir(self, probe_id: str, index: int, name: str) -> Path:
        path = self.dir(probe_id) / "steps" / f"{index:02d}-{_SLUG.sub('_', name)}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def ids(self) -> list[str]:
        try:
            return sorted(p.name for p in self.root.iterdir() if p.is_dir() and _ID.fullmatch(p.name))
        except FileNotFoundError:
            return []

    def write_status(self, progress: RunProgress) -> None:
        atomic_write(self.dir(progress.run_id) / "status.json", progress.model_dump_json().encode())

    def write_fio_pid(self, probe_id: str, pid: int) -> None:
        """The running step's fio: it has its own session and outlives a killed agent, so the
        next agent stops it (a probe's reads would load the disks under the next benchmark)."""
        atomic_write(self.dir(probe_id) / "fio.pid", f"{pid}\n".encode())

    def read_fio_pid(self, probe_id: str) -> int | None:
        try:
            text = (self.dir(probe_id) / "fio.pid").read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            return None
        return int(text) if text.isdigit() and 0 < len(text) <= 10 else None

    def read_status(self, probe_id: str) -> RunProgress | None:
        try:
            return RunProgress.model_validate_json((self.dir(probe_id) / "status.json").read_bytes())
        except (OSError, ValidationError):
            return None

    def write_result(self, result: ProbeResult) -> None:
        atomic_write(self.dir(result.probe_id) / "result.json",
                     json.dumps(result.model_dump(mode="json"), indent=1).encode())

    def read_result(self, probe_id: str) -> ProbeResult | None:
        if not self.dir(probe_id).is_dir():
            raise UnknownRunError(probe_id)
        try:
            return ProbeResult.model_validate_json((self.dir(probe_id) / "result.json").read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValidationError) as exc:
            raise BenchmarkError(f"probe {probe_id}: its result cannot be read ({exc})") from None
