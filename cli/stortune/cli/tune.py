"""``stortune tune``: tuning experiments through the control plane.

    tune run -f EXP.yaml [--dry-run] [--no-wait] [-o table|yaml|json]
    tune list [--name N] [--state S] [--limit N] [-o table|yaml|json]
    tune show ID [-o table|yaml|json]
    tune cancel ID [--no-wait]
    tune plot ID -o FILE.png|svg [--kind values|progress|heatmap|fairness]
    tune profile ID [-o FILE] [--apply]

Exit codes: ``run`` 0 when the experiment is done (whatever it recommends), 1 when it failed or
was cancelled; 1 for any error, the bad field or argument named.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import yaml

from stortune.cli import sync
from stortune.cli.bench import seconds, verdict_lines
from stortune.cli.client import JSON, Client, ClientError
from stortune.cli.manifests import Manifest
from stortune.cli.render import Cell, Output, Row
from stortune.schemas.bench import metrics
from stortune.schemas.documents import DocumentError, Problem, parse_profile
from stortune.schemas.tuning.experiment import load_experiments
from stortune.schemas.tuning.timing import hold_line

EXIT_OK: Final = 0
EXIT_ERROR: Final = 1
POLL_SECONDS: Final = 1.0
ENDED: Final = ("done", "failed", "cancelled")
CHART_KINDS: Final = ("values", "progress", "heatmap", "fairness")

TUNE_HELP: Final = """\
Run tuning experiments on hosts through the control plane: vary settings trial by trial,
benchmark each point against the noise, and get back a StorageProfile with the evidence.

While an experiment owns a host, the reconciler neither corrects nor reports drift on the
settings it varies and profile applies wait (Applied=False, ExperimentRunning); at its end
(done, cancelled, budget, failure) the host is put back to its desired state.

  stortune tune run -f examples/tuning/streamer-readahead.yaml
  stortune tune profile ID -o profiles/streamer-readahead.yaml   # commit it, then stortune apply
  stortune tune plot ID -o values.svg

