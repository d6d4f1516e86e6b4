"""A fleet on the control plane: registration, convergence, idle cost, REST latency, scrape, database.

    python bench/fleet.py [--hosts 200] [--procs 4] [--interval 30]          # the detailed report
    python bench/fleet.py --agents hollow --hosts 200,1000,10000 \
        [--db postgresql://postgres@127.0.0.1:5432/test] [--replicas 3]      # the table (issue 18)

Starts `stortune-server` (--replicas of them on one --db PostgreSQL, each with its own
loopback port and state dir, sharing one --pki-dir; SQLite in a temp dir by default;
the first start writes the admin and agent tokens and every call below uses them),
then --procs child processes each running hosts/procs agents, dealt out round the
processes, host i registering with replica i mod N. `--agents real` runs real agents
in-process (every one with its own fixture sysfs tree, state dir and gRPC endpoint on
127.0.0.1): up to a few hundred. `--agents hollow` runs bench/hollow.py: the agent's
service, registrar and identity per host over its own fixture tree, thousands per process.

One size, real agents: the detailed report, printing each figure:

* idle control-plane CPU with every host registered (heartbeats and periodic
  drift checks only), and the heartbeat cost per host;
* `stortune apply` of a profile matching every host until all are Ready;
* drift detection latency: a setting changed behind one agent's back until the
  control plane records the drift (enforce mode corrects it);
* REST latency of GET /api/v1/hosts and of one host's status, 50 clients
  (wrk when it is installed, `apt-get install wrk`; else Python clients, which
  share the cores with the server and mostly measure themselves).

Several sizes (or --table): a fresh fleet and database per size, and a table: time to
register every host (from the agent processes' start: their fixture trees and
certificates included), time from `stortune apply` to every host Ready with the
profile's generation, idle CPU over --window s after --settle s (every replica summed,
% of one core; the agent processes' beside it, as they share the 2 cores), GET
/api/v1/hosts p50/p99 (50 clients for 10 s on the first replica), one /metrics scrape
(gzip, a metrics-role token) and the database's size (pg_database_size, or SQLite's files).
Progress is read from /api/v1/fleet/summary every 0.2 s (counts, not documents).

Everything binds to loopback; every process is stopped and the database dropped at the
end, also on Ctrl-C, SIGTERM or a failure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TICK = os.sysconf("SC_CLK_TCK")

PROFILE = """
apiVersion: stortune/v1
kind: StorageProfile
metadata: {name: fleet-streaming}
spec:
  hostSelector: {matchLabels: {role: fleet}}
  priority: 10
  rules:
    - name: loops
      match: {kind: [loop]}
      settings: {read_ahead_kb: 4096, nr_requests: 64, scheduler: mq-deadline}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: The admin token the server's first start wrote; set once the server is up.
ADMIN: dict[str, str] = {}


def get(url: str) -> Any:
    request = urllib.request.Request(url, headers=ADMIN)  # noqa: S310 - loopback only
    with urllib.request.urlopen(request, timeout=30) as resp:  # noqa: S310 - loopback only
        return json.loads(resp.read())


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def wait_for(what: str, check: Any, timeout: float, step: float = 0.1) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if check():
            return time.monotonic() - start
        time.sleep(step)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


# -- child: many agents in one process ---------------------------------------------------


