"""``stortune bench``: benchmark runs through the control plane.

    bench run -f SPEC.yaml [--host NAME] [--wait|--no-wait] [--dry-run] [-o table|yaml|json]
    bench list [--host H] [--name N] [--state S] [--schedule S] [--limit N]
    bench show ID [-o table|yaml|json]
    bench compare A B [-o table|yaml|json] [--all]
    bench cancel ID [--wait]
    bench plot ID -o FILE.png|svg [--kind threads|latency]
    bench plot --compare A B -o FILE.png|svg [--metric bandwidth|iops|lat_p99|lat_mean]
    bench baseline set NAME --run ID [--hosts SELECTOR] | show [NAME] | delete NAME
    bench schedule create NAME --cron EXPR -f SPEC.yaml [--suspend] | list | delete NAME

Exit codes: ``run`` 0 when every run is done (and its thresholds pass), 2 when a
threshold failed, 1 when a run failed or was cancelled; ``compare`` 0 when no
objective metric (what a step is for: schemas.bench.objectives) got worse beyond
the noise, 2 when one did (a CI gate, and it names them); 1 for any error, a bad
argument named.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from pydantic import ValidationError
from rich.progress import BarColumn, Progress, TaskID, TaskProgressColumn, TextColumn

from stortune.cli.client import JSON, BenchmarkRun, Client, ClientError
from stortune.cli.render import Cell, Output, Row, age
from stortune.schemas.analysis import verdict as bottleneck_verdict
from stortune.schemas.analysis.model import Bottleneck, PathShare, SlowMember
from stortune.schemas.bench import metrics
from stortune.schemas.bench.objectives import objectives, threshold_globs
from stortune.schemas.bench.spec import load_benchmark
from stortune.schemas.bench.stats import noise_interval
from stortune.schemas.bench.steps import WorkloadStep

EXIT_OK: Final = 0
EXIT_ERROR: Final = 1
EXIT_FAILED_CHECK: Final = 2
POLL_SECONDS: Final = 1.0
PLOT_FORMATS: Final = (".png", ".svg")

BENCH_HELP: Final = """\
Run fio benchmarks on hosts through the control plane and judge the results.

A run is queued per host the spec's hostSelector matches (or for --host alone);
a host runs one benchmark at a time, in order, and profile applies wait while
it does. Results keep fio's raw output, the normalised metrics (bandwidth,
IOPS, latency mean and p50/p95/p99/p99.9, CPU) and everything in effect: every
tunable value on the target and beneath it, profile generations, topology,
kernel and fio versions.

  stortune bench run -f seq.yaml                   # a BenchmarkSpec with spec.hostSelector
  stortune bench compare RUN_BEFORE RUN_AFTER      # exit 2 on a regression of what a step is for
  stortune bench baseline set r750-ref --run ID --hosts model=r750
  stortune bench plot ID -o threads.svg

exit codes: run: 0 done, 2 a threshold failed, 1 failed or cancelled;
            compare: 0 no objective metric worse beyond the noise, 2 one is; 1 any error