exit codes: run: 0 done, 1 failed or cancelled; 1 any error
"""


class TuneUsageError(Exception):
    """A bad argument: the message names it."""


def add_parser(sub: Any, *, connection_options: Callable[..., None], parser_class: type[Any]) -> None:
    p = sub.add_parser("tune", help="run, list, show, cancel and plot tuning experiments; get their profile",
                       description=TUNE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=parser_class)

    def action(name: str, text: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = actions.add_parser(name, help=text, description=text)
        connection_options(parser, top=False)
        return parser

    a = action("run", "submit a TuningExperiment and follow it: trial k of n, values, metric, leader")
    a.add_argument("-f", "--filename", required=True, metavar="EXP.yaml", help="the experiment (- for stdin)")
    a.add_argument("--wait", action=argparse.BooleanOptionalAction, default=True,
                   help="follow it with a live progress view until it ends (default: --wait)")
    a.add_argument("--dry-run", action="store_true",
                   help="show the hosts, devices and trial plan; run nothing")
    a.add_argument("-o", "--output", choices=("table", "yaml", "json"), default="table",
                   help="json|yaml: the experiment with its evidence on stdout, progress on stderr")
    a.add_argument("--poll", type=seconds, default=POLL_SECONDS, help=argparse.SUPPRESS)

    a = action("list", "experiments, newest first")
    a.add_argument("--name", help="metadata.name")
    a.add_argument("--state", choices=("queued", "running", "done", "cancelled", "failed"))
    a.add_argument("--limit", type=int)
    a.add_argument("-o", "--output", choices=("table", "yaml", "json"), default="table")

    a = action("show", "one experiment: progress per host, every trial, the recommendation")
    a.add_argument("id")
    a.add_argument("-o", "--output", choices=("table", "yaml", "json"), default="table")

    a = action("cancel", "cancel an experiment (the running trial's fio is stopped, hosts put back)")
    a.add_argument("id")
    a.add_argument("--wait", action=argparse.BooleanOptionalAction, default=True,
                   help="wait until every host is back (default: --wait)")
    a.add_argument("--poll", type=seconds, default=POLL_SECONDS, help=argparse.SUPPRESS)

    a = action("plot", "a chart of an experiment, PNG or SVG by the file's suffix")
    a.add_argument("id")
    a.add_argument("-o", "--output", required=True, metavar="FILE.png|FILE.svg")
    a.add_argument("--kind", choices=CHART_KINDS, default="values",
                   help="values: metric by each parameter's values; progress: best so far by trial; "
                        "heatmap: two parameters; fairness: per-job CV")

    a = action("profile", "the recommended StorageProfile (YAML), ready for a GitOps repository")
    a.add_argument("id")
    a.add_argument("-o", "--output", metavar="FILE", help="write it to FILE (default: stdout)")
    a.add_argument("--apply", action="store_true", help="also create or update it on the control plane")


def command(args: argparse.Namespace, client: Client, out: Output) -> int:
    try:
        return _ACTIONS[args.action](args, client, out)
    except TuneUsageError as exc:
        out.error(str(exc))
        return EXIT_ERROR


# -- reading documents tolerantly ----------------------------------------------------------------------
def _obj(data: Any, key: str) -> JSON:
    value = data.get(key) if isinstance(data, dict) else None
    return value if isinstance(value, dict) else {}


def _dicts(value: Any) -> list[JSON]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _point(point: Any) -> str:
    if not isinstance(point, dict) or not point:
        return "-"
    return " ".join(f"{k}={v}" for k, v in point.items())


def _human(metric: str, value: Any) -> str:
    number = _num(value)
    if number is None:
        return "-"
    try:
        return metrics.get(metric).human(number)
    except KeyError:
        return f"{number:g}"


def _pct(value: Any) -> str:
    number = _num(value)
    return "-" if number is None else f"{number:+.1f}%"


# -- run ---------------------------------------------------------------------------------------------
def _read(path: str) -> JSON:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise TuneUsageError(f"-f {path}: {exc.strerror or exc}") from None
    # Checked here first (a DocumentError names the field), so nothing invalid is sent.
    found = load_experiments(text, "<stdin>" if path == "-" else path)
    if len(found) != 1:
        raise DocumentError([Problem(path, "", f"holds {len(found)} TuningExperiment documents; "
                                               "tune run takes one")])
    exp = found[0]
    if exp.spec.hostSelector is None:
        raise DocumentError([Problem(path, "spec.hostSelector", "required by the control plane: name the "
                                     "hosts to run on (stortune-agent tune runs one without it)")])
    return exp.document()


def host_line(host: JSON, metric: str) -> str:
    """One host's live progress: trial k of n, the values under test, the metric so far, the leader."""
    progress = _obj(host, "progress")
    name, state = host.get("host"), host.get("state")
    if state in ("queued",) or not progress:
        return f"{name}: {state} ({host.get('message', '')})"
    parts = [f"{name}: trial {progress.get('trial', '?')} of ~{progress.get('total', '?')}"]
    if state == "running" and progress.get("testing"):
        parts.append(f"testing {_point(progress.get('testing'))} ({progress.get('purpose', '')})")
    last = _obj(progress, "last")
    if last:
        value = _human(metric, last.get("value")) if last.get("ok") else "failed"
        parts.append(f"last {_point(last.get('point'))}: {value}")
    if progress.get("leader"):
        margin = _num(progress.get("marginPct"))
        parts.append(f"leader {_point(progress.get('leader'))} {_human(metric, progress.get('leaderMean'))}"
                     + (f" ({margin:+.1f}% vs runner-up)" if margin is not None else ""))
    if state not in ("running",):
        parts.append(str(state))
    return "  ".join(parts)


def _metric(doc: JSON) -> str:
    return str(_obj(_obj(doc, "spec"), "objective").get("metric", "read_bandwidth"))


