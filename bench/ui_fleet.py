"""The dashboard's fleet page with 10,000 hosts: time to interactive and bytes transferred.

    python bench/ui_fleet.py [--hosts 10000] [--runs 5]

Registers --hosts hosts in a new SQLite database in a temp dir through the registration
service the agents API calls (each with a small loop-device topology and no agent behind it),
starts `stortune-server` on it, then opens /ui/#/fleet in headless Debian chromium
(Playwright, a fresh browser context each run: a cold cache) and prints, per run, the time
from navigation start until the first page of hosts and the counts are on screen, and what
the page transferred: its own assets (HTML, scripts, styles: gzipped) and the API answers.
Targets: under 2 s, assets under 500 KB. Everything binds to loopback and is stopped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import fleet  # noqa: E402
from tests.server.builders import loop_topology  # noqa: E402
from tests.ui.browser import ARGS, CHROMIUM  # noqa: E402

READY = """() => {
  const table = document.querySelector('table.hosts[data-loaded="true"]');
  const hosts = document.querySelector('[data-count=hosts] .count-n');
  return table && table.querySelector('tr[data-host]') && hosts && hosts.textContent !== '\\u2013';
}"""


def prefill(url: str, hosts: int) -> float:
    """Register --hosts hosts straight through the service the agents API calls, in this
    process and before the server starts: the page is what this measures, and 10,000 HTTP
    registrations (each one a reconcile of an unreachable agent) took longer than the page
    ever will. Each host is as an admin registers it: a loop-device topology, labels, a lease
    long enough that none expires during the run (Reachable, no agent behind it)."""
    from stortune.server.db.engine import make_engine, make_sessions
    from stortune.server.db.migrate import upgrade
    from stortune.server.models.agents import Registration
    from stortune.server.services import hosts as host_service
    from stortune.server.services.host_keys import Proof

    started = time.monotonic()
    engine = make_engine(url)
    upgrade(engine)
    sessions = make_sessions(engine)
    admin = Proof(None, any_host=True)
    now = datetime.now(UTC)
    for i in range(hosts):
        name = f"ui-{i:05d}"
        body = Registration.model_validate({
            "name": name, "address": f"127.2.{i // 250}.{1 + i % 250}:50051",
            "labels": {"role": "fleet", "rack": f"r{i % 40}"},
            "facts": {"kernel": "6.1.0", "agent_version": "0.1.0", "boot_id": "boot-1"},
            "topology": loop_topology(name).model_dump(mode="json")})
        with sessions() as session:
            host_service.register(session, body, proof=admin, lease_duration_s=86_400, now=now)
    engine.dispose()
    return time.monotonic() - started


def measure(browser: Any, base: str, admin: str) -> dict[str, float]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        answer = context.request.post(f"{base}/api/v1/session", headers={"Authorization": f"Bearer {admin}"})
        assert answer.ok, answer.text()
        page = context.new_page()
        page.goto(f"{base}/ui/#/fleet")
        page.wait_for_function(READY, timeout=60_000, polling="raf")
        ready_ms = page.evaluate("() => performance.now()")
        entries = page.evaluate("""() => [...performance.getEntriesByType('navigation'),
                                          ...performance.getEntriesByType('resource')]
            .map(e => ({name: e.name, transfer: e.transferSize, type: e.initiatorType || 'navigation'}))""")
        assets = sum(e["transfer"] for e in entries if "/api/" not in e["name"])
        api = sum(e["transfer"] for e in entries if "/api/" in e["name"])
        return {"ready_s": ready_ms / 1000, "assets_kb": assets / 1000, "api_kb": api / 1000}
    finally:
        context.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="stortune-ui-bench-")))
        port = fleet.free_port()
        base = f"http://127.0.0.1:{port}"
        took = prefill(f"sqlite:///{work}/cp.db", args.hosts)
        print(f"{args.hosts} hosts registered through the registration service in {took:.1f} s", flush=True)
        server = subprocess.Popen(
            [str(fleet.BIN / "stortune-server"), "--db", f"sqlite:///{work}/cp.db", "--state-dir",
             str(work / "server"), "--listen", f"127.0.0.1:{port}", "--reconcile-interval", "60"],
            stdout=subprocess.DEVNULL, stderr=open(work / "server.log", "wb"))  # noqa: SIM115
        stack.callback(fleet._stop, [server])
        fleet.wait_for("the control plane", lambda: fleet._up(base), 120)
        admin = (work / "server/admin.token").read_text().strip()
        fleet.ADMIN["Authorization"] = f"Bearer {admin}"
        fleet.wait_for("the fleet counted", lambda: fleet.registered(base) >= args.hosts, 120, 0.5)
        time.sleep(2)  # let the registrations' reconciles settle
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            runs = [measure(browser, base, admin) for _ in range(args.runs)]
            browser.close()
    for i, run in enumerate(runs, 1):
        print(f"  run {i}: interactive after {run['ready_s']:.2f} s; transferred: assets "
              f"{run['assets_kb']:.1f} KB (gzipped), API {run['api_kb']:.1f} KB")
    ready = [r["ready_s"] for r in runs]
    print(json.dumps({"hosts": args.hosts, "time_to_interactive_s": {"median": statistics.median(ready),
                                                                     "max": max(ready)},
                      "assets_kb_gzipped": runs[0]["assets_kb"], "api_kb": runs[0]["api_kb"]}))
    print(f"fleet page, {args.hosts} hosts: time to interactive median {statistics.median(ready):.2f} s, "
          f"worst {max(ready):.2f} s (target < 2 s); assets {runs[0]['assets_kb']:.1f} KB gzipped "
          f"(target < 500 KB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
