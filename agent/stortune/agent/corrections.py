"""The corrections the agent's own re-apply made, kept until the control plane recorded them.

A correction is a setting stortune had applied (the journal holds its original) that the
re-apply found with another value and wrote back (``found``). A first apply to a device
stortune never tuned is none. Each is stored at once in ``corrections.json`` in the state
directory, so one made while the control plane is away (at start, after a reboot) is not
lost, and sent with the heartbeats (``registration.Registrar``) until the control plane
answers that it recorded it: then it is dropped (``acknowledge``).

The file also keeps the boot id of the agent's last start: a value found changed at a start
under another boot id was reset by the reboot. Its ``epoch`` (made with the file) names the
sequence, so a control plane can tell a new state directory's first correction from one it
has seen.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stortune.agent import journal
from stortune.schemas import planner
from stortune.schemas.corrections import MAX_BATCH, Cause, Correction, CorrectionBatch, Trigger
from stortune.schemas.plan import Desired
from stortune.schemas.topology import Topology

_FILE = "corrections.json"
#: Kept at most; the oldest give way (the control plane says how many it never saw).
MAX_PENDING = 1024

_LOCK = threading.Lock()  # the device loop adds, the registration thread acknowledges


class _Store(BaseModel):
    model_config = ConfigDict(extra="forbid")

    epoch: str = Field(default_factory=lambda: secrets.token_hex(8))
    boot_id: str | None = None
    next: int = 1
    pending: list[Correction] = Field(default_factory=list)


def _load(state_dir: Path) -> _Store:
    raw = journal._read_json(state_dir / _FILE, "the agent's corrections")
    if raw is None:
        return _Store()
    try:
        return _Store.model_validate(raw)
    except ValidationError as exc:
        raise journal.StateCorruptError(
            f"{state_dir / _FILE}: not a corrections file ({exc.error_count()} problem(s));"
            " move it aside: its unreported corrections are lost, nothing else") from None


def _save(state_dir: Path, store: _Store) -> None:
    journal.atomic_write(state_dir / _FILE, store.model_dump_json().encode())


def drifted(topology: Topology, desired: Iterable[Desired]) -> list[Desired]:
    """The settings stortune set itself (a direct original is recorded) that do not hold their
    value now: what a re-apply would set back. Planned on ``topology`` as discovered with the
    originals (``local.plan`` with the state directory)."""
    originals = {(d.id, name): state.original for d in planner.targets(topology)
                 for name, state in d.tunables.items()}
    out = []
    for want in desired:
        original = originals.get((want.device_id, want.tunable))
        if not want.in_sync and want.source.mode == "enforce" and original is not None and original.direct:
            out.append(want)
    return out


def start(state_dir: Path, boot_id: str) -> Cause:
    """At the agent's start: why values found changed now had changed (a reboot when the boot id
    is not the last start's), and the boot id kept for the next start."""
    with _LOCK:
        store = _load(state_dir)
        cause: Cause = "reboot" if store.boot_id and boot_id and store.boot_id != boot_id else "runtime"
        if store.boot_id != boot_id:
            store.boot_id = boot_id
            _save(state_dir, store)
    return cause


def add(state_dir: Path, corrected: Sequence[Desired], cause: Cause, trigger: Trigger) -> list[Correction]:
    """Keep ``corrected`` (each found at ``observed``, set back to ``desired``); -> as stored."""
    if not corrected:
        return []
    with _LOCK:
        store = _load(state_dir)
        made = [Correction(seq=store.next + i, device=w.device, device_id=w.device_id, tunable=w.tunable,
                           found=w.observed, set_to=w.desired, profile=w.source.profile,
                           rule=w.source.rule, cause=cause, trigger=trigger)
                for i, w in enumerate(corrected)]
        store.next += len(made)
        store.pending = [*store.pending, *made][-MAX_PENDING:]
        _save(state_dir, store)
    return made


def batch(state_dir: Path) -> CorrectionBatch | None:
    """The oldest corrections not yet recorded by the control plane (at most ``MAX_BATCH``)."""
    with _LOCK:
        store = _load(state_dir)
    if not store.pending:
        return None
    return CorrectionBatch(epoch=store.epoch, items=store.pending[:MAX_BATCH])


def acknowledge(state_dir: Path, epoch: str, recorded: int) -> None:
    """The control plane recorded this epoch's corrections up to seq ``recorded``: drop them."""
    with _LOCK:
        store = _load(state_dir)
        if store.epoch != epoch:
            return
        keep = [c for c in store.pending if c.seq > recorded]
        if len(keep) != len(store.pending):
            store.pending = keep
            _save(state_dir, store)