def follow(client: Client, out: Output, exp_id: str, poll: float,
           sleep: Callable[[float], None] = time.sleep) -> JSON:
    """Poll until the experiment ends, printing each host's progress when it changes."""
    shown: dict[str, str] = {}
    while True:
        doc = client.get_experiment(exp_id)
        status = _obj(doc, "status")
        metric = _metric(doc)
        for host in _dicts(status.get("hosts")):
            line = host_line(host, metric)
            if shown.get(str(host.get("host"))) != line:
                shown[str(host.get("host"))] = line
                out.line(line, "cyan" if host.get("state") == "running" else "")
        if status.get("state") in ENDED:
            return doc
        sleep(poll)


def _run(args: argparse.Namespace, client: Client, out: Output) -> int:
    document = _read(args.filename)
    as_document = args.output != "table"
    if args.dry_run:
        preview = client.preview_experiment(document)
        if as_document:
            out.dump(preview, args.output)
        else:
            _show_plan(out, preview)
        return EXIT_OK
    created = client.start_experiment(document)
    exp_id = str(_obj(created, "metadata").get("uid"))
    said = Output(out.err, out.err) if as_document else out
    hosts = ", ".join(str(h.get("host")) for h in _dicts(_obj(created, "status").get("hosts")))
    said.line(f"tuningexperiment/{exp_id} queued on {hosts}")
    if not args.wait:
        if as_document:
            out.dump(created, args.output)
        return EXIT_OK
    final = follow(client, said, exp_id, args.poll)
    if as_document:
        out.dump(final, args.output)
    else:
        summarize(out, final)
    return EXIT_OK if _obj(final, "status").get("state") == "done" else EXIT_ERROR


def _show_plan(out: Output, preview: JSON) -> None:
    for host in _dicts(preview.get("hosts")):
        beneath = host.get("beneath") or []
        out.line(f"host/{host.get('host')}: device {host.get('device')}"
                 + (f" (beneath: {', '.join(map(str, beneath))})" if beneath else ""), "bold")
        out.line(f"  baseline (the values in effect now): {_point(host.get('baseline'))}")
        for p in _dicts(host.get("parameters")):
            out.line(f"  {p.get('key')}: {', '.join(str(v) for v in p.get('values') or [])}")
        out.line(f"  grid {host.get('gridSize')} point(s); about {host.get('estimatedTrials')} trial(s) "
                 "(the search adapts to what it measures)")
        out.line("  " + hold_line(_num(host.get("trialSeconds")), _num(host.get("estimatedSeconds")),
                                  _num(host.get("durationSeconds"))))
        out.table(["TRIAL", "VALUES", "PURPOSE", "WHY"], [
            [str(int(t.get("index", 0)) + 1), _point(t.get("point")), str(t.get("purpose")),
             str(t.get("reason"))] for t in _dicts(host.get("trials"))], indent=2)


