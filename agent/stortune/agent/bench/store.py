"""Benchmark runs on disk, under the agent's state directory, until they are fetched.

    <state>/bench/<run id>/
        spec.json               the BenchmarkSpec document as submitted
        status.json             the latest RunProgress (+ the running fio's pid)
        result.json             the BenchmarkResult, written at the end (atomically)
        steps/NNN-<step>-rR/    one directory per step run:
            job.fio               the job file fio ran
            fio.json              fio's JSON output, as fio wrote it
            stderr.txt            fio's stderr, kept apart from the JSON

Whole files are replaced atomically (``journal.atomic_write``), so a crash
leaves the previous status or result, never half of one. The result models are
imported where they are read: serve mode asks ``unfinished()`` at start without
loading them.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from stortune.agent.bench.errors import BenchmarkError, UnknownRunError
from stortune.agent.journal import atomic_write

if TYPE_CHECKING:
    from stortune.schemas.bench.results import BenchmarkResult, RunProgress

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_SLUG = re.compile(r"[^A-Za-z0-9_.-]+")
RESULT = "result.json"
#: Prefix of a forgotten run's directory while it is deleted (not a run id: those start alphanumeric).
_GRAVE = ".forgotten-"


def new_run_id() -> str:
    return f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"


def check_run_id(run_id: str) -> str:
    if not _RUN_ID.fullmatch(run_id) or ".." in run_id:
        raise BenchmarkError(f"run id {run_id!r} must be 1-128 of [A-Za-z0-9_.-], starting"
                             " alphanumeric")
    return run_id


class RunStore:
    def __init__(self, state_dir: Path) -> None:
        self.root = state_dir / "bench"

    def dir(self, run_id: str) -> Path:
        return self.root / check_run_id(run_id)

    def create(self, run_id: str, spec: dict[str, Any]) -> Path:
        path = self.dir(run_id)
        if path.exists():
            raise BenchmarkError(f"a benchmark run {run_id!r} already exists on this agent;"
                                 " choose another run id")
        (path / "steps").mkdir(parents=True, mode=0o700)
        atomic_write(path / "spec.json", _dumps(spec))
        return path

    def step_dir(self, run_id: str, index: int, step: str, repeat: int) -> Path:
        path = self.dir(run_id) / "steps" / f"{index:03d}-{_SLUG.sub('_', step)}-r{repeat}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def write_status(self, progress: RunProgress, fio_pid: int | None = None) -> None:
        data = progress.model_dump(mode="json") | {"fio_pid": fio_pid}
        atomic_write(self.dir(progress.run_id) / "status.json", _dumps(data))

    def read_status(self, run_id: str) -> tuple[RunProgress, int | None] | None:
        from stortune.schemas.bench.results import RunProgress

        data = _load(self.dir(run_id) / "status.json")
        if not isinstance(data, dict):
            return None
        pid = data.pop("fio_pid", None)
        try:
            return RunProgress.model_validate(data), pid if isinstance(pid, int) else None
        except ValidationError:
            return None

    def write_result(self, result: BenchmarkResult) -> None:
        atomic_write(self.dir(result.run_id) / RESULT,
                     result.model_dump_json(indent=1).encode())

    def read_result(self, run_id: str) -> BenchmarkResult | None:
        from stortune.schemas.bench.results import BenchmarkResult

        path = self.dir(run_id) / RESULT
        if not self.dir(run_id).is_dir():
            raise UnknownRunError(run_id)
        try:
            return BenchmarkResult.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValidationError) as exc:
            raise BenchmarkError(f"{path} cannot be read ({exc}); it was left in place") from None

    def runs(self) -> list[str]:
        try:
            return sorted(p.name for p in self.root.iterdir() if p.is_dir() and _RUN_ID.fullmatch(p.name))
        except FileNotFoundError:
            return []

    def unfinished(self) -> list[str]:
        """Runs without a result: running now, or interrupted when their agent died."""
        return [r for r in self.runs() if not (self.root / r / RESULT).exists()]

    def delete(self, run_id: str) -> None:
        """Forget a run: UnknownRunError when it is not here (any more).

        The run's directory is first renamed out of the runs' namespace, which
        is atomic: of two forgets at once (two control planes, or a retry while
        the first still deletes) one takes it and the other finds nothing,
        instead of both removing the same files and one failing half-way. What
        an agent that died while deleting left behind is removed by the next
        forget.
        """
        path = self.dir(run_id)
        if not path.is_dir():
            raise UnknownRunError(run_id)
        grave = self.root / f"{_GRAVE}{run_id}-{uuid.uuid4().hex[:8]}"
        try:
            path.rename(grave)
        except FileNotFoundError:
            raise UnknownRunError(run_id) from None
        for leftover in [grave, *self.root.glob(f"{_GRAVE}*")]:
            shutil.rmtree(leftover, ignore_errors=True)


def _dumps(data: Any) -> bytes:
    return json.dumps(data, indent=1, sort_keys=True).encode()


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
