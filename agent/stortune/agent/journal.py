"""Durable agent state: originals, the transaction journal, the desired state, the lock.

Everything the agent must not forget across a crash, kill -9 or power loss
lives in one state directory (``/var/lib/stortune`` in production, always
passed in)::

    lock             flock(2) target: one apply/restore/recovery at a time
    bench.lock       flock(2) held while a benchmark runs: no setting changes meanwhile
    experiment.lock  flock(2) held while a tuning experiment runs: only its own changes pass;
                     its id stays written in it until the settings are back, so an
                     experiment killed midway is found and undone at the next start
    originals.json   the value each (device_id, tunable) had before stortune first wrote it
    desired.json     the last desired-state document the agent received
    refused.json     values the kernel refused when written, this boot (``refusals``)
    journal/*.jsonl  the transaction in progress (at most one while the lock is held)
    journal/done/    finished transactions, the most recent few kept for diagnosis

Whole files are replaced atomically (temp file, fsync, rename, fsync of the
directory); the journal is append-only with an fsync after every record, so
after a crash it ends at a record boundary or with one torn line, which is
ignored. Nothing here touches the kernel: the executor does, and it alone
decides what to write back.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import fcntl
import json
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

if TYPE_CHECKING:
    from stortune.agent.executor import RecoveryReport
    from stortune.agent.kernelfs import KernelFS

Value = int | str
#: (device_id, tunable): the identity of an original, independent of the kernel name.
OriginalKey = tuple[str, str]
Outcome = Literal["commit", "rolled-back", "recovered", "abandoned"]

_ORIGINALS = "originals.json"
_DESIRED = "desired.json"
_LOCK = "lock"
_BENCH_LOCK = "bench.lock"
_EXPERIMENT_LOCK = "experiment.lock"
_JOURNAL = "journal"
_DONE = "done"
_KEEP_DONE = 50


class StateError(Exception):
    """Base of the state-directory errors."""


class StateLockedError(StateError):
    """Another stortune process holds the state-directory lock."""


class HostBusyError(StateLockedError):
    """A benchmark or an experiment owns this host's settings for now (retry later)."""


class BenchmarkBusyError(HostBusyError):
    """A benchmark runs on this host: settings must not change under it (retry later)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"busy: benchmark {run_id} running; settings cannot change until it"
                         " ends (wait, or cancel the benchmark) and retry")


class ExperimentBusyError(HostBusyError):
    """A tuning experiment owns this host's settings: only its own changes are allowed."""

    def __init__(self, experiment_id: str) -> None:
        self.experiment_id = experiment_id
        super().__init__(f"busy: experiment {experiment_id} running; settings cannot change until"
                         " it ends (wait, or stop it: Ctrl-C on `stortune-agent tune`) and retry")


class StateWriteError(StateError):
    """The state directory cannot take a write: full, over quota or read-only."""


#: What a state directory answers when it can take no write: said as such, not as a traceback.
_CANNOT_WRITE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


@contextlib.contextmanager
def _writing(path: Path) -> Iterator[None]:
    """Turn a full, over-quota or read-only state directory into a StateWriteError naming it.
    Only around the journal's own writes: a caller's OSError inside a held lock stays its own."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in _CANNOT_WRITE:
            raise
        raise StateWriteError(
            f"cannot write {path}: {os.strerror(exc.errno)}; the agent's state directory"
            f" {path.parent} must be writable and have room: free space there (or remount it"
            " read-write) and run it again, or give --state-dir on another filesystem") from None


class StateCorruptError(StateError):
    """A state file cannot be read; it is left untouched for a human to inspect."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _default_true(value: object) -> bool:
    return value is True


def _absent(value: object) -> bool:
    return value is None


