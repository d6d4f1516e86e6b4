"""A profile change reaching a hollow fleet all at once, then in waves (issue 27, performance).

    python bench/rollout.py [--hosts 1000] [--procs 4] [--db postgresql://postgres@127.0.0.1:5432/test]
        [--port 18080] [--agent-port 18081] [--rounds 3] [--server-arg=--rollout-interval=0.5]
        [--profile DIR --py-spy PATH]   # py-spy on the server during each change: where it went

On one fleet of --hosts hollow agents (bench/hollow.py, started by bench/fleet.py's launcher on a
temp SQLite or a fresh database of --db) holding a profile at read_ahead_kb 4096:

1. a change to 1024 (1024 + 8r in round r) with ``rollout: {strategy: all-at-once}``: seconds
   from the PUT until every host is Ready with the new generation applied;
2. a change to 512 (512 + 8r) with ``rollout: {waves: [{hosts: 1}, {percent: 10}, {percent: 100}]}``
   (health-gated, no soak, no analysis): seconds from the PUT until the rollout is Complete,
   with the second each wave opened logged.

For each, the control plane's CPU seconds over that span (utime + stime of the server
processes from /proc, not this script's nor the agents') per host. Progress is read every
--step s from counts only: /api/v1/fleet/summary, and the rollout status asked for one host.
Both spans include the fleet's background work (heartbeats), which is small beside a change.

Progress goes to stderr; stdout gets one JSON line:
{"hosts", "all_at_once_s", "rollout_s", "ratio", "all_at_once_cpu_ms_per_host",
 "rollout_cpu_ms_per_host", "waves": [hosts per wave], "db", "rounds"}: with --rounds N, both
changes are made N times on the one fleet and the figures are medians. The target is ratio <= 1.5.
Every process is stopped and the database dropped at the end, also on Ctrl-C, SIGTERM or a failure.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import fleet  # noqa: E402

NAME = "rollout-bench"
#: The waves measured against all-at-once: issue 27's default (a canary, a tenth, everyone).
WAVES: list[dict[str, int]] = [{"hosts": 1}, {"percent": 10}, {"percent": 100}]
ALL_AT_ONCE: dict[str, Any] = {"strategy": "all-at-once"}


def document(read_ahead_kb: int, rollout: dict[str, Any]) -> dict[str, Any]:
    """The profile the hollow hosts (label role=fleet, two loop devices each) are given."""
    return {"apiVersion": "stortune/v1", "kind": "StorageProfile", "metadata": {"name": NAME},
            "spec": {"hostSelector": {"matchLabels": {"role": "fleet"}}, "priority": 10,
                     "rollout": rollout,
                     "rules": [{"name": "loops", "match": {"kind": ["loop"]},
                                "settings": {"read_ahead_kb": read_ahead_kb, "nr_requests": 64,
                                             "scheduler": "mq-deadline"}}]}}


def send(method: str, url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(  # noqa: S310 - loopback only
        url, data=json.dumps(body).encode(), method=method,
        headers={**fleet.ADMIN, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:  # noqa: S310 - loopback only
            answer: dict[str, Any] = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise SystemExit(f"{method} {url}: {exc.code} {exc.read()[:2000].decode(errors='replace')}") from exc
    return answer


def write(base: str, read_ahead_kb: int, rollout: dict[str, Any], *, create: bool = False) -> int:
    """Create or replace the profile; -> its generation."""
    doc = document(read_ahead_kb, rollout)
    stored = (send("POST", f"{base}/api/v1/profiles", doc) if create
              else send("PUT", f"{base}/api/v1/profiles/{NAME}", doc))
    return int(stored["metadata"]["generation"])


def applied(base: str, generation: int) -> int:
    """Hosts Ready with ``generation`` of the profile applied (counts from the server's memory)."""
    counts = fleet.summary(base, "?condition=Ready=True")["appliedGenerations"]
    return int(counts.get(NAME, {}).get(str(generation), 0))


def rollout_status(base: str) -> dict[str, Any] | None:
    """The rollout's status with one host listed (its counts are what is read), None while 404."""
    try:
        status: dict[str, Any] = fleet.get(f"{base}/api/v1/profiles/{NAME}/rollout?limit=1")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise
    return status


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def poll(what: str, done: Callable[[], tuple[bool, str]], timeout: float, step: float) -> None:
    """Call ``done`` every ``step`` s until it says so; its text is printed every 5 s."""
    start = last = time.monotonic()
    while True:
        finished, progress = done()
        now = time.monotonic()
        if finished:
            return
        if now - start > timeout:
            raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what} ({progress})")
        if now - last >= 5:
            log(f"  {now - start:5.1f} s  {what}: {progress}")
            last = now
        time.sleep(step)


