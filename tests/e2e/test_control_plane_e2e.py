"""End to end with real processes on 127.0.0.1: stortune-server under uvicorn,
two stortune-agent processes over real gRPC (one on a fixture md RAID5 host,
one on this machine's real loop device), driven with the stortune CLI.

One test walks the life of a fleet, because each phase starts from the state
the previous one left: apply -> Ready; drift by hand -> corrected (enforce) or
only reported (audit); agent killed -> unreachable, restarted -> reconciled;
server killed mid-rollout -> nothing lost; profiles deleted -> originals back.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures.scenarios import md_raid5_fileserver

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]
INTERVAL = "1"  # drift check every second keeps the test short


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def eventually(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    """Poll until ``check`` returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except httpx.HTTPError as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}; last seen: {last!r}")


@dataclass
class Proc:
    args: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL,
                                     stderr=self.log.open("ab"))

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


@dataclass
class Fleet:
    tmp: Path
    url: str = ""
    server: Proc | None = None
    agents: dict[str, Proc] = field(default_factory=dict)
    admin_token: str = ""  # what the server's first start wrote to STATE_DIR/admin.token

    @property
    def state(self) -> Path:
        return self.tmp / "server-state"

    def api(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=10,
                            headers={"Authorization": f"Bearer {self.admin_token}"})

    def host(self, name: str) -> dict[str, Any]:
        with self.api() as c:
            r = c.get(f"/api/v1/hosts/{name}")
            r.raise_for_status()
            return dict(r.json())

    def condition(self, host: str, kind: str) -> dict[str, Any] | None:
        for cond in self.host(host)["status"].get("conditions", []):
            if cond["type"] == kind:
                return dict(cond)
        return None

    def is_(self, host: str, kind: str, status: str = "True") -> dict[str, Any] | None:
        cond = self.condition(host, kind)
        return cond if cond and cond["status"] == status else None

    def converged(self, host: str, profile: str) -> bool:
        """Ready with the profile's current generation applied (Ready alone may predate it)."""
        with self.api() as c:
            r = c.get(f"/api/v1/profiles/{profile}")
            r.raise_for_status()
            generation = r.json()["metadata"]["generation"]
        applied = self.host(host)["status"].get("appliedGenerations", {})
        return applied.get(profile) == generation and self.is_(host, "Ready") is not None

    def events(self, host: str) -> list[dict[str, Any]]:
        with self.api() as c:
            r = c.get("/api/v1/events", params={"host": host, "limit": 200})
            r.raise_for_status()
            return list(r.json()["items"])

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "STORTUNE_SERVER": self.url, "STORTUNE_TOKEN": self.admin_token,
               "NO_COLOR": "1"}
        return subprocess.run([str(BIN / "stortune"), *args], capture_output=True, text=True,
                              env=env, timeout=120, check=False)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(tmp_path)
    port = free_port()
    f.url = f"http://127.0.0.1:{port}"
    f.server = Proc([str(BIN / "stortune-server"), "--db", f"sqlite:///{tmp_path}/cp.db",
                     "--state-dir", str(f.state), "--listen", f"127.0.0.1:{port}",
                     "--reconcile-interval", INTERVAL,
                     # A killed agent is noticed within its lease (kept meanwhile by its watch).
                     "--lease-duration", "8", "--heartbeat-interval", "2"],
                    tmp_path / "server.log")
    f.server.start()
    try:
        eventually("the control plane", lambda: httpx.get(f.url + "/healthz").is_success)
        f.admin_token = (f.state / "admin.token").read_text().strip()
        yield f
    finally:
        for agent in f.agents.values():
            agent.stop()
        f.server.stop()
        for log in sorted(tmp_path.glob("*.log")):
            sys.stderr.write(f"--- {log.name}\n{log.read_text()[-4000:]}\n")


def agent_proc(f: Fleet, name: str, roots: list[str], label: str) -> Proc:
    port = free_port()
    return Proc([str(BIN / "stortune-agent"), "serve", "--server", f.url, "--listen",
                 f"127.0.0.1:{port}", "--name", name, "--label", label,
                 "--token-file", str(f.state / "agent-bootstrap.token"),
                 "--state-dir", str(f.tmp / f"{name}-state"), "--rescan-interval", "2",
                 "--observe-interval", "2", *roots],  # a drift reported within 2 s
                f.tmp / f"{name}.log")


def loop_profile(dev: str, mode: str) -> str:
    return f"""apiVersion: stortune/v1
kind: StorageProfile
metadata: {{name: e2e-loop}}
spec:
  hostSelector: {{matchLabels: {{e2e: loop}}}}
  priority: 10
  mode: {mode}
  rules:
    - name: the-loop
      match: {{kind: [loop], name: [{dev}]}}
      settings: {{read_ahead_kb: 4096, nr_requests: 64}}
"""


