"""Human output: rich tables on a terminal, plain aligned text when piped."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

from stortune.schemas.plan import Plan
from stortune.schemas.topology import Topology

if TYPE_CHECKING:  # only `analyze` builds one; `serve` never loads the analysis models
    from stortune.schemas.analysis.model import Check, HostAnalysis


def dump(data: Any, fmt: str, out: TextIO | None = None) -> None:
    out = sys.stdout if out is None else out  # (the current stdout, not the one at import)
    if fmt == "json":
        out.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
    else:
        import yaml  # only for -o yaml: the serving agent never loads it

        out.write(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))


def table(title: str, headers: Sequence[str], rows: Sequence[Sequence[object]],
          out: TextIO | None = None) -> None:
    out = sys.stdout if out is None else out
    cells = [["" if c is None else str(c) for c in row] for row in rows]
    if out.isatty():
        from rich.console import Console
        from rich.table import Table

        t = Table(title=title, title_justify="left")
        for h in headers:
            t.add_column(h)
        for row in cells:
            t.add_row(*row)
        Console(file=out).print(t)
        return
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    out.write(f"{title}\n")
    out.write("  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip() + "\n")
    for row in cells:
        out.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1000:
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1000
    return f"{value:.1f}PB"


def _controllers(topo: Topology) -> tuple[dict[str, str], list[str] | None]:
    """Each controller volume's one-line summary by device, and the controller lines (None:
    the agent did not ask any vendor tool)."""
    if topo.controllers is None and all(d.controller is None for d in topo.devices):
        return {}, None
    from stortune.schemas.analysis import volumes  # only on a host with controllers

    summaries = {name: v.summary() for name, v in volumes.by_device(topo).items()}
    if topo.controllers is None:
        return summaries, None
    return summaries, volumes.inventory_lines(topo.controllers) or ["none found"]


def topology_table(topo: Topology, out: TextIO | None = None) -> None:
    out = sys.stdout if out is None else out
    summaries, controller_lines = _controllers(topo)
    rows = []
    for d in topo.devices:
        detail = []
        if d.name in summaries:
            detail.append(summaries[d.name])
        if d.md:
            chunk = "?" if d.md.chunk_bytes is None else f"{d.md.chunk_bytes // 1024}KiB"
            detail.append(f"{d.md.level} chunk={chunk} members={len(d.md.members)}"
                          + (f" degraded={d.md.degraded}" if d.md.degraded else ""))
        if d.dm:
            detail.append(f"{d.dm.type} {d.dm.name or ''}".strip())
        if d.partition and not d.partition.aligned:
            detail.append(f"MISALIGNED start={d.partition.start_sector}")
        if d.mounts:
            detail.append(",".join(f"{m.mountpoint}({m.fstype})" for m in d.mounts))
        ra = d.tunables.get("read_ahead_kb")
        sched = d.tunables.get("scheduler")
        rows.append([
            d.name, d.kind.value, _size(d.size_bytes),
            {True: "hdd", False: "ssd"}.get(d.rotational, "-") if d.rotational is not None else "-",
            d.transport or "-",
            (d.scsi_host.driver if d.scsi_host else None) or d.driver or "-",
            " ".join(x for x in (d.vendor, d.model) if x) or "-",
            ",".join(r.value for r in d.roles) or "-",
            ra.value if ra and ra.supported else "-",
            sched.value if sched and sched.supported else "-",
            "; ".join(detail),
        ])
    table(f"{topo.hostname or 'host'} ({topo.kernel or 'unknown kernel'}): {len(rows)} devices",
          ["device", "kind", "size", "media", "transport", "driver", "model", "roles",
           "ra_kb", "sched", "detail"], rows, out)
    if controller_lines is not None:
        out.write("hardware RAID controllers:\n" + "".join(f"  {line}\n" for line in controller_lines))
    for w in topo.warnings:
        out.write(f"warning: {w}\n")


def plan_table(plan: Plan, out: TextIO | None = None) -> None:
    out = sys.stdout if out is None else out
    if plan.restorations:
        back = [[r.device, r.tunable, r.current, r.desired,
                 "original" if r.to == "original" else f"as {r.cause} left it"]
                for r in plan.restorations]
        table(f"{len(back)} restoration(s): no profile sets these any more",
              ["device", "tunable", "current", "restored", "to"], back, out)
    rows = [[c.device, c.tunable, c.current, c.desired, f"{c.source.profile}/{c.source.rule}",
             c.source.mode] for c in plan.changes]
    table(f"{len(rows)} change(s)", ["device", "tunable", "current", "desired", "from", "mode"],
          rows, out)
    if plan.rejections:
        rrows = [[r.device, r.tunable, r.value, "error" if r.fatal else "skipped", r.reason]
                 for r in plan.rejections]
        table(f"{len(rrows)} rejection(s)", ["device", "tunable", "value", "severity", "reason"],
              rrows, out)
    for d in plan.desired:
        if d.note:  # what a wanted value costs (a stripe cache's RAM), changed or already in place
            out.write(f"note: {d.device} {d.tunable} {d.desired}: {d.note}\n")


def explain_table(plan: Plan, out: TextIO | None = None, verbose: bool = False) -> None:
    out = sys.stdout if out is None else out
    by_device: dict[str, list[list[object]]] = {}
    for d in plan.desired:
        by_device.setdefault(d.device, []).append([
            d.tunable, d.desired, d.observed, "in sync" if d.in_sync else "CHANGE",
            f"{d.source.profile}/{d.source.rule}", "; ".join([*d.overridden, *filter(None, [d.note])]) or "-",
        ])
    for r in plan.rejections:
        by_device.setdefault(r.device, []).append([
            r.tunable, r.value, "-", "REJECTED" if r.fatal else "skipped",
            f"{r.source.profile}/{r.source.rule}", r.reason,
        ])
    for exp in plan.explanations:
        rows = by_device.get(exp.device, [])
        if not rows and not verbose:
            continue
        table(f"{exp.device} ({exp.kind.value}, {exp.device_id})",
              ["tunable", "desired", "observed", "state", "winner", "notes"], rows, out)
        misses = [[f"{v.profile}/{v.rule}", "matched" if v.matched else "no", v.reason]
                  for v in exp.rules]
        table("  rules", ["rule", "matched", "why"], misses, out)
        out.write("\n")


def checks_table(checks: Sequence[Check], out: TextIO | None = None) -> None:
    """Layout checks under the topology listing (alignment, geometry, arrays, stripe cache)."""
    from stortune.schemas.analysis import render as analysis_render

    if checks:
        out = sys.stdout if out is None else out
        out.write("\n")
        table("layout checks", analysis_render.CHECK_HEADERS, analysis_render.check_rows(checks), out)


def analysis_table(analysis: HostAnalysis, out: TextIO | None = None) -> None:
    """The layout ``stortune analyze host`` shows too (schemas.analysis.render)."""
    from stortune.schemas.analysis import render as analysis_render

    out = sys.stdout if out is None else out
    for section in analysis_render.sections(analysis):
        if section.headers:
            table(section.heading, section.headers, section.rows, out)
        else:
            out.write(section.heading + "\n" + "".join(f"  {line}\n" for line in section.lines))
        out.write("\n")