"""


class BenchUsageError(Exception):
    """A bad argument: the message names it."""


# -- the parser ---------------------------------------------------------------------------------
def add_parser(sub: Any, *, connection_options: Callable[..., None], parser_class: type[Any]) -> None:
    raw = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser("bench", help="run, list, show, compare, cancel and plot benchmarks",
                       description=BENCH_HELP, formatter_class=raw)
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=parser_class)

    def action(name: str, text: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = actions.add_parser(name, help=text, description=text)
        connection_options(parser, top=False)
        return parser

    a = action("run", "queue a BenchmarkSpec on the hosts it selects; follow it to its end")
    a.add_argument("-f", "--filename", required=True, metavar="SPEC.yaml", help="the spec (- for stdin)")
    a.add_argument("--host", help="run on this host only (default: the spec's hostSelector)")
    a.add_argument("--wait", action=argparse.BooleanOptionalAction, default=True,
                   help="follow the runs with a progress display until they end (default: --wait)")
    a.add_argument("--dry-run", action="store_true", help="show the hosts and expanded steps; queue nothing")
    a.add_argument("-o", "--output", choices=("table", "yaml", "json"), default="table",
                   help="table: progress, then a summary per run; json|yaml: the runs with their results "
                        "on stdout (the queued runs with --no-wait, the plan with --dry-run), progress "
                        "on stderr")
    a.add_argument("--poll", type=seconds, default=POLL_SECONDS, help=argparse.SUPPRESS)

    a = action("list", "runs, newest first")
    a.add_argument("--host")
    a.add_argument("--name", help="the spec's metadata.name")
    a.add_argument("--state", choices=("queued", "running", "done", "failed", "cancelled"))
    a.add_argument("--schedule")
    a.add_argument("--limit", type=int)
    a.add_argument("-o", "--output", choices=("table", "yaml", "json"), default="table")

    a = action("show", "one run: metrics by step, iozone tables, devices, context, verdict")
    a.add_argument("id")
    a.add_argument("-o", "--output", choices=("table", "yaml", "json"), default="table")

    a = action("compare", "B against A: change per step and metric, and whether it exceeds the noise")
    a.add_argument("a", metavar="A", help="the run before (or the reference)")
    a.add_argument("b", metavar="B", help="the run after")
    a.add_argument("-o", "--output", choices=("table", "yaml", "json"), default="table")
    a.add_argument("--all", action="store_true",
                   help="list every metric (default: those each step is for; the others are counted)")

    a = action("cancel", "cancel a run (its agent kills fio; what finished is kept)")
    a.add_argument("id")
    a.add_argument("--wait", action=argparse.BooleanOptionalAction, default=True,
                   help="wait until the run has stopped (default: --wait)")
    a.add_argument("--poll", type=seconds, default=POLL_SECONDS, help=argparse.SUPPRESS)

    a = action("plot", "a chart, PNG or SVG by the file's suffix")
    a.add_argument("id", nargs="?", help="the run (or give --compare A B)")
    a.add_argument("--compare", nargs=2, metavar=("A", "B"), help="before/after bars of two runs")
    a.add_argument("-o", "--output", required=True, metavar="FILE.png|FILE.svg")
    a.add_argument("--kind", choices=("threads", "latency"), default="threads",
                   help="threads: bandwidth by thread count per workload; latency: percentiles per step")
    a.add_argument("--metric", choices=("bandwidth", "iops", "lat_p99", "lat_mean"), default="bandwidth",
                   help="what the --compare bars show (default bandwidth)")

    a = action("baseline", "set, show or delete the reference run of a class of hosts")
    a.add_argument("verb", choices=("set", "show", "delete"))
    a.add_argument("name", nargs="?")
    a.add_argument("--run", help="set: the finished run that is the reference")
    a.add_argument("--hosts", metavar="SELECTOR",
                   help="set: the class of hosts, e.g. model=r750 (default: the run's hostSelector)")
    a.add_argument("--description", default="")
    a.add_argument("-o", "--output", choices=("table", "yaml", "json"), default="table")

    a = action("schedule", "create, list or delete cron schedules of a BenchmarkSpec")
    a.add_argument("verb", choices=("create", "list", "delete"))
    a.add_argument("name", nargs="?")
    a.add_argument("--cron", metavar="EXPR", help="create: five fields, UTC, e.g. '0 3 * * *'")
    a.add_argument("-f", "--filename", metavar="SPEC.yaml", help="create: the spec (with hostSelector)")
    a.add_argument("--suspend", action="store_true", help="create it suspended")
    a.add_argument("-o", "--output", choices=("table", "yaml", "json"), default="table")


def seconds(text: str) -> float:
    """An argparse type: a positive number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be more than 0")
    return value


def command(args: argparse.Namespace, client: Client, out: Output) -> int:
    handler = _ACTIONS[args.action]
    try:
        return handler(args, client, out)
    except BenchUsageError as exc:
        out.error(str(exc))
        return EXIT_ERROR


# -- formatting ------------------------------------------------------------------------------
def _human(metric: str, value: float | None) -> str:
    return "-" if value is None else metrics.get(metric).human(value)


def _pct(value: Any) -> str:
    return f"{value:.1f}%" if isinstance(value, int | float) and not isinstance(value, bool) else "-"


def _rate(progress: JSON) -> str:
    bandwidth = _num(progress.get("readBytesPerSecond")) + _num(progress.get("writeBytesPerSecond"))
    iops = _num(progress.get("readIops")) + _num(progress.get("writeIops"))
    if not bandwidth and not iops:
        return ""
    return f"{bandwidth / 1e6:.1f} MB/s  {iops:,.0f} IOPS"


