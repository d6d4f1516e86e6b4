"""The one engine that writes tunables: apply a plan, restore originals, recover.

Every write follows the same steps, so that a failure or a crash at any point
leaves the host either as it was or as planned, never in between:

1. the value the tunable had before stortune first touched it is stored
   (``journal.record_original``; never replaced once stored);
2. an intent naming the value before this write is journaled and fsynced;
3. the value is written through ``KernelFS`` (a controller tunable through the vendor tool
   of ``KernelFS.controllers``) and read back;
4. a "done" record is journaled.

A failed write or read-back rolls back every change of the same apply, which
then runs again without that setting (and what depends on it): an error on it
alone, remembered by ``refusals`` when the kernel refuses the value for good.
After the last write one more pass re-reads everything, because a later write
can reset an earlier one (switching the scheduler resets nr_requests). A crash
leaves the journal without its terminal record: ``recover`` then puts back
every journaled "before" value, and apply/restore run it first anyway.

Values are always put back in catalog order (scheduler before nr_requests),
whatever order they were written in.
"""

from __future__ import annotations

import contextlib
import errno
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from stortune.agent import journal, refusals
from stortune.agent.journal import Intent, Original, Transaction
from stortune.agent.kernelfs import (
    KernelFS,
    KernelWriteError,
    UnsafePathError,
    check_device_name,
)
from stortune.agent.tunables import read_state
from stortune.schemas import catalog
from stortune.schemas.catalog import Tunable, TunableValueError
from stortune.schemas.plan import Change, Plan, Rejection
from stortune.schemas.topology import HOST_TARGET, TunableState

Value = int | str
#: Kernel name -> stable device id (discovery's), or None when it cannot tell.
Identify = Callable[[str], str | None]