def summarize(out: Output, doc: JSON) -> None:
    """How the experiment ended, what it recommends with the evidence, and what to do next."""
    status = _obj(doc, "status")
    exp_id = _obj(doc, "metadata").get("uid")
    state = str(status.get("state"))
    out.line(f"tuningexperiment/{exp_id}: {state} ({status.get('reason', '')})",
             "green" if state == "done" else "red")
    outcome = _obj(status, "outcome")
    if not outcome:
        out.line("  no trial was recorded: nothing to recommend")
        return
    metric = str(outcome.get("metric", _metric(doc)))
    rec = _obj(outcome, "recommendation")
    gain = _obj(rec, "gain")
    if rec.get("keepCurrent"):
        out.line(f"  recommendation: keep the current settings ({_point(rec.get('values'))}): "
                 f"{rec.get('reason')}", "yellow")
    else:
        out.line(f"  recommendation: {_point(rec.get('values'))}", "green")
        verdict = "significant" if rec.get("significant") else "not significant"
        out.line(f"  gain in {metric}: {_pct(gain.get('pct'))} (95% interval {_pct(gain.get('low'))}.."
                 f"{_pct(gain.get('high'))}), {verdict}")
    baseline = _obj(outcome, "baseline")
    if baseline.get("reliable") is False:
        out.line(f"  UNRELIABLE: {baseline.get('reason')}", "red")
    effects = _obj(outcome, "effects")
    if effects:
        out.line("  effect per parameter: " + ", ".join(
            f"{k} {'-' if _num(v) is None else f'{_num(v):.1f}%'}" for k, v in effects.items()))
    if outcome.get("perHost"):
        holds = outcome.get("holdsEverywhere")
        out.line(f"  fleet: {'holds on every host' if holds else 'does NOT hold on every host'}",
                 "green" if holds else "yellow")
        for host, own in _obj(outcome, "perHost").items():
            own_rec = _obj(own, "recommendation")
            own_gain = _obj(own_rec, "gain")
            out.line(f"    {host}: " + ("keep current" if own_rec.get("keepCurrent") else
                                        f"{_point(own_rec.get('values'))} {_pct(own_gain.get('pct'))}"))
    rows = trial_rows(outcome, metric)
    if rows:
        out.table(["VALUES", "N", "MEAN", "95% INTERVAL", "FEASIBLE"], rows, indent=2)
    out.line("  next:")
    out.line(f"    stortune tune profile {exp_id} -o profile.yaml   the recommendation as a StorageProfile")
    out.line(f"    stortune tune plot {exp_id} -o values.svg        {metric} by value, with error bars")


def trial_rows(outcome: JSON, metric: str) -> list[Row]:
    rows: list[Row] = []
    best = _obj(_obj(outcome, "recommendation"), "values")
    for t in _dicts(outcome.get("trials")):
        interval = f"{_human(metric, t.get('ci95_low'))}..{_human(metric, t.get('ci95_high'))}"
        mark = t.get("point") == best
        rows.append([Cell(_point(t.get("point")) + (" *" if mark else ""), "green" if mark else ""),
                     str(t.get("n", "-")), _human(metric, t.get("mean")), interval,
                     "yes" if t.get("feasible", True) else
                     "no: " + "; ".join(map(str, t.get("violations") or []))])
    return rows


# -- list, show, cancel --------------------------------------------------------------------------------
def _list(args: argparse.Namespace, client: Client, out: Output) -> int:
    listing = client.list_experiments(name=args.name, state=args.state, limit=args.limit)
    items = _dicts(listing.get("items"))
    if args.output != "table":
        out.dump(listing, args.output)
        return EXIT_OK
    if not items:
        out.note("No experiments found.")
        return EXIT_OK
    rows: list[Row] = []
    for doc in items:
        status = _obj(doc, "status")
        hosts = _dicts(status.get("hosts"))
        progress = "; ".join(f"{h.get('host')} {_obj(h, 'progress').get('trial', '-')}/"
                             f"{_obj(h, 'progress').get('total', '-')}" for h in hosts)
        rows.append([str(_obj(doc, "metadata").get("uid")), str(_obj(doc, "metadata").get("name")),
                     str(status.get("state")), progress, str(status.get("reason", ""))])
    out.table(["ID", "NAME", "STATE", "TRIALS", "REASON"], rows)
    return EXIT_OK


def _show(args: argparse.Namespace, client: Client, out: Output) -> int:
    doc = client.get_experiment(args.id)
    if args.output != "table":
        out.dump(doc, args.output)
        return EXIT_OK
    status = _obj(doc, "status")
    metric = _metric(doc)
    for host in _dicts(status.get("hosts")):
        out.line(host_line(host, metric))
    trials = _dicts(status.get("trials"))
    if trials:
        out.table(["HOST", "TRIAL", "VALUES", "PURPOSE", "STATE", metric.upper(), "RUN"], [
            [str(t.get("host")), str(int(t.get("index", 0)) + 1), _point(t.get("point")),
             str(t.get("purpose")), str(t.get("state")), _measured(t, metric), str(t.get("runId"))]
            for t in trials])
    summarize(out, doc)
    winner_bottlenecks(out, client, doc)
    return EXIT_OK