def run_agents(servers: list[str], index: int, procs: int, hosts: int, workdir: Path) -> None:
    """Agents index, index + procs, ... of ``hosts``: dealt out, not in blocks, so that the
    control plane's name-ordered work does not fall on one process (one GIL) at a time, as
    it would not on a real fleet where every agent has its host to itself."""
    sys.path.insert(0, str(ROOT))
    from bench.hollow import build_fixture
    from stortune.agent.serve import Agent, ServeOptions

    agents = []
    for i in range(index, hosts, procs):
        name = f"fleet-{i:03d}"
        fs = build_fixture(workdir / name, name)
        opts = ServeOptions(listen="127.0.0.1:0", server=servers[i % len(servers)], name=name,
                            labels={"role": "fleet"}, workers=2, rescan_interval=300,
                            token=os.environ["STORTUNE_AGENT_TOKEN"])
        agent = Agent(fs, workdir / name / "state", opts)
        agent.start()
        agents.append(agent)
    print("ready", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    for agent in agents:
        agent.stop()


# -- parent ------------------------------------------------------------------------------------


def _hammer(url: str, deadline: float, samples: list[float], errors: list[str],
            lock: threading.Lock) -> None:
    import httpx

    mine, failed = [], []
    with httpx.Client(timeout=30, headers=ADMIN) as client:
        while time.monotonic() < deadline:
            t = time.perf_counter()
            try:
                client.get(url).raise_for_status()
            except httpx.HTTPError as exc:
                failed.append(type(exc).__name__)
                continue
            mine.append(time.perf_counter() - t)
    with lock:
        samples.extend(mine)
        errors.extend(failed)


def _python_load(url: str, clients: int, seconds: float) -> tuple[float, float, float, int]:
    """(req/s, p50 s, p99 s, errors) from ``clients`` closed-loop httpx clients in threads."""
    samples: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds
    threads = [threading.Thread(target=_hammer, args=(url, deadline, samples, errors, lock))
               for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if len(samples) < 2:
        return len(samples) / seconds, float("nan"), float("nan"), len(errors)
    q = statistics.quantiles(samples, n=100)
    return len(samples) / seconds, q[49], q[98], len(errors)


_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def _wrk_load(url: str, clients: int, seconds: float) -> tuple[float, float, float, int]:
    """The same measured with wrk (C, event-driven), which loads the CPU far less than Python."""
    # Accept-Encoding as httpx, requests, curl --compressed and kubectl send it.
    headers = {**ADMIN, "Accept-Encoding": "gzip"}
    auth = [arg for key, value in headers.items() for arg in ("-H", f"{key}: {value}")]
    out = subprocess.run(["wrk", "-t2", f"-c{clients}", f"-d{seconds:g}s", "--timeout", "30s",
                          "--latency", *auth, url], capture_output=True, text=True, check=True).stdout
    p50, p99, errors = _wrk_figures(out)
    rate = next((float(line.split()[1]) for line in out.splitlines() if line.startswith("Requests/sec:")),
                0.0)
    return rate, p50, p99, errors


_WRITE_SCRIPT = """
-- PATCH the labels of a random host of the fleet, each request a new value: a write each time.
local names = {}
for name in string.gmatch("%s", "[^,]+") do names[#names + 1] = name end
local tick = 0
request = function()
  tick = tick + 1
  local host = names[math.random(#names)]
  local body = '{"labels": {"bench-tick": "' .. tick .. '"}}'
  -- wrk.format's headers replace the command line's: the token is copied in.
  local headers = {}
  for key, value in pairs(wrk.headers) do headers[key] = value end
  headers["Content-Type"] = "application/json"
  return wrk.format("PATCH", "/api/v1/hosts/" .. host .. "/labels", headers, body)
end
"""


def mixed_load(base: str, hosts: list[str], *, readers: int = 40, writers: int = 10,
               seconds: float = 10.0, page: int = 100) -> tuple[float, float, float, float, int]:
    """(reads p50, reads p99, writes p50, writes p99, errors): ``readers`` clients paging the host
    list and ``writers`` clients changing labels at once (50 clients at 4:1), as two wrk runs side
    by side so each has its own latencies."""
    script = Path(tempfile.mkstemp(suffix=".lua")[1])
    script.write_text(_WRITE_SCRIPT % ",".join(hosts))
    headers = [arg for key, value in {**ADMIN, "Accept-Encoding": "gzip"}.items()
               for arg in ("-H", f"{key}: {value}")]
    try:
        runs = [subprocess.Popen(["wrk", "-t1", f"-c{clients}", f"-d{seconds:g}s", "--timeout", "30s",
                                  "--latency", *headers, *extra, url], stdout=subprocess.PIPE, text=True)
                for clients, extra, url in ((readers, [], f"{base}/api/v1/hosts?limit={page}"),
                                            (writers, ["-s", str(script)], base))]
        outs = [run.communicate()[0] for run in runs]
    finally:
        script.unlink()
    (r50, r99, e1), (w50, w99, e2) = (_wrk_figures(out) for out in outs)
    return r50, r99, w50, w99, e1 + e2


def _wrk_figures(out: str) -> tuple[float, float, int]:
    lat: dict[str, float] = {}
    errors = 0
    for line in out.splitlines():
        words = line.split()
        if len(words) == 2 and words[0] in ("50%", "99%"):
            number = words[1].rstrip("usm")
            lat[words[0]] = float(number) * _UNITS[words[1][len(number):]]
        elif "Non-2xx" in line or line.strip().startswith("Socket errors"):
            errors += sum(int(w.rstrip(",")) for w in words if w.rstrip(",").isdigit())
    return lat.get("50%", float("nan")), lat.get("99%", float("nan")), errors


def resource_version(url: str) -> int:
    """The resourceVersion a GET answers at (its ETag is W/"VERSION-KEY")."""
    request = urllib.request.Request(url, headers=ADMIN)  # noqa: S310 - loopback only
    with urllib.request.urlopen(request, timeout=30) as resp:  # noqa: S310 - loopback only
        return int(resp.headers["ETag"].removeprefix('W/"').split("-")[0])


def _relabel(base: str, host: str, per_second: float, stop: threading.Event) -> None:
    """Change one host's labels ``per_second`` times a second until ``stop``: a write each time."""
    tick = 0
    while not stop.wait(1 / per_second):
        tick += 1
        body = json.dumps({"labels": {"bench-tick": str(tick)}}).encode()
        request = urllib.request.Request(  # noqa: S310 - loopback only
            f"{base}/api/v1/hosts/{host}/labels", data=body, method="PATCH",
            headers={**ADMIN, "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30):  # noqa: S310 - loopback only
            pass


def rest_latency(base: str, host: str, clients: int = 50, seconds: float = 10.0) -> None:
    tool, load = ("wrk", _wrk_load) if shutil.which("wrk") else ("python", _python_load)
    for label, path, writes_per_s in (
            ("GET /api/v1/hosts", "/api/v1/hosts", 0.0),
            ("GET /api/v1/hosts/{name}/status", f"/api/v1/hosts/{host}/status", 0.0),
            ("GET /api/v1/hosts, 10 writes/s", "/api/v1/hosts", 10.0)):
        started = time.perf_counter()
        get(base + path)  # renders it if no poller asked since the last write: reported apart
        first = time.perf_counter() - started
        before = resource_version(base + path)
        stop = threading.Event()
        writer = threading.Thread(target=_relabel, args=(base, host, writes_per_s, stop))
        if writes_per_s:
            writer.start()
        try:
            rate, p50, p99, errors = load(base + path, clients, seconds)
        finally:
            stop.set()
            if writes_per_s:
                writer.join()
        writes = resource_version(base + path) - before
        print(f"  {label:34s} {clients} clients ({tool}): {rate:7.0f} req/s  p50 {p50 * 1000:6.1f} ms  "
              f"p99 {p99 * 1000:6.1f} ms  errors {errors}  (target p99 < 50 ms; first call "
              f"{first * 1000:.0f} ms; {writes} writes meanwhile)")


@dataclass
class Fleet:
    """One measured fleet's database, control-plane replicas and agent processes."""

    work: Path
    db_url: str
    urls: list[str]
    servers: list[subprocess.Popen[bytes]]
    agents: list[subprocess.Popen[bytes]] = field(default_factory=list)
    #: time.monotonic() when the first agent process was started (the servers were up).
    agents_started: float = 0.0

    def cpu(self, procs: list[subprocess.Popen[bytes]]) -> float:
        return sum(cpu_seconds(p.pid) for p in procs)


def _stop(procs: list[subprocess.Popen[bytes]], grace: float = 60.0) -> None:
    """SIGTERM each (newest first), then wait; SIGKILL what outlives ``grace``."""
    for p in reversed(procs):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@contextlib.contextmanager
def database(admin_url: str | None, work: Path, tag: str) -> Iterator[str]:
    """The control plane's database URL: SQLite in ``work``, or a fresh PostgreSQL database
    made through ``admin_url`` and dropped at the end (its connections too)."""
    if admin_url is None:
        yield f"sqlite:///{work}/cp.db"
        return
    sys.path.insert(0, str(ROOT))
    from tests.pgdb import fresh_database

    with fresh_database(admin_url, f"stortune_fleet_{os.getpid()}_{tag}") as url:
        yield url


def database_bytes(db_url: str) -> int:
    if db_url.startswith("sqlite:///"):
        path = db_url.removeprefix("sqlite:///")
        return sum(os.path.getsize(path + suffix) for suffix in ("", "-wal", "-shm")
                   if os.path.exists(path + suffix))
    import psycopg
    from sqlalchemy.engine import make_url

    conninfo = make_url(db_url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo) as conn:
        row = conn.execute("SELECT pg_database_size(current_database())").fetchone()
    return int(row[0]) if row else 0


def launch(args: argparse.Namespace, hosts: int, stack: contextlib.ExitStack,
           db_url: str | None = None) -> Fleet:
    """A database (``db_url``, else one of ``database``), ``args.replicas`` servers on it and
    ``args.procs`` agent processes, every one of them ended by ``stack``; -> once the agent
    processes said they are ready. ``args``: main's options (tests give a Namespace of them)."""
    work = Path(tempfile.mkdtemp(prefix="stortune-fleet-", dir="/dev/shm"))
    stack.callback(lambda: print(f"work directory and logs kept in {work}") if args.keep
                   else shutil.rmtree(work, ignore_errors=True))
    fleet = Fleet(work, db_url or stack.enter_context(database(args.db, work, str(hosts))), [], [])
    stack.callback(_stop, fleet.servers)
    heartbeat = (["--heartbeat-interval", str(args.heartbeat), "--lease-duration", str(4 * args.heartbeat)]
                 if args.heartbeat else [])
    # One after another: the first migrates the database and makes the tokens and the agents' CA
    # (in the shared --pki-dir) that the others then find.
    # Ports from the caller's --port / --agent-port when it has them (bench/rollout.py), else free ones.
    first_port = getattr(args, "port", None)
    for i in range(args.replicas):
        port = first_port + i if first_port else free_port()
        fleet.urls.append(f"http://127.0.0.1:{port}")
        fleet.servers.append(subprocess.Popen(
            [str(BIN / "stortune-server"), "--db", fleet.db_url, "--state-dir", str(work / f"server-{i}"),
             "--pki-dir", str(work / "pki"), "--listen", f"127.0.0.1:{port}",
             "--reconcile-interval", str(args.interval), *heartbeat, *args.server_arg],
            stdout=subprocess.DEVNULL, stderr=open(work / f"server-{i}.log", "wb")))  # noqa: SIM115
        wait_for(f"control plane replica {i}", lambda: _up(fleet.urls[-1]), 120)
    ADMIN["Authorization"] = "Bearer " + (work / "server-0/admin.token").read_text().strip()
    env = {**os.environ,
           "STORTUNE_AGENT_TOKEN": (work / "server-0/agent-bootstrap.token").read_text().strip()}
    servers = ",".join(fleet.urls)
    stack.callback(_stop, fleet.agents)
    # every hollow host listens on its own 127.1.X.Y with this port
    port = getattr(args, "agent_port", None) or free_port()
    fleet.agents_started = time.monotonic()
    for p in range(args.procs):
        command = ([sys.executable, str(ROOT / "bench/hollow.py"), "--server", servers,
                    "--index", str(p), "--procs", str(args.procs), "--hosts", str(hosts),
                    "--dir", str(work), "--port", str(port)]
                   if args.agents == "hollow" else
                   [sys.executable, __file__, "--child", servers, str(p), str(args.procs), str(hosts),
                    str(work)])
        fleet.agents.append(subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=open(work / f"agents-{p}.log", "wb"),  # noqa: SIM115
            env=env))
    for child in fleet.agents:
        assert child.stdout is not None
        if child.stdout.readline().strip() != b"ready":
            logs = "".join(path.read_text(errors="replace")[-2000:] for path in work.glob("agents-*.log"))
            raise SystemExit(f"an agent process failed; the end of the agents' logs:\n{logs}")
    return fleet


def _step(hosts: int) -> float:
    """How often to poll the fleet's counts (a small answer, kept until the next write)."""
    return 0.2


def apply_profile(fleet: Fleet) -> int:
    """`stortune apply` of the profile matching every host; -> its generation."""
    profile = fleet.work / "fleet.yaml"
    profile.write_text(PROFILE)
    env = {**os.environ, "STORTUNE_SERVER": fleet.urls[0],
           "STORTUNE_TOKEN": ADMIN["Authorization"].removeprefix("Bearer ")}
    subprocess.run([str(BIN / "stortune"), "apply", "-f", str(profile)], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    return int(get(fleet.urls[0] + "/api/v1/profiles/fleet-streaming")["metadata"]["generation"])


@dataclass(frozen=True)
class Row:
    hosts: int
    replicas: int
    db: str
    register_s: float
    converge_s: float
    idle_cpu_pct: float
    agents_cpu_pct: float
    hosts_p50_s: float
    hosts_p99_s: float
    mixed_reads_p99_s: float
    mixed_writes_p99_s: float
    scrape_s: float
    db_bytes: int

    HEADER = (f"{'hosts':>6} {'repl':>4} {'db':10} {'register':>9} {'converge':>9} {'idle CPU':>9} "
              f"{'(agents)':>9} {'page p50':>9} {'p99':>8} {'4:1 reads p99':>13} {'writes p99':>10} "
              f"{'scrape':>8} {'db size':>9}")

    def line(self) -> str:
        return (f"{self.hosts:6d} {self.replicas:4d} {self.db:10} {self.register_s:8.1f}s "
                f"{self.converge_s:8.1f}s {self.idle_cpu_pct:8.1f}% {self.agents_cpu_pct:8.1f}% "
                f"{self.hosts_p50_s * 1000:7.1f}ms {self.hosts_p99_s * 1000:6.1f}ms "
                f"{self.mixed_reads_p99_s * 1000:11.1f}ms {self.mixed_writes_p99_s * 1000:8.1f}ms "
                f"{self.scrape_s * 1000:6.0f}ms {self.db_bytes / 2**20:7.1f}MB")


def scrape_seconds(base: str) -> float:
    """One /metrics scrape as Prometheus makes it (gzip), with a metrics-role token of its own."""
    body = json.dumps({"role": "metrics", "name": "fleet-bench"}).encode()
    request = urllib.request.Request(base + "/api/v1/tokens", data=body, method="POST",  # noqa: S310
                                     headers={**ADMIN, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as resp:  # noqa: S310 - loopback only
        token = json.loads(resp.read())["token"]
    scrape = urllib.request.Request(base + "/metrics", headers={  # noqa: S310 - loopback only
        "Authorization": f"Bearer {token}", "Accept-Encoding": "gzip"})
    started = time.perf_counter()
    with urllib.request.urlopen(scrape, timeout=60) as resp:  # noqa: S310 - loopback only
        resp.read()
    return time.perf_counter() - started


def measure(args: argparse.Namespace, hosts: int) -> Row:
    """One fresh fleet of ``hosts``: the table's figures, then everything stopped and dropped."""
    with contextlib.ExitStack() as stack:
        fleet = launch(args, hosts, stack)
        base, step = fleet.urls[0], _step(hosts)
        wait_for(f"{hosts} registered hosts", lambda: registered(base) >= hosts, 120 + hosts * 0.2, step)
        register = time.monotonic() - fleet.agents_started
        print(f"  {hosts} hosts registered in {register:.1f} s (from the agent processes' start: "
              "fixture trees and certificates included)", flush=True)
        t0 = time.monotonic()
        s0, a0 = fleet.cpu(fleet.servers), fleet.cpu(fleet.agents)
        generation = apply_profile(fleet)
        wait_for("all hosts Ready", lambda: ready_count(base, generation) >= hosts, 120 + hosts * 0.2, step)
        converge = time.monotonic() - t0
        served, simulated = fleet.cpu(fleet.servers) - s0, fleet.cpu(fleet.agents) - a0
        print(f"  profile applied -> {hosts} hosts Ready in {converge:.1f} s; CPU meanwhile: control plane"
              f" {served:.1f} s ({served / hosts * 1000:.1f} ms a host), simulated agents {simulated:.1f} s"
              f" ({simulated / hosts * 1000:.1f} ms a host) of the 2 cores' {2 * converge:.0f} s",
              flush=True)
        time.sleep(args.settle)
        s0, a0 = fleet.cpu(fleet.servers), fleet.cpu(fleet.agents)
        time.sleep(args.window)
        idle = (fleet.cpu(fleet.servers) - s0) / args.window * 100
        agents = (fleet.cpu(fleet.agents) - a0) / args.window * 100
        print(f"  idle: control plane {idle:.1f} % of one core (all replicas), agents {agents:.1f} %",
              flush=True)
        if not shutil.which("wrk"):
            raise SystemExit("the table's REST figures need wrk (apt-get install wrk)")
        _, p50, p99, errors = _wrk_load(base + "/api/v1/hosts?limit=100", 50, 10.0)
        names = [h["metadata"]["name"] for h in get(base + "/api/v1/hosts?limit=1000")["items"]]
        r50, r99, w50, w99, mixed_errors = mixed_load(base, names)
        print(f"  paged host list, 50 clients: p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms; 40 readers"
              f" + 10 writers: reads p50 {r50 * 1000:.1f} / p99 {r99 * 1000:.1f} ms, writes p50"
              f" {w50 * 1000:.1f} / p99 {w99 * 1000:.1f} ms; errors {errors + mixed_errors}", flush=True)
        scrape = scrape_seconds(base)
        return Row(hosts, args.replicas, "postgresql" if args.db else "sqlite", register, converge, idle,
                   agents, p50, p99, r99, w99, scrape, database_bytes(fleet.db_url))


def detail(args: argparse.Namespace, hosts: int) -> None:
    """The detailed report of one fleet: idle cost, convergence, drift latency, REST latency."""
    with contextlib.ExitStack() as stack:
        fleet = launch(args, hosts, stack)
        base, work = fleet.urls[0], fleet.work
        wait_for(f"{hosts} registered hosts", lambda: registered(base) >= hosts, 120, 0.5)
        print(f"{hosts} {args.agents} agents in {args.procs} processes registered in "
              f"{time.monotonic() - fleet.agents_started:.1f} s (includes building their fixture trees)")
        wait_for("all hosts reachable", lambda: all_settled(base), 120, 0.5)

        # Agents learn the fleet's heartbeat pace (services/pacing.py) from their next
        # heartbeat: the first of them registered when the fleet was small.
        time.sleep(args.settle)
        for _ in range(args.windows):
            c0 = fleet.cpu(fleet.servers)
            time.sleep(args.window)
            idle = (fleet.cpu(fleet.servers) - c0) / args.window * 100
            print(f"idle control plane, {hosts} hosts, drift check every {args.interval:.0f} s: "
                  f"{idle:.1f} % of one core over {args.window:.0f} s (target < 5 %); "
                  f"{idle / hosts * 10:.3f} ms CPU per host per second (heartbeats + periodic checks)",
                  flush=True)
        if args.idle_only:
            return

        t0 = time.monotonic()
        generation = apply_profile(fleet)
        wait_for("all hosts Ready", lambda: ready_count(base, generation) >= hosts, 300, 0.2)
        print(f"stortune apply -> {hosts} hosts Ready: {time.monotonic() - t0:.2f} s (target < 10 s)")

        victim = f"{'hollow-00007' if args.agents == 'hollow' else 'fleet-007'}"
        attr = work / victim / "sys/class/block/loop0/queue/read_ahead_kb"
        attr.write_text("128")
        took = wait_for("drift to be recorded", lambda: _drift_seen(base, victim), 3 * args.interval + 30)
        corrected = wait_for("drift corrected", lambda: attr.read_text().strip() == "4096", 120)
        print(f"drift on {victim}: recorded after {took:.1f} s, value corrected after "
              f"{took + corrected:.1f} s (drift check interval {args.interval:.0f} s)")

        if not shutil.which("wrk"):
            print("  (wrk is not installed: Python clients share the 2 cores with the server and "
                  "measure mostly themselves; apt-get install wrk)")
        for _ in range(args.rest_rounds):
            rest_latency(base, victim)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", default="200",
                    help="fleet size, or sizes comma-separated (200,1000,10000): a table, a fresh fleet each")
    ap.add_argument("--agents", choices=("real", "hollow"), default="real",
                    help="real in-process agents (up to a few hundred) or hollow ones (bench/hollow.py)")
    ap.add_argument("--table", action="store_true",
                    help="the table of figures even for one size (implied by several sizes)")
    ap.add_argument("--db", metavar="POSTGRESQL_URL", default=None,
                    help="PostgreSQL to run on (e.g. postgresql://postgres@127.0.0.1:5432/test, used to "
                         "create and drop a database of its own); default: SQLite in the work directory")
    ap.add_argument("--replicas", type=int, default=1, help="stortune-server processes on the one database")
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--interval", type=float, default=30.0, help="reconcile (drift) interval, s")
    ap.add_argument("--heartbeat", type=float, default=None,
                    help="agents' heartbeat interval, s (lease: 4x); default: the server's")
    ap.add_argument("--settle", type=float, default=90.0,
                    help="seconds between convergence (table) or the last registration (detail) "
                         "and the idle measurement")
    ap.add_argument("--window", type=float, default=60.0, help="seconds of each idle measurement")
    ap.add_argument("--windows", type=int, default=1, help="idle measurements one after another")
    ap.add_argument("--idle-only", action="store_true", help="stop after the idle measurement")
    ap.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                    help="one more stortune-server argument (repeat it), "
                         "e.g. --server-arg=--max-heartbeats-per-second=2")
    ap.add_argument("--rest-rounds", type=int, default=1,
                    help="REST latency measurements one after another (10 s each per call)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory and its logs")
    ap.add_argument("--child", nargs=5, metavar=("SERVERS", "INDEX", "PROCS", "HOSTS", "DIR"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        server_urls, index, procs, hosts, directory = args.child
        run_agents(server_urls.split(","), int(index), int(procs), int(hosts), Path(directory))
        return 0
    if args.db is not None and not args.db.startswith("postgresql://"):
        ap.error("--db takes a postgresql:// URL (SQLite is the default)")
    if args.replicas > 1 and args.db is None:
        ap.error("--replicas above 1 needs --db: SQLite is one process's database")
    # SIGTERM unwinds like Ctrl-C: every process stopped, the database dropped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sizes = [int(n) for n in args.hosts.split(",")]
    if len(sizes) == 1 and not args.table:
        detail(args, sizes[0])
        return 0
    rows = []
    for n in sizes:
        print(f"{n} {args.agents} hosts, {args.replicas} replica(s) on "
              f"{'PostgreSQL' if args.db else 'SQLite'}:", flush=True)
        rows.append(measure(args, n))
        # Printed at once too: kept if a later size fails.
        print(f"  {Row.HEADER.strip()}\n  {rows[-1].line().strip()}", flush=True)
    print(Row.HEADER)
    for row in rows:
        print(row.line())
    return 0


def _up(base: str) -> bool:
    try:
        get(base + "/healthz")  # public
    except OSError:
        return False
    return True


def summary(base: str, query: str = "") -> dict[str, Any]:
    """GET /api/v1/fleet/summary: counts from the server's memory, not every host's document
    (at 10,000 hosts the list is tens of MB, and polling it loaded the server it measured)."""
    data: dict[str, Any] = get(f"{base}/api/v1/fleet/summary{query}")
    return data


def registered(base: str) -> int:
    return int(summary(base)["hosts"])


def ready_count(base: str, generation: int) -> int:
    """Hosts Ready with the profile's generation applied."""
    applied = summary(base, "?condition=Ready=True")["appliedGenerations"]
    return int(applied.get("fleet-streaming", {}).get(str(generation), 0))


def all_settled(base: str) -> bool:
    counts = summary(base)
    return bool(counts["conditions"]["Reachable"]["True"] == counts["hosts"])


def _drift_seen(base: str, host: str) -> bool:
    events = get(f"{base}/api/v1/events?host={host}&limit=50")
    return any("drift" in (e.get("reason", "") + e.get("message", "")).lower()
               for e in events.get("items", []))


if __name__ == "__main__":
    raise SystemExit(main())
