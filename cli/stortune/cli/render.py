"""Output: rich tables and colour on a terminal, plain aligned text when piped.

Colour follows https://no-color.org: a non-empty NO_COLOR turns it off. Piped
output never carries escape sequences, so scripts and CI logs can grep it.

Much of what is shown comes from agents (facts, values, report messages) and
from devices through them (an INQUIRY model string): control characters in it
are shown escaped (``\x1b``), on a terminal and piped alike, so nothing printed
can move the cursor, erase or rewrite lines, retitle the terminal or write its
clipboard. JSON and YAML output escape them by their own rules.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TextIO

import yaml
from rich import box
from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from stortune.cli.client import (
    Event,
    Host,
    HostPlan,
    Lease,
    PlannedChange,
    PlannedRejection,
    PlannedRestoration,
    Profile,
    Protected,
    Token,
    Value,
)

# C0 and C1 controls, DEL, and the bidirectional overrides that reorder what is displayed.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_CELL_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(text: str, *, cell: bool = False) -> str:
    """``text`` fit for a terminal: controls escaped (a table cell keeps no line break or tab either)."""
    return (_CELL_CONTROLS if cell else _CONTROLS).sub(_escaped, text)


@dataclass(frozen=True)
class Cell:
    text: str
    style: str = ""


Row = Sequence[str | Cell]


class Output:
    """Where a command writes: ``out`` for results, ``err`` for errors and notes."""

    def __init__(self, out: TextIO, err: TextIO) -> None:
        self.out, self.err = out, err
        no_color = bool(os.environ.get("NO_COLOR"))
        self.rich = _isatty(out)
        self._console = self._make_console(out, no_color) if self.rich else None
        self._err_console = self._make_console(err, no_color) if _isatty(err) else None

    @staticmethod
    def _make_console(stream: TextIO, no_color: bool) -> Console:
        return Console(file=stream, force_terminal=True, no_color=no_color, highlight=False, emoji=False,
                       markup=False)

    @property
    def console(self) -> Console | None:
        """The rich console of ``out`` on a terminal (live displays); None when piped."""
        return self._console

    @property
    def arrow(self) -> str:
        return "→" if self.rich else "->"

    def line(self, text: str = "", style: str = "") -> None:
        text = shown(text)
        if self._console is not None:
            self._console.print(Text(text, style=style), soft_wrap=True)
        else:
            self.out.write(text + "\n")

    def lines(self, texts: Iterable[tuple[str, str]]) -> None:
        for text, style in texts:
            self.line(text, style)

    def error(self, message: str) -> None:
        self._to_err(f"error: {message}", "bold red")

    def warn(self, message: str) -> None:
        self._to_err(f"warning: {message}", "yellow")

    def note(self, message: str) -> None:
        self._to_err(message, "")

    def _to_err(self, text: str, style: str) -> None:
        text = shown(text)
        if self._err_console is not None:
            self._err_console.print(Text(text, style=style), soft_wrap=True)
        else:
            self.err.write(text + "\n")

    def table(self, headers: Sequence[str], rows: Sequence[Row], *, indent: int = 0,
              row_styles: Sequence[str] | None = None) -> None:
        cells = [[Cell(shown(c.text, cell=True), c.style) if isinstance(c, Cell)
                  else Cell(shown(c, cell=True)) for c in row] for row in rows]
        if self._console is not None:
            table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
            for header in headers:
                table.add_column(header, overflow="fold")
            for index, row in enumerate(cells):
                style = row_styles[index] if row_styles else ""
                table.add_row(*(Text(c.text, style=c.style) for c in row), style=style or None)
            self._console.print(Padding(table, (0, 0, 0, indent), expand=False) if indent else table)
            return
        # kubectl's layout: columns three spaces apart, no trailing blanks.
        texts = [[c.text for c in row] for row in cells]
        widths = [max([len(h), *(len(r[i]) for r in texts)]) for i, h in enumerate(headers)]
        for line_cells in [list(headers), *texts]:
            line = "   ".join(t.ljust(w) for t, w in zip(line_cells, widths, strict=True)).rstrip()
            self.out.write(" " * indent + line + "\n")

    def dump(self, data: Any, fmt: str) -> None:
        if fmt == "json":
            self.out.write(json.dumps(data, indent=2) + "\n")
        else:
            self.out.write(yaml.safe_dump(data, sort_keys=False, default_flow_style=False,
                                          allow_unicode=True))

    def diff(self, before: str, after: str, from_label: str, to_label: str) -> None:
        for text in difflib.unified_diff(before.splitlines(), after.splitlines(), from_label, to_label,
                                         lineterm=""):
            style = ""
            if text.startswith(("+++", "---")):
                style = "bold"
            elif text.startswith("@@"):
                style = "cyan"
            elif text.startswith("+"):
                style = "green"
            elif text.startswith("-"):
                style = "red"
            self.line(text, style)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or not a real stream
        return False


# Formatting --------------------------------------------------------------------


def age(when: datetime | None, now: datetime | None = None) -> str:
    """kubectl's short ages: 42s, 7m, 5h, 3d."""
    if when is None:
        return "<unknown>"
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    seconds = max(0, int(((now or datetime.now(UTC)) - when).total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 2 * 3600:
        return f"{seconds // 60}m"
    if seconds < 2 * 86400:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def labels(values: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(values.items())) or "<none>"


def selector(spec: dict[str, Any]) -> str:
    """spec.hostSelector in the label-selector query syntax: role=web,tier in (a,b),!legacy."""
    raw = spec.get("hostSelector")
    if not isinstance(raw, dict):
        return "<none>"
    parts = [f"{k}={v}" for k, v in sorted((raw.get("matchLabels") or {}).items())]
    for req in raw.get("matchExpressions") or []:
        if not isinstance(req, dict):
            continue
        key, op, values = req.get("key", ""), req.get("operator", ""), req.get("values") or []
        if op == "In":
            parts.append(f"{key} in ({','.join(values)})")
        elif op == "NotIn":
            parts.append(f"{key} notin ({','.join(values)})")
        elif op == "Exists":
            parts.append(str(key))
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
    return ",".join(parts) or "<none>"


def value(v: Value | None) -> str:
    return "-" if v is None else str(v)


def _status_cell(status: str | None, *, good: str = "True") -> Cell:
    if status is None:
        return Cell("-")
    if status == "Unknown":
        return Cell(status, "yellow")
    return Cell(status, "green" if status == good else "red")


# Resource tables ---------------------------------------------------------------


def host_rows(hosts: Sequence[Host]) -> tuple[list[str], list[Row]]:
    """The host's conditions, "-" where the reconciler has not reported one (yet)."""
    headers = ["NAME", "READY", "REACHABLE", "APPLIED", "DRIFTED", "LABELS", "ADDRESS", "AGE"]
    rows: list[Row] = []
    for h in hosts:
        cells = [_status_cell(c.status if c else None, good="False" if kind == "Drifted" else "True")
                 for kind in ("Ready", "Reachable", "Applied", "Drifted")
                 for c in [h.condition(kind)]]
        rows.append([h.name, *cells, labels(h.labels), h.address or "-", age(h.created)])
    return headers, rows


def profile_rows(profiles: Sequence[Profile]) -> tuple[list[str], list[Row]]:
    with_hosts = any(_hosts(p) is not None for p in profiles)
    headers = ["NAME", "PRIORITY", "MODE", "SELECTOR", "GENERATION", *(["HOSTS"] if with_hosts else []),
               "AGE"]
    rows: list[Row] = []
    for p in profiles:
        rows.append([
            Cell(p.name + (" (deleting)" if p.deleting else ""), "yellow" if p.deleting else ""),
            str(p.spec.get("priority", 0)), str(p.spec.get("mode", "enforce")), selector(p.spec),
            value(p.generation), *([_hosts(p) or "-"] if with_hosts else []), age(p.created),
        ])
    return headers, rows


def _hosts(profile: Profile) -> str | None:
    """status.hosts as the reconciler counts it: "applied/matched", plus failures or restoring hosts."""
    counts = profile.status.get("hosts")
    if not isinstance(counts, dict):
        return None

    def count(key: str) -> int | None:
        found = counts.get(key)
        return found if isinstance(found, int) and not isinstance(found, bool) else None

    matched, applied, failed, restoring = (count(k) for k in ("matched", "applied", "failed", "restoring"))
    if restoring is not None and matched is None:
        return f"restoring {restoring}"
    if matched is None:
        return None
    text = f"{applied if applied is not None else '?'}/{matched}"
    return text + (f" ({failed} failed)" if failed else "")


def event_rows(events: Sequence[Event]) -> tuple[list[str], list[Row]]:
    rows: list[Row] = [
        [age(e.last_seen) + (f" (x{e.count})" if e.count > 1 else ""),
         Cell(e.type, "yellow" if e.type == "Warning" else ""), e.reason,
         f"{e.object_kind.lower()}/{e.object_name}", e.message]
        for e in events
    ]
    return ["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"], rows


def token_rows(tokens: Sequence[Token], now: datetime | None = None) -> tuple[list[str], list[Row]]:
    moment = now or datetime.now(UTC)

    def state(t: Token) -> Cell:
        if t.revoked is not None:
            return Cell("Revoked", "red")
        if t.expires is not None and t.expires <= moment:
            return Cell("Expired", "yellow")
        return Cell("Active", "green")

    def expires(t: Token) -> str:
        if t.expires is None:
            return "never"
        return "in " + age(moment, t.expires) if t.expires > moment else age(t.expires, moment) + " ago"

    rows: list[Row] = [
        [t.id, t.name, t.role, state(t), expires(t),
         age(t.last_used, moment) + " ago" if t.last_used else "never", t.hosts or "<all>"]
        for t in tokens
    ]
    return ["ID", "NAME", "ROLE", "STATE", "EXPIRES", "LAST USED", "HOSTS"], rows


# describe host -------------------------------------------------------------------


def describe_host(out: Output, host: Host, events: Sequence[Event], lease: Lease | None = None,
                  protected: Sequence[Protected] | None = None) -> None:
    def field(name: str, text: str) -> None:
        out.line(f"{name + ':' if name else '':<16}{text}")

    field("Name", host.name)
    field("Address", host.address or "-")
    if host.labels:
        for index, (key, val) in enumerate(sorted(host.labels.items())):
            origin = "set via API" if key in host.api_labels else "reported by agent"
            shadowed = key in host.api_labels and key in host.reported_labels
            note = f"{origin}{', overrides the reported value' if shadowed else ''}"
            field("Labels" if index == 0 else "", f"{key}={val}  ({note})")
    else:
        field("Labels", "<none>")
    field("Registered", _when(host.created))
    if lease is not None:
        field("Last heartbeat", _when(lease.renewed))
        field("Lease expires", _when(lease.expires) + ("  (expired)" if lease.expired else ""))

    out.line("Facts:")
    if host.facts:
        for key, val in sorted(host.facts.items()):
            out.line(f"  {key + ':':<16}{'-' if val is None else val}")
    else:
        out.line("  <none>")

    out.line("Conditions:")
    if host.conditions:
        out.table(["TYPE", "STATUS", "REASON", "MESSAGE", "LAST TRANSITION"],
                  [[c.type, _status_cell(c.status), c.reason, c.message, _when(c.last_transition)]
                   for c in host.conditions], indent=2)
    else:
        out.line("  <none>")

    out.line("Applied profiles:")
    if host.applied or host.refused:
        for name, generation in sorted(host.applied.items()):
            out.line(f"  {name} (generation {generation})")
        for name, generation in sorted(host.refused.items()):
            out.line(f"  {name} (generation {generation} refused by the agent)", "red")
    else:
        out.line("  <none>")

    out.line("Protected devices (no experiment, benchmark or probe; the agent decides):")
    if protected:
        out.table(["DEVICE", "REASON"], [[p.device, p.reason] for p in protected], indent=2)
    else:
        out.line("  <none>" if protected is not None else "  <not reported by this host's agent>")

    out.line("Settings (desired vs observed):")
    if host.devices:
        rows: list[Row] = []
        styles = []
        for d in host.devices:
            # None: rejected or skipped on this device; the message says why.
            state = {True: "yes", False: "NO (drifted)" if d.drifted else "NO", None: "-"}[d.in_sync]
            if d.in_sync and d.pending_reboot:
                state = "yes (pending reboot)"
            source = f"{d.profile}/{d.rule}" if d.profile else "-"
            if d.mode == "audit":
                source += " (audit)"
            rows.append([d.device, d.tunable, value(d.desired), value(d.observed), state, source,
                         d.message])
            styles.append("red" if d.in_sync is False else "")
        out.table(["DEVICE", "TUNABLE", "DESIRED", "OBSERVED", "IN SYNC", "FROM", "MESSAGE"], rows,
                  indent=2, row_styles=styles)
    else:
        out.line("  <none reported yet>")

    out.line("Events:")
    if events:
        headers, erows = event_rows(events)
        out.table([h for h in headers if h != "OBJECT"], [[r[0], r[1], r[2], r[4]] for r in erows],
                  indent=2)
    else:
        out.line("  <none>")


def _when(moment: datetime | None) -> str:
    if moment is None:
        return "-"
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    now = datetime.now(UTC)
    relative = f"{age(moment, now)} ago" if moment <= now else f"in {age(now, moment)}"
    return f"{moment.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ} ({relative})"


# Plans ------------------------------------------------------------------------


def host_plans(out: Output, plans: Sequence[HostPlan]) -> None:
    """Per host: the ordered changes (current → desired, and which rule wants them) and rejections."""
    if not plans:
        out.line("no registered host is selected by these profiles: nothing would change")
        return
    for plan in plans:
        if not plan.topology_reported:
            out.line(f"host/{plan.host}: topology not reported yet; nothing to plan", "yellow")
            continue
        if not plan.changes and not plan.restorations and not plan.rejections:
            out.line(f"host/{plan.host}: in sync", "green")
            continue
        out.line(f"host/{plan.host}: {len(plan.changes) + len(plan.restorations)} change(s)"
                 + (f", {len(plan.rejections)} rejection(s)" if plan.rejections else ""), "bold")
        if plan.changes or plan.restorations:
            # Restorations first: the agent puts those back before it applies the changes.
            out.table(["DEVICE", "TUNABLE", "CHANGE", "FROM"],
                      [*(_restoration_row(out, r) for r in plan.restorations),
                       *(_change_row(out, c) for c in plan.changes)], indent=2)
        if plan.rejections:
            out.table(["DEVICE", "TUNABLE", "VALUE", "SEVERITY", "REASON", "FROM"],
                      [_rejection_row(r) for r in plan.rejections], indent=2,
                      row_styles=["red" if r.fatal else "yellow" for r in plan.rejections])


def plan_errors(out: Output, errors: Sequence[tuple[str, PlannedRejection]]) -> None:
    """On stderr, one line per setting a host cannot set: what, where, which rule, why."""
    for host, r in errors:
        out.error(f"host/{host}: {r.device} {r.tunable}={value(r.value)} ({r.source.profile}/"
                  f"{r.source.rule}) cannot be set: {r.reason}")
    if errors:
        out.note(f"{len(errors)} setting(s) cannot be set (every other setting is applied): fix or"
                 " remove them in the profiles named")


def _change_row(out: Output, change: PlannedChange) -> Row:
    source = f"{change.source.profile}/{change.source.rule}"
    if change.source.mode == "audit":
        source += " (audit: reported only)"
    return [change.device, change.tunable,
            f"{value(change.current)} {out.arrow} {value(change.desired)}", source]


def _restoration_row(out: Output, back: PlannedRestoration) -> Row:
    to = "(original)" if back.to == "original" else f"(as {back.cause} left it)"
    return [back.device, back.tunable, f"{value(back.current)} {out.arrow} {value(back.desired)} {to}",
            "no profile sets it any more"]


def _rejection_row(rejection: PlannedRejection) -> Row:
    severity = "error: not set" if rejection.fatal else "skipped"
    return [rejection.device, rejection.tunable, value(rejection.value), severity, rejection.reason,
            f"{rejection.source.profile}/{rejection.source.rule}"]