class Original(_Model):
    """The value a tunable had before stortune first changed it.

    Also recorded for what a write resets as a kernel side effect (switching the
    scheduler resets nr_requests): ``direct`` is then false until stortune sets
    the tunable itself, and ``cause``/``cause_left`` say which write last reset
    it and what it left, which is where a removed setting goes back to while
    that write is still wanted. Fields at their defaults are not written, so a
    store of plain originals reads as it always did.
    """

    device_id: str
    device: str
    tunable: str
    raw: str
    value: Value
    recorded_at: float
    txid: str | None = None
    direct: bool = Field(default=True, exclude_if=_default_true)
    cause: str | None = Field(default=None, exclude_if=_absent)
    cause_left: Value | None = Field(default=None, exclude_if=_absent)

    @property
    def key(self) -> OriginalKey:
        return (self.device_id, self.tunable)


class _OriginalsDoc(_Model):
    version: Literal[1] = 1
    originals: list[Original] = []


class Intent(_Model):
    """Journaled before a write: enough to put the old value back after a crash."""

    seq: int
    device: str
    device_id: str
    tunable: str
    before_raw: str
    before_value: Value
    after: Value | None = None
    #: Set when this is not a planned write but a value the write of ``cause``
    #: resets as a kernel side effect (scheduler -> nr_requests).
    cause: str | None = None