Status = Literal[
    "applied",  # written and verified
    "unchanged",  # already had the desired value: nothing written
    "skipped",  # device could not be identified: never touched
    "failed",  # the write, its read-back or the final verification failed
    "not-attempted",  # the apply stopped at an earlier failure
    "rolled-back",  # was applied, then put back because another change failed
    "rollback-failed",  # was applied, and putting it back failed too
    "restored",  # (restore, rollback, recovery) the earlier value is in place
    "vanished",  # (restore, recovery) the device is gone: reported, not an error
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ChangeResult(_Model):
    device: str
    device_id: str
    tunable: str
    before: Value | None = Field(default=None, description="Read just before writing")
    desired: Value | None = Field(default=None, description="Written: the plan's value, or the one put back")
    after: Value | None = Field(default=None, description="Read back at the end")
    status: Status
    message: str = ""


class RecoveryReport(_Model):
    ok: bool = True
    transactions: list[str] = Field(default_factory=list, description="Journals found")
    results: list[ChangeResult] = Field(default_factory=list)
    messages: list[str] = Field(default_factory=list)

    def summary(self) -> str:
        """One line per finding, for logs and the CLI."""
        head = f"recovered {len(self.transactions)} interrupted transaction(s)" + (
            "" if self.ok else " (with failures)"
        )
        return "\n".join([head, *self.messages])


class ApplyReport(_Model):
    ok: bool
    txid: str | None = None
    results: list[ChangeResult] = Field(default_factory=list, description="In plan order")
    rejections: list[Rejection] = Field(
        default_factory=list,
        description="Errors of the plan: settings it could not include, not written (the rest is)",
    )
    messages: list[str] = Field(default_factory=list)
    recovery: RecoveryReport | None = Field(
        default=None, description="An interrupted transaction undone before this apply"
    )


class RestoreReport(_Model):
    ok: bool
    txid: str | None = None
    results: list[ChangeResult] = Field(default_factory=list)
    messages: list[str] = Field(default_factory=list)
    recovery: RecoveryReport | None = None


# -- targets and identity ---------------------------------------------------------


@dataclass(frozen=True)
class _Target:
    tunable: Tunable
    device: str
    device_id: str

    @property
    def dev(self) -> str | None:
        return None if self.tunable.scope == "host" else self.device

    @property
    def key(self) -> tuple[str, str]:
        return (self.device_id, self.tunable.name)

    def sort_key(self) -> tuple[int, str, str]:
        return (self.tunable.order, self.tunable.name, self.device)

    def result(
        self, status: Status, *, before: Value | None = None, desired: Value | None = None
    ) -> ChangeResult:
        return ChangeResult(
            device=self.device,
            device_id=self.device_id,
            tunable=self.tunable.name,
            before=before,
            desired=desired,
            status=status,
        )


class _Identity:
    """Is this kernel name still the device the value belongs to? Asked once per device."""

    def __init__(self, fs: KernelFS, identify: Identify | None) -> None:
        self._fs = fs
        self._identify = identify
        self._seen: dict[tuple[str, str], str | None] = {}

    def problem(self, device: str, device_id: str) -> str | None:
        """None when safe to write, else why not."""
        if device == HOST_TARGET:
            return None
        key = (device, device_id)
        if key not in self._seen:
            self._seen[key] = self._check(device, device_id)
        return self._seen[key]

    def _check(self, device: str, device_id: str) -> str | None:
        try:
            path = self._fs.block_dir(device)
        except UnsafePathError as exc:
            return str(exc)
        if not path.exists():
            return f"{device} does not exist any more"
        if self._identify is None:
            return None
        try:
            found = self._identify(device)
        except Exception as exc:
            return f"cannot identify {device}: {exc}"
        if found is None:
            return f"cannot identify {device}"
        if found != device_id:
            return f"{device} is now {found}, not {device_id}: renamed or replaced"
        return None


def _resolve(changes: Iterable[Change]) -> tuple[list[_Target], list[str]]:
    """Catalog lookups and static checks for the whole plan, before any write."""
    targets: list[_Target] = []
    problems: list[str] = []
    seen: set[tuple[str, str]] = set()
    for c in changes:
        where = f"{c.device} {c.tunable}"
        try:
            tunable = catalog.get(c.tunable)
            tunable.validate(c.desired)
        except KeyError as exc:
            problems.append(f"{where}: {exc.args[0]}")
            continue
        except TunableValueError as exc:
            problems.append(f"{where}: {c.desired!r} {exc}")
            continue
        if tunable.scope == "host" and c.device != HOST_TARGET:
            problems.append(f"{where}: a host-wide tunable must target {HOST_TARGET!r}")
        elif tunable.scope in ("device", "controller"):
            try:
                check_device_name(c.device)
            except UnsafePathError as exc:
                problems.append(f"{where}: {exc}")
        if (c.device_id, c.tunable) in seen:
            problems.append(f"{where}: listed twice in the plan")
        seen.add((c.device_id, c.tunable))
        targets.append(_Target(tunable, c.device, c.device_id))
    return targets, problems


# -- reading and writing -------------------------------------------------------------


def _state(fs: KernelFS, target: _Target) -> TunableState:
    if target.tunable.scope == "controller":
        if fs.controllers is None:
            return TunableState(supported=False, reason="no RAID controller tools configured")
        return fs.controllers.read(fs, target.tunable, target.device)
    try:
        return read_state(fs, target.tunable, target.dev)
    except UnsafePathError as exc:
        return TunableState(supported=False, reason=str(exc))


def _observe(fs: KernelFS, target: _Target) -> Value | None:
    return _state(fs, target).value


def _unreadable(state: TunableState) -> str:
    return f"cannot read it: {state.reason or 'no value'}"


#: Write errors that say the value itself is refused (not a busy or failing device): the same
#: write fails again until the value or the device changes, so the refusal is remembered.
_LASTING = frozenset({errno.EINVAL, errno.ERANGE, errno.EOPNOTSUPP})


@dataclass(frozen=True)
class _Written:
    observed: Value | None
    #: None when the value read back is the one written, else why not.
    problem: str | None = None
    #: The kernel refuses this value for good (``_LASTING``, or it keeps another value).
    lasting: bool = False


def _write(fs: KernelFS, target: _Target, value: Value) -> _Written:
    """Write and read back."""
    if target.tunable.scope == "controller":
        return _write_controller(fs, target, value)
    try:
        fs.write_tunable(target.tunable, target.dev, target.tunable.format(value))
    except KernelWriteError as exc:
        code = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        return _Written(_observe(fs, target), f"write failed: {exc.strerror} ({code})",
                        lasting=exc.errno in _LASTING)
    except UnsafePathError as exc:
        return _Written(None, f"write refused: {exc}")
    observed = _observe(fs, target)
    if not target.tunable.same(observed, value):
        return _Written(observed, f"read back {observed!r}, expected {value!r}", lasting=True)
    return _Written(observed)


def _write_controller(fs: KernelFS, target: _Target, value: Value) -> _Written:
    # A vendor tool's failure says nothing lasting about the value: never remembered.
    from stortune.agent.controllers.access import ControllerWriteError

    if fs.controllers is None:
        return _Written(None, "write refused: no RAID controller tools configured")
    try:
        fs.controllers.write(fs, target.tunable, target.device, target.tunable.format(value))
    except ControllerWriteError as exc:
        return _Written(_observe(fs, target), f"write failed: {exc}")
    observed = _observe(fs, target)
    if not target.tunable.same(observed, value):
        return _Written(observed, f"read back {observed!r}, expected {value!r}")
    return _Written(observed)


def _record_original(
    state_dir: Path, tx: Transaction, target: _Target, state: TunableState, cause: str | None = None
) -> None:
    """Save the value from before stortune's first write; ``cause``: saved because writing
    that tunable may reset this one (a side effect, not a setting of its own)."""
    assert state.raw is not None and state.value is not None
    journal.record_original(
        state_dir,
        Original(
            device_id=target.device_id,
            device=target.device,
            tunable=target.tunable.name,
            raw=state.raw,
            value=state.value,
            recorded_at=time.time(),
            txid=tx.txid,
            direct=cause is None,
            cause=cause,
        ),
    )


def _journal_intent(
    tx: Transaction, target: _Target, state: TunableState, after: Value | None, cause: str | None
) -> Intent:
    assert state.raw is not None and state.value is not None
    return tx.intent(
        device=target.device,
        device_id=target.device_id,
        tunable=target.tunable.name,
        before_raw=state.raw,
        before_value=state.value,
        after=after,
        cause=cause,
    )


@dataclass(frozen=True)
class _PutBack:
    target: _Target
    value: Value


def _put_back(
    fs: KernelFS,
    items: Iterable[_PutBack],
    identity: _Identity,
    tx: Transaction | None = None,
) -> list[ChangeResult]:
    """Write earlier values back in catalog order and verify them (rollback, recovery, restore).

    Values already in place are not written again, so repeating a recovery
    or a restore after a crash writes only what is still missing.
    """
    ordered = sorted(items, key=lambda i: i.target.sort_key())
    results: list[ChangeResult] = []
    for item in ordered:
        t = item.target
        res = t.result("restored", desired=item.value)
        results.append(res)
        if (why := identity.problem(t.device, t.device_id)) is not None:
            res.status, res.message = "vanished", why
            continue
        state = _state(fs, t)
        if not state.supported or state.value is None or state.raw is None:
            res.status, res.message = "failed", _unreadable(state)
            continue
        res.before = res.after = state.value
        if state.value == item.value:
            continue
        intent = _journal_intent(tx, t, state, item.value, None) if tx else None
        written = _write(fs, t, item.value)
        res.after = written.observed
        if written.problem is not None:
            res.status, res.message = "failed", written.problem
            continue
        if tx and intent:
            tx.done(intent, res.after)
    for item, res in zip(ordered, results, strict=True):
        if res.status == "restored":
            res.after = _observe(fs, item.target)
            if not item.target.tunable.same(res.after, item.value):
                res.status = "failed"
                res.message = f"read back {res.after!r} after all writes, expected {item.value!r}"
    return results


def _first_befores(intents: Iterable[Intent]) -> tuple[list[_PutBack], list[str]]:
    """The oldest 'before' per (device_id, tunable): the value from before the transaction.

    Also returns messages for tunables this version no longer knows (a journal
    left by an older agent), which cannot be put back.
    """
    first: dict[tuple[str, str], Intent] = {}
    for i in intents:
        first.setdefault((i.device_id, i.tunable), i)
    items: list[_PutBack] = []
    unknown: list[str] = []
    for i in first.values():
        if i.tunable not in catalog.CATALOG:
            unknown.append(f"{i.device} {i.tunable}: unknown tunable, cannot put back {i.before_raw!r}")
            continue
        items.append(_PutBack(_Target(catalog.get(i.tunable), i.device, i.device_id), i.before_value))
    return items, unknown


# -- apply --------------------------------------------------------------------------


def apply(
    fs: KernelFS,
    plan: Plan,
    state_dir: str | Path,
    *,
    identify: Identify | None = None,
    lock_timeout: float = 0.0,
) -> ApplyReport:
    """Make the kernel match ``plan``'s changes: all of them, or (after a failure) none.

    The plan's errors (fatal rejections) are settings it holds no change for: they
    are reported (``rejections``), and block nothing else. A change whose write or
    read-back fails rolls the whole transaction back; when that rollback put every
    value back, the transaction runs again without that change and those depending
    on it, which become errors too (at most ``_RETRIES`` times), and a lasting refusal
    is remembered (``refusals``). ``ok`` says whether the changes left were made.
    ``identify`` maps a kernel name to the stable device id (discovery's); when given,
    a change whose device now has another id is skipped, never written.
    """
    targets, problems = _resolve(plan.changes)
    if problems:
        return ApplyReport(ok=False, messages=[*problems, "refused: invalid plan, nothing was written"])
    errors = [_error(r) for r in plan.fatal]
    sdir = Path(state_dir)
    with journal.lock(sdir, timeout=lock_timeout):
        identity = _Identity(fs, identify)
        recovery = _recover_locked(fs, sdir, identity)
        report = ApplyReport(ok=True, recovery=recovery if recovery.transactions else None,
                             rejections=plan.fatal, messages=errors)
        refusals.forget_unwanted(sdir, plan)
        changes = list(plan.changes)
        for attempt in range(_RETRIES + 1):
            if not targets:  # (after a failure: the rollback left nothing applied)
                report.ok, report.results = True, []
                report.messages.append("nothing to change")
                break
            run = _ApplyRun(fs, sdir, identity, report)
            run.run(changes, targets)
            if run.refused is not None:  # also at the last attempt: the next apply plans it as an error
                refusals.remember(sdir, [run.refused])
            if report.ok or run.refused_write is None or not run.clean or attempt == _RETRIES:
                break
            changes, targets = _without(run.refused_write, changes, targets, report,
                                        lasting=run.refused is not None)
        return report


def _error(r: Rejection) -> str:
    return (f"error: {r.source.profile}/{r.source.rule}: {r.device} {r.tunable}={r.value!r} not set:"
            f" {r.reason}")


#: Transactions run again after a failed one, each without the change that failed (and its
#: dependants): a bound on the writes and rollbacks one apply makes whatever the kernel does.
_RETRIES = 3


def _without(failure: ChangeResult, changes: list[Change], targets: list[_Target],
             report: ApplyReport, *, lasting: bool) -> tuple[list[Change], list[_Target]]:
    """The plan without ``failure``'s change and those depending on it on the same device; each
    is added to ``report``'s errors, as the planner would have if it had known."""
    index = next(i for i, t in enumerate(targets) if t.key == (failure.device_id, failure.tunable))
    failed = changes[index]
    reason = refusals.refused_reason(failed.tunable, failure.message, lasting=lasting)
    blocked = refusals.dependants(failed.tunable)
    keep: list[int] = []
    for i, (c, t) in enumerate(zip(changes, targets, strict=True)):
        if i != index and not (t.device_id == failure.device_id and c.tunable in blocked):
            keep.append(i)
            continue
        why = reason if i == index else refusals.blocked_reason(c.tunable, failed.tunable, reason)
        error = Rejection(device=c.device, device_id=c.device_id, tunable=c.tunable, value=c.desired,
                          reason=why, fatal=True, source=c.source)
        report.rejections.append(error)
        report.messages.append(_error(error))
    report.messages.append(f"applying the other {len(keep)} change(s) without {failed.device}"
                           f" {failed.tunable}")
    return [changes[i] for i in keep], [targets[i] for i in keep]


@dataclass
class _ApplyRun:
    """One apply transaction, under the lock; fills ``report`` in place."""

    fs: KernelFS
    state_dir: Path
    identity: _Identity
    report: ApplyReport
    intents: list[Intent] = field(default_factory=list)
    #: (side effect's key, the tunable whose write reset it, the value that write left)
    causes: list[tuple[tuple[str, str], str, Value]] = field(default_factory=list)
    #: The change whose own write or read-back failed, if one did (a failure of the final pass
    #: is not blamed on one change: which later write reset it?); ``clean``: the rollback then
    #: put every value back.
    refused_write: ChangeResult | None = None
    clean: bool = True
    #: A lasting refusal of the failed write (``refusals``).
    refused: refusals.Refusal | None = None
    boot: str | None = None

    def run(self, changes: list[Change], targets: list[_Target]) -> None:
        self.boot = refusals.boot_id(self.fs)
        tx = journal.begin(self.state_dir, f"apply {len(targets)} change(s)", boot_id=self.boot)
        self.report.txid = tx.txid
        results = [
            t.result("not-attempted", before=c.current, desired=c.desired)
            for c, t in zip(changes, targets, strict=True)
        ]
        self.report.results = results
        try:
            failure: ChangeResult | None = None
            for change, target, res in zip(changes, targets, results, strict=True):
                if (why := self.identity.problem(target.device, target.device_id)) is not None:
                    res.status, res.message = "skipped", f"not changed: {why}"
                    self.report.messages.append(f"{res.device} {res.tunable}: {res.message}")
                    continue
                if not self._one(tx, target, change.desired, res):
                    failure = self.refused_write = res
                    break
            else:
                failure = self._verify_all(changes, targets, results)
            if failure is None:
                tx.end("commit")
                # After the commit record: what a rolled-back write left is no value to go back to.
                journal.note_causes(self.state_dir, self.causes)
            else:
                self.clean = self._roll_back(results, failure)
                tx.end(
                    "rolled-back",
                    device=failure.device,
                    tunable=failure.tunable,
                    reason=failure.message,
                )
        except Exception:
            # The state dir failed under us (disk full?) or a bug: undo from the
            # journal right away, as a restart would, then surface the error.
            tx.abandon()
            with contextlib.suppress(Exception):
                _recover_locked(self.fs, self.state_dir, self.identity)
            raise
        tx.close()
        self.report.ok = all(r.status in ("applied", "unchanged") for r in results)

    def _one(self, tx: Transaction, target: _Target, desired: Value, res: ChangeResult) -> bool:
        state = _state(self.fs, target)
        if not state.supported or state.value is None or state.raw is None:
            res.status, res.message = "failed", _unreadable(state)
            return False
        res.before = res.after = state.value
        if state.value == desired:
            res.status = "unchanged"
            return True
        # What this write may reset as a kernel side effect is saved first, like the
        # target: restoring the target then restores them too, and a crash now is undone.
        sides: list[_Target] = []
        for name in target.tunable.resets:
            side = _Target(catalog.get(name), target.device, target.device_id)
            side_state = _state(self.fs, side)
            if side_state.supported and side_state.value is not None and side_state.raw:
                _record_original(self.state_dir, tx, side, side_state, cause=target.tunable.name)
                self.intents.append(_journal_intent(tx, side, side_state, None, target.tunable.name))
                sides.append(side)
        _record_original(self.state_dir, tx, target, state)
        intent = _journal_intent(tx, target, state, desired, None)
        self.intents.append(intent)
        written = _write(self.fs, target, desired)
        res.after = written.observed
        if written.problem is not None:
            res.status, res.message = "failed", written.problem
            if written.lasting:
                self.refused = self._refusal(target, desired, written.problem)
            return False
        tx.done(intent, res.after)
        for side in sides:
            if (left := _observe(self.fs, side)) is not None:
                self.causes.append((side.key, target.tunable.name, left))
        res.status = "applied"
        return True

    def _refusal(self, target: _Target, value: Value, why: str) -> refusals.Refusal:
        # The coupled values as this write found them, read before the rollback changes them.
        context = {n: _observe(self.fs, _Target(catalog.get(n), target.device, target.device_id))
                   for n in refusals.coupled(target.tunable.name)}
        return refusals.Refusal(boot_id=self.boot, device_id=target.device_id, device=target.device,
                                tunable=target.tunable.name, value=value, context=context, reason=why,
                                at=time.time())

    def _verify_all(
        self, changes: list[Change], targets: list[_Target], results: list[ChangeResult]
    ) -> ChangeResult | None:
        """Re-read every applied change: a later write may have reset an earlier one."""
        first: ChangeResult | None = None
        for change, target, res in zip(changes, targets, results, strict=True):
            if res.status != "applied":
                continue
            res.after = _observe(self.fs, target)
            if not target.tunable.same(res.after, change.desired):
                res.status = "failed"
                res.message = (
                    f"read back {res.after!r} after all writes, expected {change.desired!r}"
                    " (a later write reset it)"
                )
                first = first or res
        return first

    def _roll_back(self, results: list[ChangeResult], failure: ChangeResult) -> bool:
        """Put back what this transaction wrote; True when every value is back."""
        items, _ = _first_befores(self.intents)  # this process wrote them: all known
        put_back = _put_back(self.fs, items, self.identity)
        back = {(r.device_id, r.tunable): r for r in put_back}
        undone = 0
        for res in results:
            pb = back.get((res.device_id, res.tunable))
            if pb is None:
                continue
            res.after = pb.after
            if res.status == "applied":
                if pb.status == "restored":
                    res.status = "rolled-back"
                    undone += 1
                else:
                    res.status, res.message = "rollback-failed", pb.message
        messages = [
            f"{failure.device} {failure.tunable}: {failure.message};"
            f" rolled back the {undone} other change(s) this apply had made"
        ]
        # Including values reset as side effects, which are not in the plan.
        messages += [
            f"{pb.device} {pb.tunable}: could not put back {pb.desired!r}: {pb.message}"
            for pb in put_back
            if pb.status != "restored"
        ]
        self.report.messages[:0] = messages
        return all(pb.status in ("restored", "vanished") for pb in put_back)


# -- restore ---------------------------------------------------------------------------


def restore(
    fs: KernelFS,
    state_dir: str | Path,
    only: Collection[tuple[str, str]] | None = None,
    *,
    to_cause: Collection[tuple[str, str]] = (),
    identify: Identify | None = None,
    lock_timeout: float = 0.0,
) -> RestoreReport:
    """Put recorded originals back; ``only`` limits it to these (device_id, tunable) keys.

    Each original goes back on its own: one the kernel refuses is reported and
    kept, the others are still restored. An original is dropped from the store
    only once it reads back correctly.
    Restoring a tunable also restores what writing it resets (scheduler ->
    nr_requests), unless another tunable that resets it still holds a recorded
    original and stays. Originals of devices that are gone stay stored and are reported.

    ``to_cause``: settings removed while the write that resets them stays; each
    goes back to what that write left (``Original.cause_left``), and its
    original is kept, as a side effect only, for when that write is undone.
    """
    sdir = Path(state_dir)
    with journal.lock(sdir, timeout=lock_timeout):
        identity = _Identity(fs, identify)
        recovery = _recover_locked(fs, sdir, identity)
        report = RestoreReport(ok=True, recovery=recovery if recovery.transactions else None)
        records = journal.load_originals(sdir)
        wanted = None if only is None else _with_resets(only, records)
        chosen = [o for k, o in records.items() if wanted is None or k in wanted]
        back = [] if wanted is None else [
            o for k, o in records.items() if k in to_cause and k not in wanted
        ]
        if not chosen and not back:
            report.messages.append("no recorded originals to restore")
            return report
        items: list[_PutBack] = []
        for o, value in [*((o, o.value) for o in chosen),
                         *((o, o.value if o.cause_left is None else o.cause_left) for o in back)]:
            try:
                items.append(_PutBack(_Target(catalog.get(o.tunable), o.device, o.device_id), value))
            except KeyError as exc:
                report.results.append(
                    ChangeResult(
                        device=o.device,
                        device_id=o.device_id,
                        tunable=o.tunable,
                        desired=o.value,
                        status="failed",
                        message=exc.args[0],
                    )
                )
        tx = journal.begin(sdir, f"restore {len(items)} original(s)", boot_id=refusals.boot_id(fs))
        report.txid = tx.txid
        try:
            report.results.extend(_put_back(fs, items, identity, tx=tx))
            tx.end("commit")
        except Exception:
            tx.abandon()
            with contextlib.suppress(Exception):
                _recover_locked(fs, sdir, identity)
            raise
        # After the commit record: a crash here keeps originals that already
        # read back correctly, and the next restore simply finds them in place.
        done = {(r.device_id, r.tunable) for r in report.results if r.status == "restored"}
        kept = {o.key for o in back}
        journal.settle_originals(sdir, drop=done - kept, indirect=done & kept)
        tx.close()
        for r in report.results:
            if r.status == "vanished":
                report.messages.append(
                    f"{r.device} {r.tunable}: {r.message}; its original is kept for when it returns"
                )
            elif r.status != "restored":
                report.messages.append(
                    f"{r.device} {r.tunable}: could not restore {r.desired!r}: {r.message}"
                )
        report.ok = report.ok and all(r.status in ("restored", "vanished") for r in report.results)
        return report


def _with_resets(
    keys: Collection[tuple[str, str]], records: Mapping[tuple[str, str], Original]
) -> set[tuple[str, str]]:
    """``keys`` and the side effects restoring them resets, except those another
    tunable that resets them still holds (its original recorded, not restored now)."""
    out = set(keys)
    for device_id, tunable in keys:
        if tunable not in catalog.CATALOG:
            continue  # reported as unknown when restored
        for side in catalog.get(tunable).resets:
            held = any((device_id, other) in records and (device_id, other) not in keys
                       for other in catalog.reset_by(side) if other != tunable)
            if not held:
                out.add((device_id, side))
    return out


# -- recovery --------------------------------------------------------------------------


def recover(
    fs: KernelFS,
    state_dir: str | Path,
    *,
    identify: Identify | None = None,
    lock_timeout: float = 0.0,
) -> RecoveryReport | None:
    """Undo a transaction a crash interrupted; None when there was none.

    Idempotent: a crash during recovery leaves the journal in place, and the
    next run writes the same values (those already in place are skipped).
    """
    sdir = Path(state_dir)
    with journal.lock(sdir, timeout=lock_timeout):
        report = _recover_locked(fs, sdir, _Identity(fs, identify))
    return report if report.transactions else None


def _recover_locked(fs: KernelFS, state_dir: Path, identity: _Identity) -> RecoveryReport:
    report = RecoveryReport()
    boot = refusals.boot_id(fs)
    # Newest first: undoing in reverse order ends at the oldest "before" values.
    for p in reversed(journal.pending(state_dir)):
        txid = p.txid or p.path.name
        what = f"{txid} ({p.what or 'unknown operation'}, pid {p.pid})"
        report.transactions.append(txid)
        if p.damaged:
            report.messages.append(
                f"{txid}: ignored unreadable journal line(s) {p.damaged}"
                " (a torn last line is normal after a crash)"
            )
        if p.outcome is not None:
            journal.archive(p.path)
            report.messages.append(f"{what} had finished ({p.outcome}); archived its journal")
            continue
        tx = p.resume()
        items, unknown = _first_befores(p.intents)
        if p.boot_id and boot and p.boot_id != boot:
            # A reboot reset the kernel's values, not the RAID controllers': those are still
            # to be put back.
            items = [i for i in items if i.target.tunable.scope == "controller"]
            if not items:
                why = "the host rebooted since, which reset the kernel's values; nothing to undo"
                tx.end("abandoned", reason=why)
                tx.close()
                report.messages.append(f"{what} was interrupted; {why}")
                continue
        results = _put_back(fs, items, identity)
        ok = not unknown and all(r.status in ("restored", "vanished") for r in results)
        tx.end("recovered", ok=ok, results=[r.model_dump(mode="json") for r in results])
        tx.close()
        report.results.extend(results)
        report.ok = report.ok and ok
        report.messages.append(
            f"{what} was interrupted; put back the values from before it"
            f" ({sum(r.status == 'restored' for r in results)} of {len(results)} in place)"
        )
        report.messages.extend(unknown)
        for r in results:
            if r.status != "restored":
                report.messages.append(
                    f"{r.device} {r.tunable}: could not put back {r.desired!r}: {r.message}"
                )
    return report
