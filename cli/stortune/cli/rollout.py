"""``stortune rollout ...`` and ``stortune wait ...``: follow and steer a profile's rollout.

    stortune rollout status PROFILE [-o json|yaml] [--watch [--timeout 30m]]
    stortune rollout pause|resume|undo PROFILE
    stortune wait profile PROFILE --for rollout=complete [--timeout 10m]
    stortune wait host HOST --for condition=Ready[=True|False|Unknown] [--timeout 10m]

``wait`` is for scripts and CI gates: exit 0 when the condition holds, 1 when it cannot any more
(the rollout halted) or the timeout passed, with a message saying which. A rollout is followed
through the API's watch (one long request per hour at most, then another); a host's condition is
polled, as nothing streams it.
"""

from __future__ import annotations

import argparse
import math
import re
import time
from collections.abc import Callable, Iterator
from typing import Any, Final

from stortune.cli.client import Client, NotFound, UsageError
from stortune.cli.render import Cell, Output

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
#: The server's longest watch (its timeoutSeconds bound): a longer wait watches again.
WATCH_MAX_S: Final = 3600
#: --timeout's bound: a wait longer than a week is a forgotten process, not a gate.
MAX_WAIT_S: Final = 7 * 24 * 3600
DEFAULT_WAIT: Final = "10m"
HOST_POLL_S: Final = 2.0
#: After a watch the server ended early (it drained for a restart): before watching again.
REWATCH_S: Final = 1.0
_DURATION: Final = re.compile(r"(?:(\d+(?:\.\d+)?)([smhd]))+")
_PART: Final = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT: Final = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_CONDITION: Final = re.compile(r"condition=([A-Za-z][A-Za-z0-9]{0,63})(?:=(True|False|Unknown))?",
                               re.IGNORECASE)
_STAGES: Final = ("pending", "baseline", "changing", "analysing", "updated", "failed", "reverting",
                  "reverted")

ROLLOUT_HELP: Final = """\
A profile change reaches its hosts in waves (spec.rollout): show where it is, or steer it.
  status   the generation rolling out, phase, open wave, per wave its hosts by stage, failures
           against maxFailures, the analysis verdicts, and the hosts (--watch: follow it until
           Complete or Halted; exit 0 Complete, 1 Halted or --timeout)
  pause    stop starting hosts and waves (hosts being changed finish)
  resume   lift a pause, or a halt that reverted nothing (its failures are excused)
  undo     put every host it changed back to the previous generation, even after Complete
Steering needs an operator or admin token; the control plane audits it.
"""

WAIT_HELP: Final = """\
Wait until a profile's rollout is complete, or a host's condition holds.

  stortune wait profile vod --for rollout=complete --timeout 10m
  stortune wait host db01 --for condition=Ready --timeout 90s

exit codes: 0 the condition holds; 1 it does not within --timeout, the rollout halted, or an
error (each said on stderr). Durations: 90s, 10m, 2h, 1h30m (at most 7d).
"""