def winner_runs(doc: JSON) -> list[tuple[str, str]]:
    """(host, run id) of the last successful trial of the recommended values on each host."""
    status = _obj(doc, "status")
    best = _obj(_obj(_obj(status, "outcome"), "recommendation"), "values")
    latest: dict[str, str] = {}
    for t in _dicts(status.get("trials")):
        if best and t.get("point") == best and t.get("runId") and _obj(t, "measurement").get("ok"):
            latest[str(t.get("host"))] = str(t.get("runId"))
    return sorted(latest.items())


def winner_bottlenecks(out: Output, client: Client, doc: JSON) -> None:
    """The evidence behind the recommendation: where its benchmark run hit the limit."""
    for host, run_id in winner_runs(doc):
        try:
            result = client.get_benchmark_run(run_id).result or {}
        except ClientError as exc:
            out.line(f"  where the limit is at the recommendation on {host}: {exc}", "yellow")
            continue
        lines = verdict_lines(result)
        if lines:
            out.line(f"  where the limit is at the recommendation on {host} (run {run_id}):")
            for text, style in lines:
                out.line(f"    {text}", style)


def _measured(trial: JSON, metric: str) -> str:
    measurement = _obj(trial, "measurement")
    if measurement.get("ok"):
        return _human(metric, _obj(measurement, "metrics").get(metric))
    return str(trial.get("message") or "-")


def _cancel(args: argparse.Namespace, client: Client, out: Output) -> int:
    doc = client.cancel_experiment(args.id)
    state = _obj(doc, "status").get("state")
    if args.wait and state not in ENDED:
        doc = follow(client, Output(out.err, out.err), args.id, args.poll)
        state = _obj(doc, "status").get("state")
    out.line(f"tuningexperiment/{args.id} {state if state in ENDED else 'cancelling'}")
    return EXIT_OK


# -- plot, profile --------------------------------------------------------------------------------------
def _plot(args: argparse.Namespace, client: Client, out: Output) -> int:
    target = Path(args.output)
    fmt = target.suffix.lower().removeprefix(".")
    if fmt not in ("png", "svg"):
        raise TuneUsageError(f"-o {args.output}: the file must end in .png or .svg")
    data = client.experiment_chart(args.id, kind=args.kind, fmt=fmt)
    _write(target, data, "-o")
    out.line(f"{target}: {args.kind} chart of experiment {args.id}")
    return EXIT_OK


def _write(target: Path, data: bytes, flag: str) -> None:
    try:
        target.write_bytes(data)
    except OSError as exc:
        raise TuneUsageError(f"{flag} {target}: {exc.strerror or exc}") from None


def _profile(args: argparse.Namespace, client: Client, out: Output) -> int:
    text = client.experiment_profile(args.id)
    if args.output:
        _write(Path(args.output), text.encode("utf-8"), "-o")
        out.note(f"{args.output}: the recommended StorageProfile of experiment {args.id}")
    else:
        out.line(text.rstrip("\n"))
    if args.apply:
        data = yaml.safe_load(text)
        where = f"experiment {args.id}"
        manifest = Manifest(args.output or where, parse_profile(data, where))
        outcome = sync.apply(client, manifest, dry_run=False)
        if args.output:
            out.line(f"{manifest.ref} {outcome.action}")
        else:  # stdout holds the profile alone
            out.note(f"{manifest.ref} {outcome.action}")
    return EXIT_OK


_ACTIONS: Final[dict[str, Callable[[argparse.Namespace, Client, Output], int]]] = {
    "run": _run, "list": _list, "show": _show, "cancel": _cancel, "plot": _plot, "profile": _profile,
}

__all__: Sequence[str] = ("add_parser", "command")