def _num(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _state_cell(run: BenchmarkRun) -> Cell:
    style = {"done": "green", "failed": "red", "cancelled": "yellow", "running": "cyan"}.get(run.state, "")
    if run.state == "done" and run.passed is False:
        return Cell("done (thresholds failed)", "red")
    return Cell(run.state + (" (cancelling)" if run.cancel_requested and not run.ended else ""), style)


def _obj(data: JSON, key: str) -> JSON:
    """``data[key]`` when it is an object, else an empty one (documents are read tolerantly)."""
    value = data.get(key)
    return value if isinstance(value, dict) else {}


def _dicts(value: Any) -> list[JSON]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _when(moment: datetime | None) -> str:
    return "-" if moment is None else f"{moment.astimezone(UTC):%Y-%m-%d %H:%M:%SZ}"


# -- run ---------------------------------------------------------------------------------------
def _read_spec(path: str) -> JSON:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise BenchUsageError(f"-f {path}: {exc.strerror or exc}") from None
    # Checked here first (a DocumentError names the field), so nothing invalid is sent.
    return load_benchmark(text, "<stdin>" if path == "-" else path).document()


def _run(args: argparse.Namespace, client: Client, out: Output) -> int:
    document = _read_spec(args.filename)
    as_document = args.output != "table"
    if args.dry_run:
        preview = client.preview_benchmarks(document, host=args.host)
        # A refusal the run would meet fails the dry run too (exit 1), as the agent's own does.
        refused = any(h.get("refusals") for h in _dicts(preview.get("hosts")))
        if as_document:
            out.dump(preview, args.output)
            return EXIT_ERROR if refused else EXIT_OK
        for host in _dicts(preview.get("hosts")):
            out.line(f"host/{host.get('host')}: target {host.get('target') or '?'}", "bold")
            for problem in host.get("problems") or []:
                out.warn(f"{host.get('host')}: {problem}")
            for refusal in host.get("refusals") or []:
                out.error(f"{host.get('host')}: refused: {refusal}")
            out.table(["STEP", "PATTERN", "BLOCK", "IODEPTH", "JOBS", "DIRECT", "RUNTIME", "REPEATS"], [
                [str(s.get("name")), str(s.get("pattern")), str(s.get("block_size") or "split"),
                 str(s.get("iodepth")), str(s.get("numjobs")), str(s.get("direct")),
                 f"{s['runtime']:g}s" if isinstance(s.get("runtime"), int | float) else "-",
                 str(s.get("repeats"))]
                for s in _dicts(host.get("steps"))], indent=2)
        return EXIT_ERROR if refused else EXIT_OK
    queued = client.start_benchmarks(document, host=args.host)
    runs = queued.items
    # With -o json|yaml stdout holds the document alone: what goes by is said on stderr.
    said = Output(out.err, out.err) if as_document else out
    for run in runs:
        said.line(f"benchmarkrun/{run.id} queued on {run.host}")
    if not args.wait:
        if as_document:
            out.dump(queued.raw, args.output)
        return EXIT_OK
    final = _follow(client, said, [r.id for r in runs], args.poll)
    if as_document:
        out.dump({"apiVersion": "stortune/v1", "kind": "BenchmarkRunList", "items": [r.raw for r in final]},
                 args.output)
    else:
        for run in final:
            summarize_run(out, run, client)
    if any(r.state != "done" for r in final):
        return EXIT_ERROR
    if any(r.passed is False for r in final):
        return EXIT_FAILED_CHECK
    return EXIT_OK


def run_message(run: BenchmarkRun) -> str:
    """The run's message without the state it repeats ('done: 36 step run(s)' of a done run)."""
    message = run.message.strip()
    if message == run.state:
        return ""
    return message.removeprefix(f"{run.state}:").strip()


def _steps(result: JSON) -> list[WorkloadStep]:
    steps = []
    for item in _dicts(result.get("steps")):
        try:
            steps.append(WorkloadStep.model_validate(item))
        except ValidationError:
            continue  # a step this client cannot read is shown by `bench show`, not summarised
    return steps


def objective_rows(result: JSON) -> tuple[list[str], list[Row], list[str]]:
    """Per step, what it is for (schemas.bench.objectives): mean ± stdev, CV, repeats; and the
    noisy ones among them, each with its CV."""
    spec = _obj(result, "spec")
    wanted = objectives(_steps(result), threshold_globs(spec))
    summaries = {str(s.get("step")): _obj(s, "metrics") for s in _dicts(result.get("summaries"))}
    rows: list[Row] = []
    noisy: list[str] = []
    for step, names in wanted.items():
        by_metric = summaries.get(step, {})
        shown = [(m, by_metric[m]) for m in names if isinstance(by_metric.get(m), dict)]
        for index, (metric, found) in enumerate(shown):
            cv = found.get("cv")
            cv_text = _pct(100 * cv) if isinstance(cv, int | float) else "-"
            loud = found.get("noisy") is True
            if loud:
                noisy.append(f"{step} {metric} (CV {cv_text})")
            rows.append([step if index == 0 else "", metric, _summary(found, metric, spread=True),
                         Cell(cv_text + (" noisy" if loud else ""), "yellow" if loud else ""),
                         str(found.get("n", "-"))])
    return ["STEP", "METRIC", "MEAN ± STDEV", "CV", "N"], rows, noisy


def summarize_run(out: Output, run: BenchmarkRun, client: Client) -> None:
    """How a run ended, its key figures and verdict, and where to look next."""
    ok = run.state == "done" and run.passed is not False
    message = run_message(run)
    out.line(f"benchmarkrun/{run.id} on {run.host}: {run.state}" + (f" ({message})" if message else ""),
             "green" if ok else "red")
    result = run.result or {}
    headers, rows, noisy = objective_rows(result)
    if rows:
        repeats = {str(r[-1]) for r in rows}
        over = f"over {repeats.pop()} repeat(s)" if len(repeats) == 1 else "over the repeats"
        out.line(f"  what each step is for (mean ± stdev {over}):")
        out.table(headers, rows, indent=2)
    verdict = result.get("verdict") if isinstance(result.get("verdict"), dict) else None
    if verdict is not None:
        outcomes = _dicts(verdict.get("outcomes"))
        failed = [o for o in outcomes if o.get("passed") is not True]
        out.line(f"  thresholds: {len(outcomes) - len(failed)} of {len(outcomes)} met",
                 "red" if failed else "green")
        for outcome in failed:
            out.line(f"    FAIL  {outcome.get('message')}", "red")
    if noisy:
        out.line(f"  noisy (CV above 5%: add repeats, or quiet the host): {'; '.join(noisy)}", "yellow")
    if run.state == "done":
        try:
            judgement = client.benchmark_judgement(run.id)
        except ClientError:  # an extra: the run's own outcome and exit code stand without it
            judgement = {}
        if judgement.get("baseline"):
            worse = regressions(_dicts(judgement.get("rows")))
            base = _obj(judgement, "baselineRun")
            out.line(f"  against baseline {judgement['baseline']} (run {base.get('id')}): "
                     + (f"{len(worse)} objective metric(s) worse: " + "; ".join(_why(r) for r in worse)
                        if worse else "no objective metric worse beyond the noise"),
                     "red" if worse else "green")
    out.line("  next:")
    out.line(f"    stortune bench show {run.id}            every metric, devices (slowest marked), "
             "settings in effect")
    if rows:
        out.line(f"    stortune bench plot {run.id} -o {run.id}.svg   bandwidth by threads "
                 "(--kind latency: percentiles)")
        out.line(f"    stortune bench compare EARLIER {run.id}   against an earlier run of {run.name} "
                 f"(stortune bench list --name {run.name})")


def _follow(client: Client, out: Output, ids: Sequence[str], poll: float,
            sleep: Callable[[float], None] = time.sleep) -> list[BenchmarkRun]:
    """Poll the runs until all have ended: a live progress bar per run on a terminal, a line per
    change of state or step (or 10% more done) when piped."""
    latest = {run_id: client.get_benchmark_run(run_id) for run_id in ids}
    console = out.console
    if console is None:
        shown: dict[str, tuple[str, str, int]] = {}

        def report(run: BenchmarkRun) -> None:
            percent = _num(run.progress.get("percent"))
            key = (run.state, str(run.progress.get("message") or ""), int(percent // 10))
            if shown.get(run.id) != key:
                shown[run.id] = key
                parts = [f"{run.id} {run.host}: {run.state}", f"{percent:.0f}%",
                         str(run.progress.get("message") or run.message), _rate(run.progress)]
                out.line("  ".join(p for p in parts if p))

        while True:
            for run in latest.values():
                report(run)
            if all(r.ended for r in latest.values()):
                return list(latest.values())
            sleep(poll)
            latest = {i: latest[i] if latest[i].ended else client.get_benchmark_run(i) for i in ids}

    columns = (TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
               TextColumn("{task.fields[rate]}"), TextColumn("{task.fields[step]}"))
    with Progress(*columns, console=console) as progress:
        tasks: dict[str, TaskID] = {i: progress.add_task(f"{r.host} {r.id}", total=100, rate="", step=r.state)
                                    for i, r in latest.items()}
        while True:
            for run_id, run in latest.items():
                step = str(run.progress.get("message") or run.message or run.state)
                progress.update(tasks[run_id], completed=100 if run.state == "done"
                                else _num(run.progress.get("percent")),
                                rate=_rate(run.progress) if not run.ended else "",
                                step=step if not run.ended else run.state)
            if all(r.ended for r in latest.values()):
                return list(latest.values())
            sleep(poll)
            latest = {i: latest[i] if latest[i].ended else client.get_benchmark_run(i) for i in ids}


# -- list, show --------------------------------------------------------------------------------
def run_rows(runs: Iterable[BenchmarkRun]) -> tuple[list[str], list[Row]]:
    rows: list[Row] = []
    for r in runs:
        progress = f"{_num(r.progress.get('percent')):.0f}%" if r.state == "running" else ""
        rows.append([r.id, r.name, r.host, _state_cell(r), progress, age(r.created), r.message])
    return ["ID", "NAME", "HOST", "STATE", "PROGRESS", "AGE", "MESSAGE"], rows


def _list(args: argparse.Namespace, client: Client, out: Output) -> int:
    listing = client.list_benchmark_runs(host=args.host, name=args.name, state=args.state,
                                         schedule=args.schedule, limit=args.limit)
    if args.output != "table":
        out.dump(listing.raw, args.output)
    elif listing.items:
        out.table(*run_rows(listing.items))
    else:
        out.note("No benchmark runs found.")
    return EXIT_OK


#: Columns of the per-step table: (header, metric suffix), per direction.
_STEP_COLUMNS: Final = (("BANDWIDTH", "bandwidth"), ("IOPS", "iops"), ("LAT MEAN", "lat_mean"),
                        ("P50", "lat_p50"), ("P95", "lat_p95"), ("P99", "lat_p99"), ("P99.9", "lat_p999"))


def _summary(found: JSON, metric: str, *, spread: bool = False) -> str:
    mean = found.get("mean")
    if not isinstance(mean, int | float):
        return "-"
    text = _human(metric, float(mean))
    stdev = found.get("stdev")
    if spread and isinstance(stdev, int | float) and found.get("n", 1) != 1:
        text += f" ± {_human(metric, float(stdev))}"
    return text


def _noisy(by_metric: JSON, direction: str) -> list[str]:
    """'P99 CV 12.0%' for each figure of the row whose repeats were noisy (CV above 5%)."""
    found = []
    for header, suffix in _STEP_COLUMNS:
        summary = by_metric.get(f"{direction}_{suffix}")
        if isinstance(summary, dict) and summary.get("noisy") is True:
            cv = summary.get("cv")
            found.append(f"{header} CV {100 * cv:.1f}%" if isinstance(cv, int | float) else header)
    return found


def step_rows(result: JSON) -> tuple[list[str], list[Row], list[str]]:
    """One row per step and direction: mean ± stdev of bandwidth, IOPS and latencies, the
    bandwidth's CV and the figures that were noisy; and per noisy row, each such figure's CV."""
    headers = ["STEP", "DIR", *(h for h, _ in _STEP_COLUMNS), "CV", "N"]
    rows: list[Row] = []
    notes: list[str] = []
    for summary in _dicts(result.get("summaries")):
        by_metric = _obj(summary, "metrics")
        for direction in ("read", "write"):
            if f"{direction}_bandwidth" not in by_metric:
                continue
            cells: list[str | Cell] = [str(summary.get("step")), direction]
            for index, (_, suffix) in enumerate(_STEP_COLUMNS):
                metric = f"{direction}_{suffix}"
                found = by_metric.get(metric)
                cells.append(_summary(found, metric, spread=index == 0) if isinstance(found, dict) else "-")
            main = by_metric[f"{direction}_bandwidth"]
            noisy = _noisy(by_metric, direction)
            cv = _pct(100 * main["cv"]) if isinstance(main.get("cv"), int | float) else "-"
            # the figures that made the row noisy, by name: not only the bandwidth's CV shown here
            named = [n.split(" CV ")[0] for n in noisy]
            which = ", ".join(named) if len(named) <= 2 else f"{len(named)} figures"
            cells.append(Cell(f"{cv} NOISY: {which}", "yellow") if noisy else cv)
            cells.append(str(main.get("n", "-")))
            rows.append(cells)
            if noisy:
                notes.append(f"{summary.get('step')} {direction}: {', '.join(noisy)}")
    return headers, rows, notes


def iozone_rows(table: JSON) -> tuple[list[str], list[Row]]:
    phases = [str(p) for p in table.get("phases") or []]
    rows: list[Row] = []
    for row in _dicts(table.get("rows")):
        bandwidth = _obj(row, "bandwidth")
        noisy = row.get("noisy") or []
        cells: list[str | Cell] = [str(row.get("threads"))]
        for phase in phases:
            value = bandwidth.get(phase)
            text = f"{value / 1e6:.1f}" if isinstance(value, int | float) else "-"
            cells.append(Cell(text + " ~noisy", "yellow") if phase in noisy else text)
        rows.append(cells)
    return ["THREADS", *(f"{p.upper()} MB/s" for p in phases)], rows


def device_rows(result: JSON) -> tuple[list[str], list[Row], list[str]]:
    """Per step and device, the mean over the step's repeats of what iostat -x shows; slowest marked."""
    gathered: dict[tuple[str, str], list[JSON]] = {}
    relation: dict[tuple[str, str], str] = {}
    for run in _dicts(result.get("runs")):
        for device in _dicts(run.get("devices")):
            key = (str(run.get("step")), str(device.get("device")))
            gathered.setdefault(key, []).append(device)
            relation[key] = str(device.get("relation", ""))

    def mean(samples: list[JSON], name: str, scale: float = 1.0) -> str:
        values = [float(s[name]) for s in samples if isinstance(s.get(name), int | float)]
        return f"{sum(values) / len(values) * scale:,.1f}" if values else "-"

    rows: list[Row] = []
    styles: list[str] = []
    for (step, name), samples in gathered.items():
        slowest = any(s.get("slowest") is True for s in samples)
        rows.append([step, name + (" SLOWEST" if slowest else ""), relation[(step, name)],
                     mean(samples, "read_iops"), mean(samples, "write_iops"),
                     mean(samples, "read_bytes_per_s", 1e-6), mean(samples, "write_bytes_per_s", 1e-6),
                     mean(samples, "await_ms"), mean(samples, "queue_depth"), mean(samples, "util_percent")])
        styles.append("red" if slowest else "")
    return (["STEP", "DEVICE", "RELATION", "R/S", "W/S", "RMB/S", "WMB/S", "AWAIT MS", "AQU-SZ", "UTIL%"],
            rows, styles)


def verdict_lines(result: JSON) -> list[tuple[str, str]]:
    """The bottleneck per step, slow members and unbalanced paths of a stored result (results
    stored before the verdict existed have none: no lines)."""
    try:
        return bottleneck_verdict.lines(
            [Bottleneck.model_validate(b) for b in _dicts(result.get("bottlenecks"))],
            [SlowMember.model_validate(m) for m in _dicts(result.get("slow_members"))],
            [PathShare.model_validate(s) for s in _dicts(result.get("balance"))])
    except ValidationError:  # a newer server's shape: show the rest of the run rather than fail
        return []


def render_run(out: Output, run: BenchmarkRun, judgement: JSON | None = None) -> None:
    def field(name: str, text: str) -> None:
        out.line(f"{name + ':':<16}{text}")

    field("Run", run.id)
    field("Benchmark", run.name)
    field("Host", run.host)
    message = run_message(run)
    out.line(f"{'State:':<16}{_state_cell(run).text}" + (f"  ({message})" if message else ""),
             _state_cell(run).style)
    field("Requested", f"{run.requested_by or '-'}" + (f" (schedule {run.schedule})" if run.schedule else "")
          + f", {_when(run.created)}")
    field("Ran", f"{_when(run.started)} -> {_when(run.finished)}")
    if run.state == "running":
        field("Progress", f"{_num(run.progress.get('percent')):.0f}%  {run.progress.get('message', '')}  "
                          f"{_rate(run.progress)}")
    result = run.result or {}
    context = result.get("context") if isinstance(result.get("context"), dict) else None
    if context is not None:
        target = _obj(context, "target")
        field("Target", f"{target.get('path', '-')} ({target.get('device') or target.get('kind', '')}, "
                        f"{_num(target.get('size_bytes')) / (1 << 30):.2f} GiB)")
        field("Versions", f"kernel {context.get('kernel') or '-'}, {context.get('fio_version') or 'fio ?'}, "
                          f"agent {context.get('agent_version') or '-'}")
        field("Topology", str(context.get("topology_hash") or "-"))
        profiles = _obj(context, "profiles")
        field("Profiles", ", ".join(f"{n} (generation {g})" for n, g in sorted(profiles.items())) or "<none>")
    else:
        ctx = run.context
        field("Versions", f"kernel {ctx.get('kernel') or '-'}, {ctx.get('fioVersion') or 'fio ?'}")

    headers, rows, noisy = step_rows(result)
    if rows:
        out.line("Results (mean ± stdev over the repeats; CV of the bandwidth):")
        out.table(headers, rows, indent=2)
    if noisy:
        out.line("Noisy figures (CV above 5% over the repeats: their means are less certain):", "yellow")
        for note in noisy:
            out.line(f"  {note}", "yellow")
    for table in _dicts(result.get("iozone")):
        out.line(f"Throughput by threads ({table.get('workload')}, iozone style):")
        out.table(*iozone_rows(table), indent=2)
    headers, rows, styles = device_rows(result)
    if rows:
        out.line("Devices (iostat -x over each step, mean of the repeats):")
        out.table(headers, rows, indent=2, row_styles=styles)
    if context is not None:
        settings = _obj(context, "settings")
        setting_rows: list[Row] = [[str(device), str(tunable), "-" if value is None else str(value)]
                                   for device, values in sorted(settings.items()) if isinstance(values, dict)
                                   for tunable, value in sorted(values.items())]
        out.line("Settings in effect when the run started:")
        if setting_rows:
            out.table(["DEVICE", "TUNABLE", "VALUE"], setting_rows, indent=2)
        else:
            out.line("  <none recorded>")
        for warning in context.get("warnings") or []:
            out.line(f"warning: {warning}", "yellow")
    limits = verdict_lines(result)
    if limits:
        out.line("Where the limit is (per step: each layer's load against its ceiling):")
        for text, style in limits:
            out.line(f"  {text}", style)
    verdict = result.get("verdict") if isinstance(result.get("verdict"), dict) else None
    if verdict is not None:
        out.line("Thresholds:")
        for outcome in _dicts(verdict.get("outcomes")):
            ok = outcome.get("passed") is True
            out.line(f"  {'PASS' if ok else 'FAIL'}  {outcome.get('message')}", "green" if ok else "red")
    if judgement is not None and judgement.get("baseline"):
        summary = _obj(judgement, "summary")
        base = _obj(judgement, "baselineRun")
        worse = int(summary.get("worse", 0))
        out.line(f"Against baseline {judgement['baseline']} (run {base.get('id')} on {base.get('host')}): "
                 f"{summary.get('better', 0)} better, {worse} worse, "
                 f"{summary.get('withinNoise', 0)} within noise",
                 "red" if worse else "green")
        worst = regressions(_dicts(judgement.get("rows")))
        if worst:
            out.table(*comparison_rows(worst[:_LISTED]), indent=2)
        if worse > min(len(worst), _LISTED):
            out.line(f"  ... every metric: stortune bench compare {base.get('id')} {run.id} --all")


def _show(args: argparse.Namespace, client: Client, out: Output) -> int:
    run = client.get_benchmark_run(args.id)
    if args.output != "table":
        out.dump(run.raw, args.output)
        return EXIT_OK
    judgement = client.benchmark_judgement(run.id) if run.state == "done" else None
    render_run(out, run, judgement)
    return EXIT_OK


# -- compare -----------------------------------------------------------------------------------
#: Rows of a judgement shown under ``bench show`` (compare --all lists every one).
_LISTED: Final = 12


def _objective(rows: Sequence[JSON]) -> list[JSON]:
    """The rows of what each step is for. A server that does not mark them: every row."""
    if not any("objective" in r for r in rows):
        return list(rows)
    return [r for r in rows if r.get("objective") is True]


def regressions(rows: Sequence[JSON]) -> list[JSON]:
    """Objective rows worse beyond the noise: why `bench compare` exits 2."""
    return [r for r in _objective(rows) if r.get("verdict") == "worse"]


def _side(found: JSON, metric: str) -> Cell:
    """'400.0 MB/s ± 2.0 MB/s', and this metric's own CV when its repeats were noisy."""
    text = _summary(found, metric, spread=True)
    cv = found.get("cv")
    if found.get("noisy") is True and isinstance(cv, int | float):
        return Cell(f"{text} (noisy: CV {100 * cv:.1f}%)", "yellow")
    return Cell(text)


def _noise(row: JSON) -> str:
    """The interval the change must leave to count: '-5.0%..+5.2%'."""
    low, high = row.get("noiseLowPct"), row.get("noiseHighPct")
    if isinstance(low, int | float) and isinstance(high, int | float):
        return noise_interval(float(low), float(high))
    noise = row.get("noisePct")  # a server that gives only the bound on the change's side
    return f"±{noise:.1f}%" if isinstance(noise, int | float) else "-"


def _change(row: JSON) -> str:
    change = row.get("deltaPct")
    return f"{change:+.1f}%" if isinstance(change, int | float) else "n/a"


def comparison_rows(rows: Sequence[JSON]) -> tuple[list[str], list[Row]]:
    out: list[Row] = []
    for row in rows:
        metric = str(row.get("metric"))
        verdict = str(row.get("verdict"))
        style = {"better": "green", "worse": "red"}.get(verdict, "")
        out.append([str(row.get("step")), metric, _side(_obj(row, "a"), metric),
                    _side(_obj(row, "b"), metric), Cell(_change(row), style), _noise(row),
                    Cell(verdict, style)])
    return ["STEP", "METRIC", "A", "B", "CHANGE", "NOISE", "VERDICT"], out


def _why(row: JSON) -> str:
    """'seq-1m/read read_bandwidth -23.1%, outside the noise -5.0%..+5.0%'."""
    return f"{row.get('step')} {row.get('metric')} {_change(row)}, outside the noise {_noise(row)}"


def _compare(args: argparse.Namespace, client: Client, out: Output) -> int:
    body = client.compare_benchmarks(args.a, args.b)
    rows = _dicts(body.get("rows"))
    worse = regressions(rows)
    code = EXIT_FAILED_CHECK if worse else EXIT_OK
    if args.output != "table":
        out.dump(body, args.output)
        return code
    a = _obj(body, "a")
    b = _obj(body, "b")
    out.line(f"A: {a.get('id')} ({a.get('name')} on {a.get('host')})")
    out.line(f"B: {b.get('id')} ({b.get('name')} on {b.get('host')})")
    changes = [str(c) for c in body.get("contextChanges") or []]
    out.line("What differed between the runs:" if changes else "Same settings, versions and topology.")
    for change in changes:
        out.line(f"  {change}")
    objective = _objective(rows)
    leading = {id(r) for r in objective}
    others = [r for r in rows if id(r) not in leading]
    if not rows:
        out.note("the runs have no step and metric in common")
    if objective:
        out.line("What the steps are for (the spec's thresholds; else each step's throughput, and p99 "
                 "latency for random I/O):", "bold")
        out.table(*comparison_rows(objective))
    if others and args.all:
        out.line("Other metrics (they do not set the exit code):", "bold")
        out.table(*comparison_rows(others))
    elif others:
        moved = [r for r in others if r.get("verdict") != "within noise"]
        out.line(f"{len(others)} other metric(s) compared, {len(moved)} of them beyond the noise "
                 "(--all lists them; they do not set the exit code)")
    out.line("CHANGE is of the geometric means of the repeats; it counts when it lies outside NOISE "
             "(the noise rule: docs/benchmarks.md).")
    better = sum(r.get("verdict") == "better" for r in objective)
    if worse:
        out.line(f"exit 2: {len(worse)} objective metric(s) worse beyond the noise:", "red")
        for row in worse:
            out.line(f"  {_why(row)}", "red")
    else:
        out.line(f"no objective metric worse beyond the noise ({better} better, "
                 f"{len(objective) - better} within noise)", "green")
    return code


# -- cancel, plot --------------------------------------------------------------------------------
def _cancel(args: argparse.Namespace, client: Client, out: Output) -> int:
    run = client.cancel_benchmark_run(args.id)
    if run.ended:
        out.line(f"benchmarkrun/{run.id} {run.state}" + (f": {run.message}" if run.message else ""))
        return EXIT_OK
    out.line(f"benchmarkrun/{run.id}: cancel sent to the agent on {run.host}")
    if args.wait:
        (run,) = _follow(client, out, [run.id], args.poll)
        out.line(f"benchmarkrun/{run.id} {run.state}" + (f": {run.message}" if run.message else ""))
    return EXIT_OK


def _plot(args: argparse.Namespace, client: Client, out: Output) -> int:
    target = Path(args.output)
    suffix = target.suffix.lower()
    if suffix not in PLOT_FORMATS:
        raise BenchUsageError(f"-o {args.output}: the file must end in .png or .svg (the chart's format)")
    if (args.id is None) == (args.compare is None):
        raise BenchUsageError("give a run ID, or --compare A B")
    fmt = suffix[1:]
    if args.compare is not None:
        data = client.comparison_plot(args.compare[0], args.compare[1], fmt=fmt, metric=args.metric)
    else:
        data = client.benchmark_plot(args.id, kind=args.kind, fmt=fmt)
    try:
        target.write_bytes(data)
    except OSError as exc:
        raise BenchUsageError(f"-o {args.output}: {exc.strerror or exc}") from None
    out.note(f"wrote {target} ({len(data):,} bytes)")
    return EXIT_OK


# -- baselines, schedules ------------------------------------------------------------------------
def _selector(raw: Any) -> str:
    if not isinstance(raw, dict):
        return "<none>"
    parts = [f"{k}={v}" for k, v in sorted((raw.get("matchLabels") or {}).items())]
    for req in _dicts(raw.get("matchExpressions")):
        op, key, values = req.get("operator"), req.get("key"), ",".join(req.get("values") or [])
        parts.append({"In": f"{key} in ({values})", "NotIn": f"{key} notin ({values})", "Exists": str(key),
                      "DoesNotExist": f"!{key}"}.get(str(op), str(key)))
    return ",".join(parts) or "<none>"


def _baseline(args: argparse.Namespace, client: Client, out: Output) -> int:
    if args.verb == "set":
        if not args.name or not args.run:
            raise BenchUsageError("baseline set NAME --run ID [--hosts SELECTOR]: NAME and --run are "
                                  "required")
        body = client.set_baseline(args.name, args.run, hosts=args.hosts, description=args.description)
        spec = _obj(body, "spec")
        out.line(f"benchmarkbaseline/{args.name} set: run {spec.get('run')} is the reference of "
                 f"{spec.get('benchmark')} on hosts {_selector(spec.get('hostSelector'))}")
        return EXIT_OK
    if args.verb == "delete":
        if not args.name:
            raise BenchUsageError("baseline delete NAME: NAME is required")
        client.delete_baseline(args.name)
        out.line(f"benchmarkbaseline/{args.name} deleted")
        return EXIT_OK
    data = client.get_baseline(args.name) if args.name else client.list_baselines()
    if args.output != "table":
        out.dump(data, args.output)
        return EXIT_OK
    items = [data] if args.name else _dicts(data.get("items"))
    rows: list[Row] = []
    for item in items:
        meta = _obj(item, "metadata")
        spec = _obj(item, "spec")
        rows.append([str(meta.get("name")), str(spec.get("benchmark")), str(spec.get("run")),
                     _selector(spec.get("hostSelector")), str(item.get("setBy", "")),
                     str(spec.get("description") or "")])
    if rows:
        out.table(["NAME", "BENCHMARK", "RUN", "HOSTS", "SET BY", "DESCRIPTION"], rows)
    else:
        out.note("No baselines found.")
    return EXIT_OK


def _schedule(args: argparse.Namespace, client: Client, out: Output) -> int:
    if args.verb == "create":
        if not args.name or not args.cron or not args.filename:
            raise BenchUsageError("schedule create NAME --cron EXPR -f SPEC.yaml: all three are required")
        document = {"apiVersion": "stortune/v1", "kind": "BenchmarkSchedule", "metadata": {"name": args.name},
                    "spec": {"schedule": args.cron, "suspend": args.suspend,
                             "benchmark": _read_spec(args.filename)}}
        body = client.create_schedule(document)
        status = _obj(body, "status")
        upcoming = status.get("nextRunAt") or "(suspended)"
        out.line(f"benchmarkschedule/{args.name} created; next run {upcoming}")
        return EXIT_OK
    if args.verb == "delete":
        if not args.name:
            raise BenchUsageError("schedule delete NAME: NAME is required")
        client.delete_schedule(args.name)
        out.line(f"benchmarkschedule/{args.name} deleted")
        return EXIT_OK
    data = client.list_schedules()
    if args.output != "table":
        out.dump(data, args.output)
        return EXIT_OK
    rows: list[Row] = []
    for item in _dicts(data.get("items")):
        meta = _obj(item, "metadata")
        spec = _obj(item, "spec")
        status = _obj(item, "status")
        benchmark = _obj(spec, "benchmark")
        selector = _obj(benchmark, "spec").get("hostSelector")
        rows.append([str(meta.get("name")), str(spec.get("schedule")), "yes" if spec.get("suspend") else "no",
                     str(status.get("nextRunAt") or "-"), str(status.get("lastFiredAt") or "-"),
                     _selector(selector), str(status.get("lastMessage") or "")])
    if rows:
        out.table(["NAME", "SCHEDULE (UTC)", "SUSPENDED", "NEXT RUN", "LAST FIRED", "HOSTS", "LAST"], rows)
    else:
        out.note("No benchmark schedules found.")
    return EXIT_OK


_ACTIONS: Final[dict[str, Callable[[argparse.Namespace, Client, Output], int]]] = {
    "run": _run, "list": _list, "show": _show, "compare": _compare, "cancel": _cancel, "plot": _plot,
    "baseline": _baseline, "schedule": _schedule,
}