def test_fleet_life(fleet: Fleet, loop_devices: Callable[[int], list[str]], tmp_path: Path) -> None:
    (dev,) = loop_devices(1)
    ra = Path("/sys/block") / dev / "queue/read_ahead_kb"
    original_ra = ra.read_text().strip()
    fs = md_raid5_fileserver(tmp_path / "fileserver")
    stripe = fs.sysfs / "class/block/md126/md/stripe_cache_size"
    original_stripe = stripe.read_text().strip()

    fleet.agents["fileserver"] = agent_proc(
        fleet, "fileserver", ["--sysfs", str(fs.sysfs), "--procfs", str(fs.procfs)],
        "role=fileserver")
    fleet.agents["loophost"] = agent_proc(fleet, "loophost", [], "e2e=loop")
    for agent in fleet.agents.values():
        agent.start()

    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "fileserver.yaml").write_text((ROOT / "examples/md-raid5-fileserver.yaml").read_text())
    (profiles / "loop.yaml").write_text(loop_profile(dev, "enforce"))

    # -- apply with the CLI: both hosts Ready ---------------------------------------------
    eventually("both agents registered", lambda: all(
        fleet.condition(h, "Reachable") for h in ("fileserver", "loophost")))
    applied = fleet.cli("apply", "-f", str(profiles))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    for host, name in (("fileserver", "md-raid5-fileserver"), ("loophost", "e2e-loop")):
        eventually(f"{host} Ready", lambda h=host, n=name: fleet.converged(h, n))
    assert stripe.read_text().strip() == "4096"
    assert ra.read_text().strip() == "4096"
    devices = fleet.host("loophost")["status"]["devices"]
    row = next(d for d in devices if d["device"] == dev and d["tunable"] == "read_ahead_kb")
    assert (row["desired"], row["observed"], row["profile"], row["rule"]) == (
        4096, 4096, "e2e-loop", "the-loop")
    assert fleet.cli("diff", "-f", str(profiles)).returncode == 0

    # -- drift by hand, enforce: recorded with its cause, then corrected --------------------
    ra.write_text("128")
    eventually("the drift event", lambda: [
        e for e in fleet.events("loophost")
        if "drift" in e["reason"].lower() and "changed while the agent was running" in e["message"]])
    eventually("the correction", lambda: ra.read_text().strip() == "4096")
    eventually("loophost Ready again", lambda: fleet.is_("loophost", "Ready"))

    # -- audit mode: drift is reported, not corrected ----------------------------------------
    (profiles / "loop.yaml").write_text(loop_profile(dev, "audit"))
    assert fleet.cli("apply", "-f", str(profiles)).returncode == 0
    eventually("audit mode in effect", lambda: fleet.converged("loophost", "e2e-loop"))
    ra.write_text("256")
    eventually("Drifted=True in audit mode", lambda: fleet.is_("loophost", "Drifted"))
    generation_seen = fleet.host("loophost")["status"]
    assert ra.read_text().strip() == "256", generation_seen
    # The drift is shown, but applying would not change it: the CI gate stays green.
    diff = fleet.cli("diff", "-f", str(profiles))
    assert diff.returncode == 0, diff.stdout + diff.stderr
    assert "read_ahead_kb" in diff.stdout and "audit" in diff.stdout, diff.stdout
    (profiles / "loop.yaml").write_text(loop_profile(dev, "enforce"))
    assert fleet.cli("apply", "-f", str(profiles)).returncode == 0
    eventually("enforce again corrects", lambda: ra.read_text().strip() == "4096")

    # -- kill an agent: unreachable with a reason; restart: reconciled -----------------------
    fleet.agents["fileserver"].stop(signal.SIGKILL)
    down = eventually("fileserver Reachable=False", lambda: fleet.is_("fileserver", "Reachable",
                                                                          "False"))
    assert down["reason"] and down["message"]
    stripe.write_text("512")  # changed while nobody watched
    fleet.agents["fileserver"].start()
    eventually("fileserver reconciled", lambda: fleet.is_("fileserver", "Ready")
               and stripe.read_text().strip() == "4096")

    # -- server killed mid-rollout: nothing lost ---------------------------------------------
    before = {e["message"] for e in fleet.events("loophost")}
    text = (profiles / "fileserver.yaml").read_text().replace("stripe_cache_size: 4096",
                                                              "stripe_cache_size: 8192")
    (profiles / "fileserver.yaml").write_text(text)
    assert fleet.cli("apply", "-f", str(profiles)).returncode == 0
    assert fleet.server is not None
    fleet.server.stop(signal.SIGKILL)
    fleet.server.start()
    eventually("the control plane back", lambda: httpx.get(fleet.url + "/healthz").is_success)
    eventually("the rollout resumed", lambda: stripe.read_text().strip() == "8192")
    eventually("fileserver Ready after the restart",
               lambda: fleet.converged("fileserver", "md-raid5-fileserver"))
    assert before <= {e["message"] for e in fleet.events("loophost")}

    # -- a prune would put settings back: diff shows it before anything is deleted -------------
    # The originals come from loophost's journal, through GetObserved, into the stored topology.
    (profiles / "loop.yaml").unlink()
    pruning = fleet.cli("diff", "-f", str(profiles), "--prune")
    assert pruning.returncode == 2, pruning.stdout + pruning.stderr
    if original_ra != "4096":
        assert f"4096 -> {original_ra} (original)" in pruning.stdout, pruning.stdout

    # -- delete the profiles: originals restored, then the profiles are gone ----------------
    with fleet.api() as c:
        for name in ("e2e-loop", "md-raid5-fileserver"):
            assert c.delete(f"/api/v1/profiles/{name}").status_code in (200, 202)
    eventually("loop original restored", lambda: ra.read_text().strip() == original_ra)
    eventually("md original restored", lambda: stripe.read_text().strip() == original_stripe)

    def gone() -> bool:
        with fleet.api() as c:
            return all(c.get(f"/api/v1/profiles/{n}").status_code == 404
                       for n in ("e2e-loop", "md-raid5-fileserver"))

    eventually("profiles removed after finalization", gone)

    # -- the restart made no new admin token, and no log holds a secret -----------------------
    assert (fleet.state / "admin.token").read_text().strip() == fleet.admin_token
    agent_token = (fleet.state / "agent-bootstrap.token").read_text().strip()
    for log in sorted(tmp_path.glob("*.log")):
        text = log.read_text(errors="replace")
        assert fleet.admin_token not in text and agent_token not in text, log.name
