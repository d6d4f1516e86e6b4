"""200 agents on one control plane: convergence, drift latency, idle and heartbeat cost, REST latency.

    python bench/fleet.py [--hosts 200] [--procs 4] [--interval 30]

Starts `stortune-server` on SQLite in a temp dir (its first start writes the admin
and agent tokens there; every call below uses them), then --procs child processes
each running hosts/procs agents in-process, dealt out round the processes
(every agent has its own fixture sysfs tree, state dir and gRPC endpoint on
127.0.0.1, and registers and heartbeats like a real one). Then it measures, printing each figure:

* idle control-plane CPU with every host registered (heartbeats and periodic
  drift checks only), and the heartbeat cost per host;
* `stortune apply` of a profile matching every host until all are Ready;
* drift detection latency: a setting changed behind one agent's back until the
  control plane records the drift (enforce mode corrects it);
* REST latency of GET /api/v1/hosts and of one host's status, 50 clients
  (wrk when it is installed, `apt-get install wrk`; else Python clients, which
  share the cores with the server and mostly measure themselves).

Everything binds to 127.0.0.1 and every process is stopped at the end.
"""

from __future__ import annotations

import argparse
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


def ready(host: dict[str, Any], profile: str, generation: int) -> bool:
    """Ready *with* the profile's generation applied (a host without profiles is Ready too)."""
    status = host.get("status", {})
    return status.get("appliedGenerations", {}).get(profile) == generation and any(
        c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions", []))


def wait_for(what: str, check: Any, timeout: float, step: float = 0.1) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if check():
            return time.monotonic() - start
        time.sleep(step)
    raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")


# -- child: many agents in one process ---------------------------------------------------


def run_agents(server: str, index: int, procs: int, hosts: int, workdir: Path) -> None:
    """Agents index, index + procs, ... of ``hosts``: dealt out, not in blocks, so that the
    control plane's name-ordered work does not fall on one process (one GIL) at a time, as
    it would not on a real fleet where every agent has its host to itself."""
    sys.path.insert(0, str(ROOT))
    from stortune.agent.serve import Agent, ServeOptions
    from tests.fixtures.sysfs_builder import SysfsBuilder

    agents = []
    for i in range(index, hosts, procs):
        name = f"fleet-{i:03d}"
        b = SysfsBuilder(workdir / name, hostname=name)
        b.loop(0, size=1 << 21, backing_file=f"/srv/{name}/a.img")
        b.loop(1, size=1 << 21, backing_file=f"/srv/{name}/b.img")
        fs = b.finish()
        opts = ServeOptions(listen="127.0.0.1:0", server=server, name=name,
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
    lat: dict[str, float] = {}
    rate, errors = 0.0, 0
    for line in out.splitlines():
        words = line.split()
        if len(words) == 2 and words[0] in ("50%", "99%"):
            number = words[1].rstrip("usm")
            lat[words[0]] = float(number) * _UNITS[words[1][len(number):]]
        elif line.startswith("Requests/sec:"):
            rate = float(words[1])
        elif "Non-2xx" in line or line.strip().startswith("Socket errors"):
            errors += sum(int(w.rstrip(",")) for w in words if w.rstrip(",").isdigit())
    return rate, lat["50%"], lat["99%"], errors


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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=200)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--interval", type=float, default=30.0, help="reconcile (drift) interval, s")
    ap.add_argument("--heartbeat", type=float, default=None,
                    help="agents' heartbeat interval, s (lease: 4x); default: the server's")
    ap.add_argument("--settle", type=float, default=25.0,
                    help="seconds between the last registration and the idle measurement")
    ap.add_argument("--window", type=float, default=60.0, help="seconds of each idle measurement")
    ap.add_argument("--windows", type=int, default=1, help="idle measurements one after another")
    ap.add_argument("--idle-only", action="store_true", help="stop after the idle measurement")
    ap.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                    help="one more stortune-server argument (repeat it), "
                         "e.g. --server-arg=--max-heartbeats-per-second=2")
    ap.add_argument("--rest-rounds", type=int, default=1,
                    help="REST latency measurements one after another (10 s each per call)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory and its logs")
    ap.add_argument("--child", nargs=5, metavar=("SERVER", "INDEX", "PROCS", "HOSTS", "DIR"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        server_url, index, procs, hosts, directory = args.child
        run_agents(server_url, int(index), int(procs), int(hosts), Path(directory))
        return 0

    work = Path(tempfile.mkdtemp(prefix="stortune-fleet-", dir="/dev/shm"))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        server = subprocess.Popen(
            [str(BIN / "stortune-server"), "--db", f"sqlite:///{work}/cp.db", "--state-dir",
             str(work / "server"), "--listen", f"127.0.0.1:{port}",
             "--reconcile-interval", str(args.interval),
             *(["--heartbeat-interval", str(args.heartbeat), "--lease-duration", str(4 * args.heartbeat)]
               if args.heartbeat else []), *args.server_arg],
            stdout=subprocess.DEVNULL, stderr=open(work / "server.log", "wb"))  # noqa: SIM115
        procs.append(server)
        wait_for("the control plane", lambda: _up(base), 60)
        ADMIN["Authorization"] = "Bearer " + (work / "server/admin.token").read_text().strip()
        agent_env = {**os.environ,
                     "STORTUNE_AGENT_TOKEN": (work / "server/agent-bootstrap.token").read_text().strip()}

        t0 = time.monotonic()
        for p in range(args.procs):
            child = subprocess.Popen(
                [sys.executable, __file__, "--child", base, str(p), str(args.procs), str(args.hosts),
                 str(work)],
                stdout=subprocess.PIPE, stderr=open(work / f"agents-{p}.log", "wb"),  # noqa: SIM115
                env=agent_env)
            procs.append(child)
        for child in procs[1:]:
            assert child.stdout is not None
            child.stdout.readline()
        wait_for(f"{args.hosts} registered hosts",
                 lambda: len(get(base + "/api/v1/hosts")["items"]) >= args.hosts, 120, 0.5)
        print(f"{args.hosts} agents in {args.procs} processes registered in "
              f"{time.monotonic() - t0:.1f} s (includes building their fixture trees)")
        wait_for("all hosts reachable", lambda: _all_settled(base), 120, 0.5)

        # Agents learn the fleet's heartbeat pace (services/pacing.py) from their next
        # heartbeat: the first of them registered when the fleet was small.
        time.sleep(args.settle)
        for _ in range(args.windows):
            c0 = cpu_seconds(server.pid)
            time.sleep(args.window)
            idle = (cpu_seconds(server.pid) - c0) / args.window * 100
            print(f"idle control plane, {args.hosts} hosts, drift check every {args.interval:.0f} s: "
                  f"{idle:.1f} % of one core over {args.window:.0f} s (target < 5 %); "
                  f"{idle / args.hosts * 10:.3f} ms CPU per host per second (heartbeats + periodic checks)",
                  flush=True)
        if args.idle_only:
            return 0

        profile = work / "fleet.yaml"
        profile.write_text(PROFILE)
        env = {**os.environ, "STORTUNE_SERVER": base,
               "STORTUNE_TOKEN": ADMIN["Authorization"].removeprefix("Bearer ")}
        t0 = time.monotonic()
        subprocess.run([str(BIN / "stortune"), "apply", "-f", str(profile)], check=True, env=env,
                       stdout=subprocess.DEVNULL)
        generation = get(base + "/api/v1/profiles/fleet-streaming")["metadata"]["generation"]
        took = wait_for("all hosts Ready", lambda: _ready_count(base, generation) >= args.hosts, 300, 0.2)
        print(f"stortune apply -> {args.hosts} hosts Ready: {took:.2f} s (target < 10 s)")

        victim = "fleet-007"
        attr = work / victim / "sys/class/block/loop0/queue/read_ahead_kb"
        attr.write_text("128")
        t0 = time.monotonic()
        took = wait_for("drift to be recorded", lambda: _drift_seen(base, victim), 3 * args.interval + 30)
        corrected = wait_for("drift corrected", lambda: attr.read_text().strip() == "4096", 120)
        print(f"drift on {victim}: recorded after {took:.1f} s, value corrected after "
              f"{took + corrected:.1f} s (drift check interval {args.interval:.0f} s)")

        if not shutil.which("wrk"):
            print("  (wrk is not installed: Python clients share the 2 cores with the server and "
                  "measure mostly themselves; apt-get install wrk)")
        for _ in range(args.rest_rounds):
            rest_latency(base, victim)
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if args.keep:
            print(f"work directory and logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def _up(base: str) -> bool:
    try:
        get(base + "/healthz")  # public
    except OSError:
        return False
    return True


def _hosts(base: str) -> list[dict[str, Any]]:
    return list(get(base + "/api/v1/hosts")["items"])


def _ready_count(base: str, generation: int) -> int:
    return sum(ready(h, "fleet-streaming", generation) for h in _hosts(base))


def _all_settled(base: str) -> bool:
    return all(any(c["type"] == "Reachable" and c["status"] == "True"
                   for c in h.get("status", {}).get("conditions", [])) for h in _hosts(base))


def _drift_seen(base: str, host: str) -> bool:
    events = get(f"{base}/api/v1/events?host={host}&limit=50")
    return any("drift" in (e.get("reason", "") + e.get("message", "")).lower()
               for e in events.get("items", []))


if __name__ == "__main__":
    raise SystemExit(main())
