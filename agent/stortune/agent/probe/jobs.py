"""The probe's fio job files, written here from fixed settings: read-only, direct,
time-bounded. Nothing a caller sends becomes a fio option."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from stortune.agent.probe.members import Member
from stortune.schemas.analysis.probe import MAX_STEP_SECONDS

Pattern = Literal["seq", "rand"]


@dataclass(frozen=True)
class ProbeSettings:
    """How long and how deep each step reads. The defaults suit a production host: a few
    seconds per step; tests shorten ``seconds``."""

    seconds: float = 5.0
    seq_block: int = 1 << 20
    seq_depth: int = 16
    rand_block: int = 4096
    rand_depth: int = 32

    def __post_init__(self) -> None:
        if not 0 < self.seconds <= MAX_STEP_SECONDS:
            raise ValueError(f"probe step seconds must be in (0, {MAX_STEP_SECONDS:g}]")


@dataclass(frozen=True)
class Step:
    name: str
    pattern: Pattern
    members: tuple[Member, ...]


def plan_steps(members: Sequence[Member], counts: Sequence[int]) -> list[Step]:
    """Each member alone, sequential then random; then the first k members at once (k > 1)."""
    steps: list[Step] = []
    for m in members:
        steps.append(Step(f"seq-{m.name}", "seq", (m,)))
        steps.append(Step(f"rand-{m.name}", "rand", (m,)))
    steps += [Step(f"scale-{k}", "seq", tuple(members[:k])) for k in counts if k > 1]
    return steps


def _filename(node: str) -> str:
    return node.replace(":", "\\:")  # fio splits filename= on ':'


def render(step: Step, settings: ProbeSettings) -> str:
    block, depth = ((settings.seq_block, settings.seq_depth) if step.pattern == "seq"
                    else (settings.rand_block, settings.rand_depth))
    lines = [
        "; stortune probe: direct reads only (fio runs with --readonly)",
        "[global]",
        "direct=1",
        "ioengine=libaio",
        f"rw={'read' if step.pattern == 'seq' else 'randread'}",
        f"bs={block}",
        f"iodepth={depth}",
        "time_based=1",
        f"runtime={max(1, round(settings.seconds * 1000))}ms",
        "norandommap=1",
        "randrepeat=0",
        "invalidate=1",
        "",
    ]
    for m in step.members:
        lines += [f"[{m.name}]", f"filename={_filename(str(m.node))}", ""]
    return "\n".join(lines)