@contextlib.contextmanager
def spied(py_spy: str | None, pid: int, out: Path | None) -> Iterator[None]:
    """py-spy recording ``pid`` (collapsed stacks into ``out``) while the block runs; its
    busiest functions are printed after. Nothing without ``out``."""
    if out is None:
        yield
        return
    spy = subprocess.Popen([py_spy or "py-spy", "record", "--pid", str(pid), "--output", str(out),
                            "--format", "raw", "--rate", "100", "--gil", "--nonblocking"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        _, err = spy.communicate(timeout=120)
    if not out.exists():
        log(f"py-spy wrote nothing: {err.decode(errors='replace')[-1000:]}")
        return
    for line in hottest(out.read_text()):
        log(line)


#: py-spy names a frame's file from its package down: stortune's own start with these.
OURS = ("server/", "schemas/", "agent/", "api/", "cli/")


def _frame(frame: str) -> tuple[str, str]:
    """``name (path/module.py:LINE)`` -> (``name (path/module.py)``, path)."""
    name, _, where = frame.partition(" (")
    path = where.rpartition(":")[0]
    return (f"{name} ({path})" if path else name), path


def hottest(collapsed: str, top: int = 20) -> list[str]:
    """Where py-spy's samples (collapsed stacks) went: by the package running on top of the
    stack, by stortune function with what it calls (each counted once per stack), and by the
    function on top of the stack."""
    ours: Counter[str] = Counter()
    package: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [_frame(f) for f in stack.split(";")
                  if not f.startswith(("process ", "thread "))]  # with --threads/--subprocesses
        for function in {f for f, path in frames if path.startswith(OURS)}:
            ours[function] += n
        if frames:
            function, path = frames[-1]
            own[function] += n
            package["stortune" if path.startswith(OURS) else path.partition("/")[0]] += n
    if not total:
        return ["  py-spy took no samples"]
    lines = [f"  {total} samples (threads holding the GIL); by package on top of the stack:"]
    lines += [f"    {n / total:6.1%}  {p}" for p, n in package.most_common(8)]
    lines.append("  stortune functions, with what they call:")
    lines += [f"    {n / total:6.1%}  {f}" for f, n in ours.most_common(top)]
    lines.append("  functions on top of the stack:")
    lines += [f"    {n / total:6.1%}  {f}" for f, n in own.most_common(top)]
    return lines


def measure(running: fleet.Fleet, what: str, change: tuple[int, dict[str, Any]],
            done: Callable[[int], tuple[bool, str]], *, hosts: int, timeout: float,
            step: float, profile: tuple[str | None, Path | None] = (None, None)) -> tuple[float, float]:
    """PUT the change and wait for ``done(generation)``; -> (seconds, control-plane CPU seconds)."""
    with spied(profile[0], running.servers[0].pid, profile[1]):
        cpu0 = running.cpu(running.servers)
        t0 = time.monotonic()
        generation = write(running.urls[0], *change)
        log(f"  {time.monotonic() - t0:5.1f} s  {what}: the PUT answered (generation {generation})")
        poll(what, lambda: done(generation), timeout, step)
        took, cpu = time.monotonic() - t0, running.cpu(running.servers) - cpu0
    log(f"{what}: generation {generation} on {hosts} hosts in {took:.2f} s; control plane CPU "
        f"{cpu:.2f} s ({cpu / hosts * 1000:.2f} ms a host)")
    return took, cpu


def everyone(base: str, hosts: int) -> Callable[[int], tuple[bool, str]]:
    def done(generation: int) -> tuple[bool, str]:
        n = applied(base, generation)
        return n >= hosts, f"{n}/{hosts} hosts applied"
    return done


def complete(base: str, grace: float, seen: dict[str, Any]) -> Callable[[int], tuple[bool, str]]:
    """Done when the rollout of this generation is Complete; a Halted one, or none at all after
    ``grace`` s (the PUT stores it in the same transaction), ends the bench."""
    started = time.monotonic()
    opened: set[int] = set()

    def done(generation: int) -> tuple[bool, str]:
        status = rollout_status(base)
        if status is None or int(status.get("generation", 0)) != generation:
            if time.monotonic() - started > grace:
                answered = status and status.get("generation")
                raise SystemExit(f"no rollout of generation {generation} after {grace:.0f} s: "
                                 f"GET /api/v1/profiles/{NAME}/rollout answered {answered}")
            return False, "no rollout yet"
        seen.update(status)
        wave = status.get("wave")
        if isinstance(wave, int) and wave not in opened:  # when each wave opened: where the time went
            opened.add(wave)
            log(f"  {time.monotonic() - started:5.1f} s  wave {wave} open; "
                f"{status.get('counts', {}).get('updated')} hosts updated")
        if status["phase"] == "Halted":
            raise SystemExit(f"the rollout halted: {status.get('reason')}; failures {status.get('failures')}")
        return (status["phase"] == "Complete",
                f"{status['phase']}, wave {status.get('wave')}, counts {status.get('counts')}")
    return done


def spy_file(directory: Path | None, name: str) -> Path | None:
    return directory / f"{name}.txt" if directory is not None else None


def run(args: argparse.Namespace) -> dict[str, Any]:
    hosts = args.hosts
    timeout = args.timeout or 300 + hosts * 0.3
    launcher = argparse.Namespace(agents="hollow", procs=args.procs, replicas=1, db=args.db,
                                  interval=args.interval, heartbeat=args.heartbeat,
                                  server_arg=args.server_arg, keep=args.keep, port=args.port,
                                  agent_port=args.agent_port)
    with contextlib.ExitStack() as stack:
        running = fleet.launch(launcher, hosts, stack)
        base = running.urls[0]
        log(f"{hosts} hollow hosts in {args.procs} processes on "
            f"{'PostgreSQL' if args.db else 'SQLite'}, server at {base} (pid {running.servers[0].pid})")
        poll("hosts registered", lambda: (fleet.registered(base) >= hosts,
                                          f"{fleet.registered(base)}/{hosts}"), timeout, args.step)
        poll("hosts reachable", lambda: (fleet.all_settled(base), ""), timeout, args.step)
        generation = write(base, 4096, ALL_AT_ONCE, create=True)
        poll("the starting profile everywhere", lambda: everyone(base, hosts)(generation), timeout, args.step)
        log(f"fleet ready: every host holds {NAME} generation {generation}")

        aao: list[tuple[float, float]] = []
        rolled: list[tuple[float, float]] = []
        status: dict[str, Any] = {}
        for r in range(args.rounds):
            # Every change a value no earlier one set, so that every host is concerned each time.
            suffix = f"-{r + 1}" if args.rounds > 1 else ""
            aao.append(measure(running, "all-at-once", (1024 + 8 * r, ALL_AT_ONCE), everyone(base, hosts),
                               hosts=hosts, timeout=timeout, step=args.step,
                               profile=(args.py_spy, spy_file(args.profile, f"all-at-once{suffix}"))))
            status.clear()
            rolled.append(measure(running, "waves 1 / 10% / 100%", (512 + 8 * r, {"waves": WAVES}),
                                  complete(base, 30.0, status), hosts=hosts, timeout=timeout, step=args.step,
                                  profile=(args.py_spy, spy_file(args.profile, f"rollout{suffix}"))))
            # Complete means every host of it reported the generation; the fleet's counts must agree.
            poll("every host at the rollout's generation",
                 functools.partial(everyone(base, hosts), int(status["generation"])), 60, args.step)
    # Medians over the rounds: the machine's other load moves single runs (ratio: of the medians).
    aao_s, aao_cpu = (statistics.median(x) for x in zip(*aao, strict=True))
    roll_s, roll_cpu = (statistics.median(x) for x in zip(*rolled, strict=True))
    return {"hosts": hosts, "all_at_once_s": round(aao_s, 3), "rollout_s": round(roll_s, 3),
            "ratio": round(roll_s / aao_s, 3),
            "all_at_once_cpu_ms_per_host": round(aao_cpu / hosts * 1000, 3),
            "rollout_cpu_ms_per_host": round(roll_cpu / hosts * 1000, 3),
            "waves": [int(w["hosts"]) for w in status.get("waves", [])],
            "db": "postgresql" if args.db else "sqlite", "rounds": args.rounds}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--hosts", type=int, default=1000, help="hollow hosts in the fleet (1 to 60,000)")
    ap.add_argument("--procs", type=int, default=4, help="processes the hollow hosts are dealt to")
    ap.add_argument("--db", metavar="POSTGRESQL_URL", default=None,
                    help="PostgreSQL to create and drop a database of its own on; default: SQLite in a "
                         "temp directory")
    ap.add_argument("--port", type=int, default=None, help="the control plane's port (default: a free one)")
    ap.add_argument("--agent-port", type=int, default=None,
                    help="the port every hollow host listens on, each on its own 127.1.X.Y (default: free)")
    ap.add_argument("--interval", type=float, default=30.0, help="reconcile (drift) interval, s")
    ap.add_argument("--heartbeat", type=float, default=None, help="agents' heartbeat interval, s")
    ap.add_argument("--rounds", type=int, default=1,
                    help="both changes this many times, one after the other, on the one fleet: medians")
    ap.add_argument("--step", type=float, default=0.5, help="seconds between progress reads")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds each wait may take (default: 300 + 0.3 a host)")
    ap.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                    help="one more stortune-server argument (repeat it)")
    ap.add_argument("--profile", type=Path, default=None, metavar="DIR",
                    help="record the server with py-spy during each change (DIR/all-at-once.txt and "
                         "DIR/rollout.txt, collapsed stacks) and print its busiest functions")
    ap.add_argument("--py-spy", default=None, metavar="PATH", help="the py-spy to run (default: on PATH)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory and its logs")
    args = ap.parse_args()
    if not 1 <= args.hosts <= 60_000:
        ap.error("--hosts takes 1 to 60000 (hollow hosts' loopback addresses)")
    if not 1 <= args.procs <= 64:
        ap.error("--procs takes 1 to 64")
    if not 1 <= args.rounds <= 20:
        ap.error("--rounds takes 1 to 20")
    if not 0.05 <= args.step <= 10:
        ap.error("--step takes 0.05 to 10 seconds")
    for flag in ("port", "agent_port"):
        port = getattr(args, flag)
        if port is not None and not 1024 <= port <= 65535:
            ap.error(f"--{flag.replace('_', '-')} takes 1024 to 65535")
    if args.db is not None and not args.db.startswith("postgresql://"):
        ap.error("--db takes a postgresql:// URL (SQLite is the default)")
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    # SIGTERM unwinds like Ctrl-C: every process stopped, the database dropped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # Everything but the one JSON line goes to stderr (the launcher prints where --keep kept things).
    with contextlib.redirect_stdout(sys.stderr):
        result = run(args)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