# -- files --------------------------------------------------------------------


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _ensure_dir(path: Path) -> Path:
    if not path.is_dir():
        with _writing(path):
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
            _fsync_dir(path.parent)
    return path


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` so that a crash leaves either the old or the new content."""
    _ensure_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with _writing(path):
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        _fsync_dir(path.parent)


def _read_json(path: Path, what: str) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateError(f"{path}: cannot read {what}: {exc.strerror or exc}"
                         " (run as root, or give the agent's --state-dir)") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise StateCorruptError(
            f"{path}: {what} is not valid JSON ({exc}); it was left untouched: repair it or move it aside"
        ) from exc


# -- lock ---------------------------------------------------------------------


@contextlib.contextmanager
def lock(state_dir: str | Path, *, timeout: float = 0.0) -> Iterator[None]:
    """Hold the state-directory lock, or raise StateLockedError after ``timeout`` seconds.

    flock(2) is released by the kernel when the holder dies, so a crashed apply
    never leaves a stale lock behind; the pid in the file is only for the message.
    """
    path = _ensure_dir(Path(state_dir)) / _LOCK
    with _writing(path):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
                if time.monotonic() >= deadline:
                    holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                    raise StateLockedError(
                        f"state directory {state_dir} is locked by another stortune process"
                        f" (pid {holder}); wait for it to finish, or stop it, then retry"
                    ) from None
                time.sleep(0.05)
        # Every apply, restore and recovery holds this lock, so checking here keeps
        # all of them off the kernel while a benchmark runs (see hold_benchmark),
        # and while an experiment runs, except for that experiment's own.
        # The experiment first: its benchmarks are its own, and the caller should hear
        # what holds the host for the longer time.
        experiment = experiment_running(state_dir)
        if experiment is not None and experiment not in _OWNED.get():
            raise ExperimentBusyError(experiment)
        running = benchmark_running(state_dir)
        if running is not None:
            raise BenchmarkBusyError(running)
        with _writing(path):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def benchmark_running(state_dir: str | Path) -> str | None:
    """The run id of the benchmark holding this state directory's bench lock, or None."""
    path = Path(state_dir) / _BENCH_LOCK
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            return os.pread(fd, 256, 0).decode(errors="replace").split(" ")[0].strip() or "unknown"
        return None
    finally:
        os.close(fd)


@contextlib.contextmanager
def hold_benchmark(state_dir: str | Path, run_id: str, *, apply_timeout: float = 60.0) -> Iterator[None]:
    """Hold the bench lock for a benchmark's whole run.

    Taken under the state-directory lock: an apply in flight finishes first
    (waiting up to ``apply_timeout`` s), and any apply after it sees the bench
    lock and refuses with BenchmarkBusyError. A second benchmark is refused the
    same way. flock(2) dies with its holder, so a crashed run frees the host.
    """
    sdir = _ensure_dir(Path(state_dir))
    with lock(sdir, timeout=apply_timeout):
        with _writing(sdir / _BENCH_LOCK):
            fd = os.open(sdir / _BENCH_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise BenchmarkBusyError(benchmark_running(sdir) or "unknown") from None
        try:
            with _writing(sdir / _BENCH_LOCK):
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{run_id} {os.getpid()}\n".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
    try:
        yield
    finally:
        os.ftruncate(fd, 0)
        os.close(fd)


# -- experiments --------------------------------------------------------------------

#: The experiments the running code holds: their converges and benchmarks pass the
#: experiment lock. A context variable, not a process-wide flag, so another thread of
#: the holder (or a test calling the daemon's code) is refused like any other caller.
_OWNED: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "stortune_experiments", default=frozenset())


def _holder(fd: int) -> str:
    return os.pread(fd, 256, 0).decode(errors="replace").split(" ")[0].strip()


def _experiment_lock(state_dir: str | Path, *, shared: bool) -> tuple[str | None, bool]:
    """(id written in experiment.lock or None, whether a live process holds it)."""
    path = Path(state_dir) / _EXPERIMENT_LOCK
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None, False
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            return _holder(fd) or "unknown", True
        return _holder(fd) or None, False
    finally:
        os.close(fd)


def experiment_running(state_dir: str | Path) -> str | None:
    """The id of the experiment a live process holds on this state directory, or None."""
    held_id, held = _experiment_lock(state_dir, shared=True)
    return held_id if held else None


def abandoned_experiment(state_dir: str | Path) -> str | None:
    """An experiment whose process died before its settings were put back (its id), or None."""
    held_id, held = _experiment_lock(state_dir, shared=True)
    return None if held else held_id


def settle_experiment(state_dir: str | Path, experiment_id: str) -> None:
    """Forget an abandoned experiment once its device is back (no-op if someone holds it)."""
    path = Path(state_dir) / _EXPERIMENT_LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return
        if _holder(fd) == experiment_id:
            os.ftruncate(fd, 0)
            os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def hold_experiment(state_dir: str | Path, experiment_id: str, *,
                    apply_timeout: float = 60.0) -> Iterator[None]:
    """Hold the experiment lock for a tuning experiment's whole run.

    Taken under the state-directory lock, so an apply in flight finishes first;
    afterwards every apply, restore, recovery and benchmark on the state
    directory is refused with ExperimentBusyError, except those made inside
    this block (the experiment's own trials). The id stays written in the file
    until the block ends normally: the caller puts the settings back inside the
    block, and a process killed before that leaves an abandoned experiment that
    the next start undoes (``local.recover``). flock(2) dies with its holder.
    """
    if not experiment_id or any(c.isspace() for c in experiment_id):
        raise ValueError(f"experiment id {experiment_id!r} must be one word")
    sdir = _ensure_dir(Path(state_dir))
    with lock(sdir, timeout=apply_timeout):
        with _writing(sdir / _EXPERIMENT_LOCK):
            fd = os.open(sdir / _EXPERIMENT_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                raise ExperimentBusyError(experiment_running(sdir) or "unknown") from None
            left = _holder(fd)
            if left:
                raise StateError(f"experiment {left} was interrupted and its settings are not back"
                                 " yet: any stortune-agent apply, restore or serve puts them back")
            with _writing(sdir / _EXPERIMENT_LOCK):
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{experiment_id} {os.getpid()}\n".encode(), 0)
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
    token = _OWNED.set(_OWNED.get() | {experiment_id})
    try:
        yield
    except BaseException:
        # Not ended normally: the id stays, and the next start puts the settings back.
        _OWNED.reset(token)
        os.close(fd)
        raise
    _OWNED.reset(token)
    try:
        os.ftruncate(fd, 0)
        os.fsync(fd)
    finally:
        os.close(fd)


# -- originals ------------------------------------------------------------------


def load_originals(state_dir: str | Path) -> dict[OriginalKey, Original]:
    path = Path(state_dir) / _ORIGINALS
    data = _read_json(path, "the originals store")
    if data is None:
        return {}
    try:
        doc = _OriginalsDoc.model_validate(data)
    except ValidationError as exc:
        raise StateCorruptError(
            f"{path}: the originals store does not match its schema ({exc.error_count()} errors);"
            " it holds the values restore puts back, so it was left untouched:"
            " repair it or move it aside"
        ) from exc
    return {o.key: o for o in doc.originals}


def _save_originals(state_dir: str | Path, originals: Iterable[Original]) -> None:
    doc = _OriginalsDoc(originals=sorted(originals, key=lambda o: o.key))
    atomic_write(Path(state_dir) / _ORIGINALS, doc.model_dump_json(indent=1).encode())


def record_original(state_dir: str | Path, original: Original) -> bool:
    """Store ``original`` unless one exists for its key; True when it was stored.

    An existing original is never replaced: by then the tunable holds a value
    stortune wrote, which is not what restore should put back. Only the kernel
    name is refreshed, so a renamed device is restored under its current name,
    and a direct write marks an original first saved as a side effect as direct.
    """
    originals = load_originals(state_dir)
    existing = originals.get(original.key)
    if existing is not None:
        update: dict[str, Any] = {}
        if existing.device != original.device:
            update["device"] = original.device
        if original.direct and not existing.direct:
            update["direct"] = True
        if update:
            originals[original.key] = existing.model_copy(update=update)
            _save_originals(state_dir, originals.values())
        return False
    originals[original.key] = original
    _save_originals(state_dir, originals.values())
    return True


def note_causes(state_dir: str | Path, notes: Iterable[tuple[OriginalKey, str, Value]]) -> None:
    """For each (key, cause, value): the write of ``cause`` left ``value`` in that tunable."""
    originals = load_originals(state_dir)
    changed = False
    for key, cause, left in notes:
        existing = originals.get(key)
        if existing is not None and (existing.cause, existing.cause_left) != (cause, left):
            originals[key] = existing.model_copy(update={"cause": cause, "cause_left": left})
            changed = True
    if changed:
        _save_originals(state_dir, originals.values())


def settle_originals(
    state_dir: str | Path, drop: Iterable[OriginalKey], indirect: Iterable[OriginalKey] = ()
) -> None:
    """Forget the originals ``drop`` (put back); mark ``indirect`` as side effects only again
    (their own setting was removed; the write that resets them is still wanted)."""
    gone, side = set(drop), set(indirect)
    originals = load_originals(state_dir)
    remaining = {k: o for k, o in originals.items() if k not in gone}
    changed = len(remaining) != len(originals)
    for key in side:
        existing = remaining.get(key)
        if existing is not None and existing.direct:
            remaining[key] = existing.model_copy(update={"direct": False})
            changed = True
    if changed:
        _save_originals(state_dir, remaining.values())


def drop_originals(state_dir: str | Path, keys: Iterable[OriginalKey]) -> None:
    settle_originals(state_dir, keys)


# -- desired state ----------------------------------------------------------------


def save_desired(state_dir: str | Path, document: Any) -> None:
    """Store the last desired-state document (opaque JSON) for re-applying at start."""
    atomic_write(Path(state_dir) / _DESIRED, json.dumps(document, indent=1).encode())


def clear_desired(state_dir: str | Path) -> None:
    """Forget the desired state (after a restore, so a restart does not re-apply it)."""
    path = Path(state_dir) / _DESIRED
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
        _fsync_dir(path.parent)


def load_desired(state_dir: str | Path) -> Any:
    """The stored desired-state document, or None when none was ever saved."""
    return _read_json(Path(state_dir) / _DESIRED, "the stored desired state")


# -- recovery -----------------------------------------------------------------------


def recover(
    fs: KernelFS,
    state_dir: str | Path,
    *,
    identify: Callable[[str], str | None] | None = None,
    lock_timeout: float = 0.0,
) -> RecoveryReport | None:
    """Undo a transaction a crash left open; None when there was none.

    The writes themselves live in the executor, the one module that writes
    tunables; this is the entry point a starting agent calls.
    """
    from stortune.agent import executor  # executor imports this module

    return executor.recover(fs, state_dir, identify=identify, lock_timeout=lock_timeout)


# -- transactions -------------------------------------------------------------------


class Transaction:
    """An open journal file; every record is on disk before the method returns."""

    def __init__(self, path: Path, txid: str, next_seq: int = 0) -> None:
        self.path = path
        self.txid = txid
        self._seq = next_seq
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)

    def _append(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":")) + "\n"
        # One write(2) per record: a crash tears at most this last line.
        with _writing(self.path):
            os.write(self._fd, line.encode())
            os.fsync(self._fd)

    def intent(
        self,
        *,
        device: str,
        device_id: str,
        tunable: str,
        before_raw: str,
        before_value: Value,
        after: Value | None,
        cause: str | None = None,
    ) -> Intent:
        intent = Intent(
            seq=self._seq,
            device=device,
            device_id=device_id,
            tunable=tunable,
            before_raw=before_raw,
            before_value=before_value,
            after=after,
            cause=cause,
        )
        self._seq += 1
        self._append({"type": "intent", **intent.model_dump(mode="json")})
        return intent

    def done(self, intent: Intent, observed: Value | None) -> None:
        self._append({"type": "done", "seq": intent.seq, "observed": observed})

    def end(self, outcome: Outcome, **info: Any) -> None:
        """The terminal record: from here on recovery only archives the file."""
        self._append({"type": outcome, "time": time.time(), **info})

    def close(self) -> None:
        """Archive the journal file (call after ``end``)."""
        os.close(self._fd)
        archive(self.path)

    def abandon(self) -> None:
        """Close without archiving: the transaction stays pending for recovery."""
        os.close(self._fd)


def begin(state_dir: str | Path, what: str, *, boot_id: str | None = None) -> Transaction:
    jdir = _ensure_dir(Path(state_dir) / _JOURNAL)
    txid = uuid.uuid4().hex[:16]
    # The time prefix sorts journal files oldest first.
    path = jdir / f"{time.time_ns():020d}-{txid}.jsonl"
    with _writing(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        os.close(fd)
        _fsync_dir(jdir)
    tx = Transaction(path, txid)
    tx._append(
        {
            "type": "begin",
            "txid": txid,
            "time": time.time(),
            "pid": os.getpid(),
            "what": what,
            "boot_id": boot_id,
        }
    )
    return tx


@dataclass
class Pending:
    """A journal file still in journal/: unfinished, or finished but not yet archived."""

    path: Path
    txid: str | None = None
    what: str | None = None
    started: float | None = None
    pid: int | None = None
    boot_id: str | None = None
    intents: list[Intent] = field(default_factory=list)
    done: dict[int, Value | None] = field(default_factory=dict)
    outcome: str | None = None
    damaged: list[int] = field(default_factory=list)  # line numbers that did not parse

    def resume(self) -> Transaction:
        """Reopen for appending the terminal record."""
        txid = self.txid or self.path.stem.rsplit("-", 1)[-1]
        return Transaction(self.path, txid, next_seq=len(self.intents))


def _parse(path: Path) -> Pending:
    pending = Pending(path=path)
    lines = path.read_bytes().split(b"\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            kind = record["type"]
            if kind == "begin":
                pending.txid = record.get("txid")
                pending.what = record.get("what")
                pending.started = record.get("time")
                pending.pid = record.get("pid")
                pending.boot_id = record.get("boot_id")
            elif kind == "intent":
                pending.intents.append(
                    Intent.model_validate({k: v for k, v in record.items() if k != "type"})
                )
            elif kind == "done":
                pending.done[int(record["seq"])] = record.get("observed")
            else:
                pending.outcome = str(kind)
        except (ValueError, KeyError, TypeError):
            # A torn last line is the expected trace of a crash mid-append; the
            # write it announced never started, so skipping it loses nothing.
            pending.damaged.append(number)
    return pending


def pending(state_dir: str | Path) -> list[Pending]:
    """Journal files left in journal/, oldest first."""
    jdir = Path(state_dir) / _JOURNAL
    if not jdir.is_dir():
        return []
    return [_parse(p) for p in sorted(jdir.glob("*.jsonl"))]


def archive(path: Path) -> None:
    """Move a finished journal into journal/done/, keeping the newest few."""
    done = _ensure_dir(path.parent / _DONE)
    os.replace(path, done / path.name)
    _fsync_dir(path.parent)
    for old in sorted(done.glob("*.jsonl"))[:-_KEEP_DONE]:
        with contextlib.suppress(OSError):
            old.unlink()
