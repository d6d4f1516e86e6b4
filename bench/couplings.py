"""Which queue attributes the kernel changes when one tunable is written: the evidence
behind the catalog's ``resets``.

    sudo .venv/bin/python bench/couplings.py [--json] [--check]

Every experiment runs on a fresh loop device (made for it and removed after; a
reused one keeps what earlier users set, and wbt_lat_usec's hidden "default"
state cannot be brought back by any write). It sets a base state, reads every
attribute under queue/ (iosched/ included), writes one tunable, reads them all
again and records what changed besides the written attribute.

Writes: the scheduler from each offered elevator to each, and every other
writable catalog tunable of a loop queue, on each offered elevator. Base states:

  fresh  the kernel's defaults (only the starting elevator written)
  low    every catalog tunable at a low value that is not its default
  high   every catalog tunable at a high value that is not its default

A reset to a default shows from either side; "raised to at least" only from
below, "capped to at most" only from above. ``--check`` exits 1 when a catalog
tunable changed as a side effect that the writer's ``resets`` does not declare.
A declared coupling this kernel never showed is only listed: ``resets`` says what
a write may reset on some kernel, and the executor keeps the saved value of a
side effect only when the write really changed it.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.loopdev is not an installed package

from stortune.schemas import catalog  # noqa: E402
from stortune.schemas.topology import DeviceKind  # noqa: E402
from tests.loopdev import fresh_loop, queue_attributes  # noqa: E402

#: Catalog tunables a loop queue has (queue_depth is SCSI's; md and host ones are elsewhere).
WRITERS = tuple(t.name for t in catalog.for_kind(DeviceKind.LOOP) if t.path.startswith("queue/"))
BASES = ("fresh", "low", "high")


def marks(name: str, elevator: str, hw_max_kb: int) -> tuple[int, int]:
    """(low, high) values of a catalog tunable, neither of them its default on a loop queue."""
    if name == "nr_requests":
        # Without an elevator the queue holds at most its tag depth (128 for loop).
        return 4, 120 if elevator == "none" else 1000
    return {
        "max_sectors_kb": (8, hw_max_kb - 256),
        "read_ahead_kb": (4, 16384),
        "rq_affinity": (0, 2),
        "nomerges": (2, 1),
        "add_random": (1, 1),
        "iostats": (0, 0),
        "wbt_lat_usec": (1, 900_000),
    }[name]


def _default_opposite(name: str) -> int:
    # For the two on/off attributes both marks are the non-default value; writing goes back.
    return {"add_random": 0, "iostats": 1}[name]


@dataclass
class Experiment:
    write: str  # the tunable written
    before: str  # its value before
    after: str  # the value written
    base: str  # fresh | low | high
    elevator: str  # the elevator during the write (the starting one for scheduler switches)
    changed: dict[str, tuple[str, str]] = field(default_factory=dict)  # attribute -> (before, after)
    base_refused: list[str] = field(default_factory=list)  # marks the kernel did not take
    readback: str = ""  # the written attribute as read afterwards


def _queue(dev: str) -> Path:
    return Path("/sys/block") / dev / "queue"


def _write(dev: str, attr: str, value: object) -> bool:
    try:
        (_queue(dev) / attr).write_text(str(value))
        return True
    except OSError:
        return False


def set_base(dev: str, base: str, elevator: str, hw_max_kb: int) -> list[str]:
    """Put the queue in the base state, in catalog order (read_ahead_kb last); the marks refused."""
    refused: list[str] = []
    if elevator != "none" and not _write(dev, "scheduler", elevator):
        refused.append(f"scheduler={elevator}")
    if base == "fresh":
        return refused
    for name in WRITERS:
        if name == "scheduler":
            continue
        low, high = marks(name, elevator, hw_max_kb)
        value = low if base == "low" else high
        attr = catalog.get(name).path.removeprefix("queue/")
        if not _write(dev, attr, value) or (_queue(dev) / attr).read_text().strip() != str(value):
            refused.append(f"{name}={value}")
    return refused


def _diff(before: Mapping[str, str], after: Mapping[str, str], written: str) -> dict[str, tuple[str, str]]:
    changed: dict[str, tuple[str, str]] = {}
    for key in sorted({*before, *after} - {written}):
        old, new = before.get(key, "(absent)"), after.get(key, "(absent)")
        if old != new:
            changed[key] = (old, new)
    return changed


def run_one(work: Path, write: str, base: str, elevator: str, target: str | None = None) -> Experiment:
    with fresh_loop(work) as dev:
        hw_max_kb = int((_queue(dev) / "max_hw_sectors_kb").read_text())
        refused = set_base(dev, base, elevator, hw_max_kb)
        attr = catalog.get(write).path.removeprefix("queue/")
        before = queue_attributes(dev)
        if write == "scheduler":
            assert target is not None
            value: object = target
        else:
            low, high = marks(write, elevator, hw_max_kb)
            value = {"fresh": low, "low": high, "high": low}[base]
            if str(value) == before[attr]:
                value = _default_opposite(write)
        _write(dev, attr, value)
        after = queue_attributes(dev)
        return Experiment(write, before[attr], str(value), base, elevator,
                          _diff(before, after, attr), refused, after[attr])


def experiments(work: Path, offered: list[str]) -> Iterator[Experiment]:
    for base in BASES:
        for start in offered:
            for target in offered:
                yield run_one(work, "scheduler", base, start, target)
    for write in WRITERS:
        if write == "scheduler":
            continue
        for base in BASES:
            for elevator in offered:
                yield run_one(work, write, base, elevator)


def _catalog_changes(exp: Experiment) -> set[str]:
    paths = {t.path.removeprefix("queue/"): t.name for t in catalog.CATALOG.values()}
    return {paths[a] for a in exp.changed if a in paths}


def _show(exp: Experiment) -> str:
    parts: list[str] = []
    iosched = [a for a in exp.changed if a.startswith("iosched/")]
    if exp.write == "scheduler" and iosched:
        parts.append("iosched/* replaced")  # the elevator's own attributes come and go with it
        shown = [a for a in exp.changed if not a.startswith("iosched/")]
    else:
        shown = list(exp.changed)
    parts[:0] = [f"{a} {exp.changed[a][0]}->{exp.changed[a][1]}" for a in shown]
    return ", ".join(parts) or "-"


def report(exps: list[Experiment], offered: list[str]) -> tuple[str, bool]:
    lines = [f"kernel {platform.release()}; loop device queues, fresh per experiment; offered: "
             f"{' '.join(offered)}", ""]
    rows = [("WRITE", "BASE", "ELEVATOR", "CHANGED BESIDES THE WRITTEN ATTRIBUTE")]
    for e in exps:
        what = f"{e.write} {e.before}->{e.after}"
        if e.readback != e.after:
            what += f" (reads {e.readback})"
        rows.append((what, e.base, e.elevator if e.write != "scheduler" else "-", _show(e)))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines += [f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}" for r in rows]
    refused = sorted({m for e in exps for m in e.base_refused})
    if refused:
        lines += ["", "base marks the kernel refused (those experiments start elsewhere): "
                  + ", ".join(refused)]
    lines += ["", "catalog tunables changed as a side effect, per writer, against the catalog's resets:"]
    ok = True
    for write in WRITERS:
        seen: set[str] = set()
        for e in exps:
            if e.write == write:
                seen |= _catalog_changes(e)
        declared = set(catalog.get(write).resets)
        missing, unseen = seen - declared, declared - seen
        ok = ok and not missing
        verdict = "ok" if not (missing or unseen) else (
            f"NOT DECLARED: {', '.join(sorted(missing))}" if missing else "") + (
            f" (declared, not seen here: {', '.join(sorted(unseen))})" if unseen else "")
        lines.append(f"  {write:<15} changes {', '.join(sorted(seen)) or '-':<30} declared "
                     f"{', '.join(sorted(declared)) or '-':<30} {verdict.strip()}")
    return "\n".join(lines), ok


def measure() -> tuple[list[Experiment], list[str]]:
    """Every experiment, on fresh loop devices in a temporary directory; and the offered elevators."""
    with tempfile.TemporaryDirectory(prefix="stortune-couplings-") as tmp:
        work = Path(tmp)
        with fresh_loop(work) as dev:
            offered = (_queue(dev) / "scheduler").read_text().replace("[", "").replace("]", "").split()
        return list(experiments(work, offered)), offered


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--json", action="store_true", help="every experiment as JSON")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when the catalog's resets differ from what was measured")
    args = parser.parse_args(argv)
    exps, offered = measure()
    text, ok = report(exps, offered)
    if args.json:
        print(json.dumps([asdict(e) for e in exps], indent=1))
    else:
        print(text)
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
