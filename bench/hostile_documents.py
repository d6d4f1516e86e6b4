"""How long /healthz and a heartbeat wait while hostile documents are posted.

    python bench/hostile_documents.py [--db URL] [--port N] [--clients 3] [--seconds 10] [--kinds K,...]

Starts stortune-server on the given database (default: SQLite in a temporary
directory) and port (default: a free one), registers one host, then lets
``--clients`` threads post hostile profiles as the admin, round-robin:

* ``keys``: a 1.3 MiB profile of 100,000 keys (``k0: 0`` ... ``k99999: 99999``);
* ``scalar``: one 7 MiB scalar;
* ``wide``: 5 MiB of JSON holding 300,000 keys;
* ``bomb``: YAML anchors and aliases ("billion laughs");
* ``base60``: four YAML base-60 integers (``1:1:1...``) of 255,000 characters in 1 MiB,
  which PyYAML builds in quadratic time: before their bound (3 clients, 30 s) each took the
  one parser 13 s and was answered after a median 40.6 s, so every other document waited
  as long; after, 400 in a median 0.15 s (/healthz p99 97 ms, as before);
* ``keys-1mib``, ``scalar-1mib``, ``wide-1mib``: the same just under 1 MiB (the default
  document limit), so that the node and value bounds are what refuses them;
* ``register-wide``: a 7 MiB registration of 400,000 facts, to a model route (not a document).

``--kinds`` picks some. Figures on 2 cores (issue 26; 3 clients, 30 s): before, /healthz
p50 11.1 s, max 15.9 s (four documents got an answer); after, with every kind, p50 29 ms,
p99 362 ms; documents only, p99 59 ms.

Meanwhile one more thread asks /healthz and sends a heartbeat in turn, and
records how long each took. Prints a line per kind of document (its answers and
how long they took), then one JSON line of figures: /healthz and heartbeat
latency p50/p99/max in milliseconds, and how many hostile documents were refused.
Target (issue 26): /healthz and heartbeats answer in well under a second.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx

API = "/api/v1"
YAML = {"content-type": "application/yaml"}
JSON = {"content-type": "application/json"}
HEAD = "apiVersion: stortune/v1\nkind: StorageProfile\nmetadata: {name: hostile}\nspec:\n  x:\n"


KINDS = ("keys", "keys-1mib", "scalar", "scalar-1mib", "wide", "wide-1mib", "bomb", "base60", "register-wide")
PROFILES, REGISTER = f"{API}/profiles", f"{API}/agents/register"


def _keys(n: int) -> bytes:
    return (HEAD + "".join(f"    k{i}: {i}\n" for i in range(n))).encode()


def _scalar(n: int) -> bytes:
    return (HEAD + "    s: " + "x" * n + "\n").encode()


def _base60(n: int) -> bytes:
    """``n`` YAML 1.1 base-60 integers (1:1:...) of 255,000 characters: quadratic to build."""
    return (HEAD + "".join(f"    k{i}: 1" + ":1" * 127_000 + "\n" for i in range(n))).encode()


def _wide(n: int) -> bytes:
    return json.dumps({"apiVersion": "stortune/v1", "kind": "StorageProfile", "metadata": {"name": "hostile"},
                       "spec": {"x": {f"k{i}": i for i in range(n)}}}).encode()


def documents() -> dict[str, tuple[bytes, dict[str, str], str]]:
    """The issue's documents, and ones just under the default 1 MiB document limit that pass
    the byte bound and meet the node or value bound instead."""
    levels = [f"    a: &a [{', '.join(['x'] * 9)}]\n"]
    levels += [f"    {c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n"
               for p, c in zip("abcdefgh", "bcdefghi", strict=True)]
    register = json.dumps({"name": "h2", "address": "h2.example:7443", "topology_hash": "",
                           "facts": {f"k{i}": i for i in range(400_000)}}).encode()
    return {"keys": (_keys(100_000), YAML, PROFILES), "keys-1mib": (_keys(55_000), YAML, PROFILES),
            "scalar": (_scalar(7 << 20), YAML, PROFILES), "scalar-1mib": (_scalar(1000_000), YAML, PROFILES),
            "wide": (_wide(300_000), JSON, PROFILES), "wide-1mib": (_wide(60_000), JSON, PROFILES),
            "bomb": ((HEAD + "".join(levels)).encode(), YAML, PROFILES),
            "base60": (_base60(4), YAML, PROFILES),
            "register-wide": (register, JSON, REGISTER)}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_until_serving(base: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"stortune-server exited with {proc.returncode}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return
        time.sleep(0.2)
    raise SystemExit(f"stortune-server did not answer on {base}")


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else float("nan")


def figures(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50_ms": round(percentile(values, 0.5) * 1000, 1),
            "p99_ms": round(percentile(values, 0.99) * 1000, 1),
            "max_ms": round(max(values, default=0) * 1000, 1)}


def timed(call: Callable[[], httpx.Response]) -> tuple[float, int]:
    started = time.perf_counter()
    try:
        code = call().status_code
    except httpx.TimeoutException:
        code = 0
    return time.perf_counter() - started, code


def run(base: str, token: str, clients: int, seconds: float, kinds: list[str]) -> dict[str, object]:
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=base, headers=headers, timeout=120) as admin:
        admin.post(f"{API}/agents/register", json={
            "name": "h1", "address": "h1.example:7443", "labels": {}, "topology_hash": "",
            "facts": {"kernel": "6.1.0", "agent_version": "0.1.0", "boot_id": "boot-1"}}).raise_for_status()
    docs = {kind: doc for kind, doc in documents().items() if kind in kinds}
    stop = threading.Event()
    answers: dict[str, Counter[int]] = {kind: Counter() for kind in docs}
    took: dict[str, list[float]] = {kind: [] for kind in docs}
    health: list[float] = []
    heartbeats: list[float] = []
    lock = threading.Lock()

    def attacker(first: int) -> None:
        kinds = list(docs)
        with httpx.Client(base_url=base, headers=headers, timeout=120) as client:
            i = first
            while not stop.is_set():
                kind = kinds[i % len(kinds)]
                body, content_type, path = docs[kind]
                elapsed, code = timed(lambda b=body, h=content_type, p=path:  # type: ignore[misc]
                                      client.post(p, content=b, headers=h))
                with lock:
                    answers[kind][code] += 1
                    took[kind].append(elapsed)
                i += 1

    def prober() -> None:
        with httpx.Client(base_url=base, headers=headers, timeout=120) as client:
            while not stop.is_set():
                health.append(timed(lambda: client.get("/healthz"))[0])
                heartbeats.append(timed(lambda: client.post(
                    f"{API}/agents/h1/heartbeat", json={"topology_hash": "", "boot_id": "boot-1"}))[0])
                time.sleep(0.05)

    threads = [threading.Thread(target=attacker, args=(i,)) for i in range(clients)]
    threads.append(threading.Thread(target=prober))
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    for kind in docs:
        print(f"{kind}: {len(docs[kind][0]) / (1 << 20):.1f} MiB, answers {dict(answers[kind])}, "
              f"median {statistics.median(took[kind]) if took[kind] else float('nan'):.2f} s", flush=True)
    refused = sum(n for c in answers.values() for code, n in c.items() if 400 <= code < 500)
    return {"clients": clients, "seconds": seconds, "healthz": figures(health),
            "heartbeat": figures(heartbeats), "hostile_refused_4xx": refused,
            "hostile_posted": sum(sum(c.values()) for c in answers.values())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", help="SQLAlchemy URL (default: SQLite in a temporary directory)")
    parser.add_argument("--port", type=int, default=0, help="default: a free one")
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--kinds", default=",".join(KINDS), help="documents to post, of: %(default)s")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stortune-hostile-") as tmp:
        work = Path(tmp)
        port = args.port or free_port()
        base = f"http://127.0.0.1:{port}"
        server = Path(sys.executable).with_name("stortune-server")
        with (work / "server.log").open("wb") as log:
            proc = subprocess.Popen([str(server), "--db", args.db or f"sqlite:///{work}/cp.db", "--state-dir",
                                     str(work / "state"), "--listen", f"127.0.0.1:{port}"],
                                    stdout=log, stderr=subprocess.STDOUT)
            try:
                wait_until_serving(base, proc)
                token = (work / "state/admin.token").read_text().strip()
                result = run(base, token, args.clients, args.seconds, args.kinds.split(","))
            finally:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