def duration(text: str) -> float:
    """'90s', '10m', '2h', '1h30m' -> seconds; more than 0 and at most MAX_WAIT_S."""
    if not _DURATION.fullmatch(text.strip()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 90s, 10m, 2h or 1h30m")
    seconds = sum(float(n) * _UNIT[u] for n, u in _PART.findall(text))
    if not 0 < seconds <= MAX_WAIT_S:
        raise argparse.ArgumentTypeError(f"{text!r}: must be more than 0 and at most 7d")
    return seconds


def _limit(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 10_000:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of hosts from 1 to 10000")
    return int(text)


def add_parser(sub: Any, *, connection_options: Callable[..., None], parser_class: type) -> None:
    raw = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser("rollout", help="show, pause, resume or undo a profile's rollout",
                       description=ROLLOUT_HELP, formatter_class=raw)
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=parser_class)
    s = actions.add_parser("status", help="where the profile's rollout is")
    connection_options(s, top=False)
    s.add_argument("profile")
    s.add_argument("-o", "--output", choices=("table", "yaml", "json"), default="table")
    s.add_argument("--watch", "-w", action="store_true", help="follow it until Complete or Halted")
    s.add_argument("--timeout", type=duration, metavar="DURATION",
                   help=f"with --watch: give up after this long (default {DEFAULT_WAIT})")
    s.add_argument("--limit", type=_limit, help="at most this many hosts listed (server default 500)")
    for action, text in (("pause", "stop starting hosts and waves"),
                         ("resume", "lift a pause, or a halt that reverted nothing"),
                         ("undo", "put every host it changed back to the previous generation")):
        a = actions.add_parser(action, help=text)
        connection_options(a, top=False)
        a.add_argument("profile")

    w = sub.add_parser("wait", help="wait for a rollout to complete or a host's condition",
                       description=WAIT_HELP, formatter_class=raw)
    kinds = w.add_subparsers(dest="kind", required=True, metavar="KIND", parser_class=parser_class)
    for kind, what, example in (("profile", "PROFILE", "rollout=complete"),
                                ("host", "HOST", "condition=Ready")):
        k = kinds.add_parser(kind, help=f"wait for {example} of a {kind}")
        connection_options(k, top=False)
        k.add_argument("name", metavar=what)
        k.add_argument("--for", dest="condition", required=True, metavar="CONDITION", help=f"e.g. {example}")
        k.add_argument("--timeout", type=duration, default=duration(DEFAULT_WAIT), metavar="DURATION",
                       help=f"give up after this long (default {DEFAULT_WAIT})")


# rollout ------------------------------------------------------------------------------------


def command(args: argparse.Namespace, client: Client, out: Output) -> int:
    if args.action != "status":
        status = client.steer_rollout(args.profile, args.action)
        out.line(f"rollout of {args.profile}: {args.action} requested ({_phase(status)}; the control plane "
                 "takes it at its next step)")
        return EXIT_OK
    if args.timeout is not None and not args.watch:
        raise UsageError("--timeout applies to --watch")
    if not args.watch:
        status = client.get_rollout(args.profile, limit=args.limit)
        _show(out, status, args.output)
        return EXIT_OK
    outcome, last = EXIT_FAILED, {}
    for shown, ended in _follow(client, args.profile, args.timeout or duration(DEFAULT_WAIT), args.limit):
        if shown is not None:
            _show(out, shown, args.output)
            last = shown
        if ended is not None:
            outcome = _report_end(out, args.profile, {**ended, "phase": _phase(last)} if last else ended)
    return outcome


def _show(out: Output, status: dict[str, Any], fmt: str) -> None:
    if fmt != "table":
        out.dump(status, fmt)
        return
    for text, style in summary(status):
        out.line(text, style)
    waves = [w for w in _list(status.get("waves")) if isinstance(w, dict)]
    if waves:
        out.line()
        out.table(["WAVE", "HOSTS", *(s.upper() for s in _STAGES)],
                  [[str(w.get("number", "")), str(w.get("hosts", "")),
                    *(str(_dict(w.get("stages")).get(s, 0)) for s in _STAGES)] for w in waves])
    hosts = [h for h in _list(status.get("hosts")) if isinstance(h, dict)]
    if hosts:
        out.line()
        out.table(["HOST", "WAVE", "GENERATION", "STAGE", "FAILURE", "VERDICT"],
                  [[str(h.get("name", "")), str(h.get("wave", "")), str(h.get("generation", "")),
                    _stage_cell(h.get("stage")), str(h.get("failure") or ""), str(h.get("verdict") or "")]
                   for h in hosts])
    analysis = [a for a in _list(status.get("analysis")) if isinstance(a, dict)]
    if analysis:
        out.line()
        out.line("analysis:", "bold")
        for item in analysis:
            out.line("  " + ", ".join(f"{k} {v}" for k, v in item.items() if not isinstance(v, dict | list)))


def summary(status: dict[str, Any]) -> list[tuple[str, str]]:
    """The status in a few lines a person reads first: what rolls out, where, how it goes."""
    counts = {k: v for k, v in _dict(status.get("counts")).items() if isinstance(v, int)}
    total = sum(counts.values())
    phase = _phase(status)
    style = {"Complete": "green", "Halted": "bold red", "Paused": "yellow"}.get(str(status.get("phase")), "")
    waves = _list(status.get("waves"))
    lines = [(f"rollout of {status.get('profile')}: generation {status.get('generation')} "
              f"(from {status.get('previous')}), {phase}, wave {status.get('wave')} of {len(waves)}", style)]
    changed = counts.get("updated", 0)
    moving = sum(counts.get(s, 0) for s in ("baseline", "changing", "analysing"))
    lines.append((f"  hosts: {total}; changed {changed}, changing {moving}, "
                  f"pending {counts.get('pending', 0)}, failed {counts.get('failed', 0)}"
                  + (f", reverted {counts.get('reverted', 0) + counts.get('reverting', 0)}"
                     if counts.get("reverted") or counts.get("reverting") else ""), ""))
    failures = status.get("failures", 0)
    lines.append((f"  failures: {failures} of {status.get('maxFailures')} tolerated"
                  + (f" ({status.get('excused')} excused by a resume)" if status.get("excused") else "")
                  + f"; at most {status.get('maxUnavailable')} changing at once", ""))
    verdicts = [str(h.get("verdict")) for h in _list(status.get("hosts"))
                if isinstance(h, dict) and h.get("verdict")]
    if verdicts or status.get("analysis"):
        passed, failed = verdicts.count("passed"), verdicts.count("failed")
        lines.append((f"  gate: {passed} passed, {failed} failed analysis", "red" if failed else ""))
    pending = [c for c in _list(status.get("pendingCommands")) if isinstance(c, dict)]
    if pending:
        asked = ", ".join(f"{c.get('command')} by {c.get('by')}" for c in pending)
        lines.append((f"  pending: {asked}", "yellow"))
    return lines


def _phase(status: dict[str, Any]) -> str:
    phase = str(status.get("phase") or "unknown")
    if phase == "Halted":
        reason = status.get("reason")
        back = (" rolled back" if status.get("rolledBack")
                else " rolling back" if status.get("rollback") else "")
        return f"Halted ({reason}){back}" if reason else f"Halted{back}"
    return phase


def _stage_cell(stage: Any) -> Cell:
    text = str(stage or "")
    return Cell(text, {"failed": "red", "updated": "green", "reverted": "yellow"}.get(text, ""))


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


# wait ---------------------------------------------------------------------------------------


def _follow(client: Client, profile: str, seconds: float, limit: int | None = None
            ) -> Iterator[tuple[dict[str, Any] | None, dict[str, Any] | None]]:
    """(status, None) for each status the watch sends, then (None, end) once: ``end`` is the
    server's end line, or {"reason": "Timeout"} when ``seconds`` passed over several watches."""
    deadline = time.monotonic() + seconds
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            yield None, {"type": "end", "reason": "Timeout"}
            return
        ended: dict[str, Any] | None = None
        for event in client.watch_rollout(profile, seconds=min(WATCH_MAX_S, math.ceil(remaining)),
                                          limit=limit):
            if event.get("type") == "status":
                yield _dict(event.get("status")), None
            elif event.get("type") == "end":
                ended = event
        if ended is None or ended.get("reason") == "ServerShutdown":
            time.sleep(REWATCH_S)  # the connection ended short of its end: watch again
        elif ended.get("reason") != "Timeout" or time.monotonic() >= deadline:
            yield None, ended
            return


def _report_end(out: Output, profile: str, ended: dict[str, Any]) -> int:
    reason = ended.get("reason")
    if reason == "Complete":
        out.note(f"rollout of {profile} is complete")
        return EXIT_OK
    if reason == "Halted":
        out.error(f"rollout of {profile} halted ({ended.get('phase')}); "
                  f"see stortune rollout status {profile}")
    elif reason == "Timeout":
        out.error(f"timed out: the rollout of {profile} is still {ended.get('phase') or 'not complete'}")
    elif reason == "Gone":
        out.error(f"the rollout of {profile} is gone: a newer change replaced it, or the profile was deleted")
    else:
        out.error(f"the watch of {profile}'s rollout ended: {ended.get('message') or reason}")
    return EXIT_FAILED


def wait_command(args: argparse.Namespace, client: Client, out: Output) -> int:
    if args.kind == "profile":
        if args.condition.strip().lower() != "rollout=complete":
            raise UsageError(f"--for {args.condition!r}: a profile can be waited for rollout=complete")
        return _wait_rollout(client, out, args.name, args.timeout)
    found = _CONDITION.fullmatch(args.condition.strip())
    if found is None:
        raise UsageError(f"--for {args.condition!r}: expected condition=TYPE[=True|False|Unknown], "
                         "e.g. condition=Ready")
    return _wait_condition(client, out, args.name, (found.group(1), (found.group(2) or "True").title()),
                           args.timeout)


def _wait_rollout(client: Client, out: Output, profile: str, seconds: float) -> int:
    deadline = time.monotonic() + seconds
    while True:
        try:
            client.get_rollout(profile, limit=1)
        except NotFound:
            # None (any more): the last change went to every host at once, which is complete.
            generation = client.get_profile(profile).generation  # NotFound names a missing profile
            out.note(f"{profile} has no rollout: generation {generation} went to every host at once")
            return EXIT_OK
        last: dict[str, Any] = {}
        for status, ended in _follow(client, profile, max(0.0, deadline - time.monotonic()), limit=1):
            if status is not None:
                last = status
            elif ended is not None and ended.get("reason") != "Gone":
                return _report_end(out, profile, {**ended, "phase": _phase(last)} if last else ended)


def _wait_condition(client: Client, out: Output, name: str, condition_status: tuple[str, str],
                    seconds: float) -> int:
    condition, wanted = condition_status
    deadline = time.monotonic() + seconds
    while True:
        host = client.get_host(name)
        found = next((c for c in host.conditions if c.type.lower() == condition.lower()), None)
        if found is not None and found.status == wanted:
            out.note(f"host {name}: {found.type} is {found.status}")
            return EXIT_OK
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            now = (f"{found.status}" + (f" ({found.reason}: {found.message})" if found.reason else "")
                   if found is not None else "not reported")
            out.error(f"timed out: host {name}'s condition {condition} is {now}, not {wanted}")
            return EXIT_FAILED
        time.sleep(min(HOST_POLL_S, remaining))
