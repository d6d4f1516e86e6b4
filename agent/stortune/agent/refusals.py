"""Values the kernel refused when written, remembered so that a re-apply does not write them again.

Some refusals only a write finds: ``nr_requests`` above what a queue without a
scheduler takes (EINVAL), or a value the driver clamps (the read-back differs).
The executor then rolls its transaction back and applies the rest without that
setting; this store keeps the refusal so that the next plan holds it as an error
at once, instead of every re-apply writing it, failing and rolling back again.

A refusal holds for one boot, one device (stable id), one value, and the values
that the tunables coupled to it (those whose write resets it, those it depends
on) have when it is written: change any of them and the value is tried again.
An apply whose plan no longer wants that value forgets it.
Only lasting refusals are kept (EINVAL, ERANGE, EOPNOTSUPP, a read-back that
differs); a transient error is simply tried again at the next apply.

Kept in ``refused.json`` in the state directory (replaced atomically, written
under the state lock) so that the CLI, the daemon and the RPC service share it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from stortune.agent import journal
from stortune.agent.kernelfs import KernelFS
from stortune.schemas import catalog
from stortune.schemas.plan import KERNEL_REFUSED, Desired, Plan, Rejection
from stortune.schemas.topology import Topology

Value = int | str

_FILE = "refused.json"
#: A bound on the file: a host has a few hundred settings at most.
_KEEP = 512


class Refusal(BaseModel):
    model_config = ConfigDict(extra="forbid")

    boot_id: str | None
    device_id: str
    device: str
    tunable: str
    value: Value
    #: The coupled tunables' values (``coupled``) when the write was refused.
    context: dict[str, Value | None]
    reason: str
    at: float

    def rejection(self, want: Desired) -> Rejection:
        return Rejection(device=want.device, device_id=want.device_id, tunable=want.tunable,
                         value=want.desired, reason=refused_reason(self.tunable, self.reason),
                         fatal=True, source=want.source)


def boot_id(fs: KernelFS) -> str | None:
    raw = fs.read_proc("sys/kernel/random/boot_id")
    return raw.strip() if raw else None


def coupled(tunable: str) -> tuple[str, ...]:
    """The tunables of the same device whose value decides whether ``tunable``'s is taken:
    those whose write resets it and those it depends on (all earlier in catalog order)."""
    return tuple(sorted({*catalog.reset_by(tunable), *catalog.depends_on(tunable)}))


def dependants(tunable: str) -> set[str]:
    """The tunables that depend on ``tunable``, directly or through another one."""
    out: set[str] = set()
    todo = [tunable]
    while todo:
        name = todo.pop()
        for other in catalog.CATALOG:
            if name in catalog.depends_on(other) and other not in out:
                out.add(other)
                todo.append(other)
    return out


def refused_reason(tunable: str, why: str, *, lasting: bool = True) -> str:
    """The error a failed write is reported with, the same whether just written or remembered."""
    if not lasting:  # busy, I/O error...: nothing says the value itself is wrong
        return f"the write failed: {why}; tried again at the next apply"
    also = coupled(tunable)
    when = f", when {', '.join(also)} change{'s' if len(also) == 1 else ''}" if also else ""
    return (f"{KERNEL_REFUSED}{why}; choose a value this device takes (tried again when"
            f" its value or the device changes{when}, or after a reboot)")


def blocked_reason(name: str, dep: str, why: str) -> str:
    # As the planner words it for a value it knows the device refuses.
    return (f"{name} is blocked: it depends on {dep}, which cannot be set on this device ({why});"
            f" fix {dep} first")


def load(state_dir: Path) -> list[Refusal]:
    """The remembered refusals; a damaged file is only a lost memory (each value is tried again)."""
    try:
        raw = json.loads((state_dir / _FILE).read_text(encoding="utf-8"))
        return [Refusal.model_validate(r) for r in raw["refused"]]
    except (OSError, ValueError, KeyError, TypeError, ValidationError):
        return []


def remember(state_dir: Path, new: Sequence[Refusal]) -> None:
    """Add ``new``; refusals of another boot are dropped (a reboot resets what they were about).
    Call under the state lock."""
    if not new:
        return
    keys = {(r.device_id, r.tunable) for r in new}
    boot = new[0].boot_id
    kept = [r for r in load(state_dir) if r.boot_id == boot and (r.device_id, r.tunable) not in keys]
    _save(state_dir, [*kept, *new][-_KEEP:])


def _save(state_dir: Path, kept: Sequence[Refusal]) -> None:
    doc = {"refused": [r.model_dump(mode="json") for r in kept]}
    journal.atomic_write(state_dir / _FILE, json.dumps(doc, indent=1).encode())


def forget_unwanted(state_dir: Path, plan: Plan) -> None:
    """Forget the refusals of values ``plan`` no longer wants (its profiles changed): wanting
    the same value again later tries it again. Call under the state lock."""
    kept = load(state_dir)
    if not kept:
        return
    wanted = {(w.device_id, w.tunable): w.desired for w in plan.desired}
    wanted |= {(c.device_id, c.tunable): c.desired for c in plan.changes}
    wanted |= {(r.device_id, r.tunable): r.value for r in plan.fatal}
    still = [r for r in kept if wanted.get((r.device_id, r.tunable)) == r.value]
    if len(still) != len(kept):
        _save(state_dir, still)


def withhold(plan: Plan, topology: Topology, refused: Iterable[Refusal], boot: str | None) -> Plan:
    """``plan`` with each remembered refused value (and what depends on it) moved from its changes
    to its errors, when the value and its context are still those that were refused."""
    live = {(r.device_id, r.tunable): r for r in refused if r.boot_id == boot}
    if not live:
        return plan
    observed = {d.id: d.tunables for d in topology.devices}
    wanted = {(d.device_id, d.tunable): d.desired for d in plan.desired}

    def will_have(device_id: str, name: str) -> Value | None:
        # Coupled tunables come earlier in catalog order: an apply writes them first.
        if (device_id, name) in wanted:
            return wanted[device_id, name]
        state = observed.get(device_id, {}).get(name)
        return None if state is None else state.value

    errors: dict[tuple[str, str], Rejection] = {}
    for want in plan.desired:
        r = live.get((want.device_id, want.tunable))
        if (r is None or want.in_sync or r.value != want.desired
                or any(will_have(want.device_id, n) != v for n, v in r.context.items())):
            continue
        errors[want.device_id, want.tunable] = r.rejection(want)
    _block_dependants(plan.desired, errors)
    return plan.holding(errors.values())


def _block_dependants(desired: Sequence[Desired], errors: dict[tuple[str, str], Rejection]) -> None:
    by_key: Mapping[tuple[str, str], Desired] = {(d.device_id, d.tunable): d for d in desired}
    for (device_id, name), cause in list(errors.items()):
        for dep in sorted(dependants(name)):
            want = by_key.get((device_id, dep))
            if want is not None and (device_id, dep) not in errors:
                errors[device_id, dep] = Rejection(
                    device=want.device, device_id=device_id, tunable=dep, value=want.desired,
                    reason=blocked_reason(dep, name, cause.reason), fatal=True, source=want.source)
