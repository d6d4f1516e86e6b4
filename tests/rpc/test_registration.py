"""`stortune-agent serve --server URL`: register, heartbeat, topology updates, backoff.

A small stdlib HTTP server on 127.0.0.1 stands in for the control plane's REST
API (the test double sits at the network boundary); the agent is the real one.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from stortune.agent import cli, corrections, hostkey, registration
from stortune.agent.registration import Registrar, RegistrationConfig, backoff_delay
from stortune.agent.serve import Agent, ServeOptions
from stortune.api.agent import HOST_KEY_HEADER
from stortune.schemas.plan import Desired, Source
from stortune.schemas.topology import Topology
from tests.fixtures.agent_host import BOOT_ID, Host
from tests.rpc.conftest import call

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Request:
    method: str
    path: str
    body: dict[str, Any]
    at: float
    authorization: str | None = None
    host_key: str | None = None


Reply = tuple[int, dict[str, Any]]


@dataclass
class FakeControlPlane:
    """Records requests; ``script[kind]`` holds replies to use before the default one."""

    url: str = ""
    requests: list[Request] = field(default_factory=list)
    script: dict[str, list[Reply]] = field(default_factory=dict)
    heartbeat_s: float = 0.1
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: None: a control plane without watches (404, as before they existed); else how long it
    #: holds one.
    watch_s: float | None = None
    #: Ends every hold now (set when the fixture ends); ``holding`` counts the watches held now.
    released: threading.Event = field(default_factory=threading.Event)
    holding: int = 0

    def kind(self, method: str, path: str) -> str:
        if path == "/api/v1/agents/register":
            return "register"
        if path.endswith("/heartbeat"):
            return "heartbeat"
        if path.endswith("/watch"):
            return "watch"
        if method == "PUT" and path.endswith("/topology"):
            return "topology"
        return "other"

    def reply(self, method: str, path: str, body: dict[str, Any],
              authorization: str | None = None, host_key: str | None = None) -> Reply:
        kind = self.kind(method, path)
        with self.lock:
            self.requests.append(Request(method, path, body, time.monotonic(), authorization, host_key))
            scripted = self.script.get(kind)
            if scripted:
                return scripted.pop(0)
        if kind == "register":
            return 200, {"name": body["name"], "heartbeat_interval_s": self.heartbeat_s,
                         "lease_duration_s": 30, "topology_wanted": False}
        if kind == "heartbeat":
            return 200, {"topology_wanted": False}
        if kind == "topology":
            return 200, {}
        if kind == "watch" and self.watch_s is not None:
            with self.lock:
                self.holding += 1
            try:
                self.released.wait(self.watch_s)
            finally:
                with self.lock:
                    self.holding -= 1
            return 200, {"watch_s": self.watch_s, "topology_wanted": False}
        return 404, {"detail": "no such route"}

    def of(self, kind: str) -> list[Request]:
        with self.lock:
            return [r for r in self.requests if self.kind(r.method, r.path) == kind]

    def kinds(self, *, watches: bool = False) -> list[str]:
        """The kinds of the requests in order; without the watches unless asked (an agent tries
        one, and falls back to heartbeats when the control plane has none)."""
        with self.lock:
            kinds = [self.kind(r.method, r.path) for r in self.requests]
        return [k for k in kinds if watches or k != "watch"]

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; requests so far: {self.kinds()}")
            time.sleep(0.02)


@pytest.fixture
def plane() -> Iterator[FakeControlPlane]:
    fake = FakeControlPlane()

    class Handler(BaseHTTPRequestHandler):
        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            status, data = fake.reply(self.command, self.path, body, self.headers.get("Authorization"),
                                      self.headers.get(HOST_KEY_HEADER))
            payload = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_POST = do_PUT = _handle

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        fake.released.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def managed(host: Host, tmp_path: Path, plane: FakeControlPlane) -> Iterator[Callable[..., Agent]]:
    """Start the real agent registered with the fake control plane; always stopped."""
    started: list[Agent] = []

    def start(**options: Any) -> Agent:
        opts = {"listen": "127.0.0.1:0", "server": plane.url, "name": "rpc-host",
                "labels": {"role": "streamer"}, "rescan_interval": 3600.0, "grace": 1.0,
                "backoff_base": 0.05, "backoff_cap": 0.4, "insecure": True, **options}
        agent = Agent(host.fs, tmp_path / "state", ServeOptions(**opts))
        started.append(agent)
        agent.start()
        return agent

    try:
        yield start
    finally:
        for agent in started:
            agent.stop()


def test_registers_then_heartbeats(managed: Callable[..., Agent], plane: FakeControlPlane) -> None:
    agent = managed()
    plane.wait_for(lambda: len(plane.of("heartbeat")) >= 3)
    kinds = plane.kinds()
    assert kinds[0] == "register" and set(kinds[1:]) == {"heartbeat"}

    register = plane.of("register")[0].body
    assert register["name"] == "rpc-host"
    assert register["address"] == agent.address and not agent.address.endswith(":0")
    assert register["labels"] == {"role": "streamer"}
    facts = register["facts"]
    assert (facts["hostname"], facts["kernel"], facts["boot_id"]) == ("rpc-host", "6.1.0-18-amd64", BOOT_ID)
    assert facts["agent_version"] and facts["cpu_count"] >= 1
    assert "mem_bytes" in facts  # None: the fixture procfs has no meminfo
    topology = Topology.model_validate(register["topology"])
    assert [d.name for d in topology.devices] == ["loop7"]
    assert register["topology_hash"] == topology.structure_hash()

    beat = plane.of("heartbeat")[0]
    assert beat.path == "/api/v1/agents/rpc-host/heartbeat"
    assert beat.body == {"topology_hash": register["topology_hash"], "boot_id": BOOT_ID,
                         "observed_digest": register["observed_digest"]}
    # This control plane holds no watches: the agent asked once, then heartbeats.
    assert plane.kinds(watches=True)[:3] == ["register", "watch", "heartbeat"]
    assert len(plane.of("watch")) == 1

    # Registered, and the API the control plane will call is up at the advertised address.
    _, _, topology_hash = call(lambda c: c.for_address(register["address"]).get_topology())
    assert topology_hash == register["topology_hash"]


def test_sends_the_topology_when_the_server_wants_it(
        managed: Callable[..., Agent], plane: FakeControlPlane) -> None:
    plane.script["heartbeat"] = [(200, {}), (200, {"topology_wanted": True})]
    managed()
    plane.wait_for(lambda: len(plane.of("heartbeat")) >= 5)
    (put,) = plane.of("topology")
    assert put.path == "/api/v1/agents/rpc-host/topology"
    assert put.body["topology_hash"] == plane.of("register")[0].body["topology_hash"]
    assert Topology.model_validate(put.body["topology"]).device("loop7") is not None
    # Sent right after the heartbeat that asked for it, and only once.
    assert plane.kinds()[:4] == ["register", "heartbeat", "heartbeat", "topology"]


def test_sends_the_topology_when_a_rescan_finds_new_hardware(
        managed: Callable[..., Agent], plane: FakeControlPlane, host: Host) -> None:
    managed(rescan_interval=0.2)
    plane.wait_for(lambda: len(plane.of("heartbeat")) >= 1)
    assert plane.of("topology") == []
    host.builder.loop(8, size=65536, backing_file="/var/tmp/hotplug.img")  # a device appears
    plane.wait_for(lambda: len(plane.of("topology")) >= 1)
    put = plane.of("topology")[0].body
    assert sorted(d.name for d in Topology.model_validate(put["topology"]).devices) == ["loop7", "loop8"]
    plane.wait_for(lambda: plane.of("heartbeat")[-1].body["topology_hash"] == put["topology_hash"])


def test_registers_again_after_a_404_heartbeat(
        managed: Callable[..., Agent], plane: FakeControlPlane) -> None:
    plane.script["heartbeat"] = [(200, {}), (404, {"detail": "agent not found"})]
    managed()
    plane.wait_for(lambda: len(plane.of("register")) >= 2 and len(plane.of("heartbeat")) >= 4)
    assert plane.kinds()[:4] == ["register", "heartbeat", "heartbeat", "register"]


def test_backs_off_while_the_server_fails_then_registers(
        managed: Callable[..., Agent], plane: FakeControlPlane,
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    plane.script["register"] = [(503, {"detail": "starting up"})] * 6
    delays: list[float] = []  # what the registration loop waits before each retry
    real_delay = registration.backoff_delay
    monkeypatch.setattr(registration, "backoff_delay",
                        lambda *args: delays.append(real_delay(*args)) or delays[-1])
    with caplog.at_level(logging.INFO, logger="stortune.agent.registration"):
        agent = managed()
        # The agent's own API is up while the control plane is not.
        call(lambda c: c.for_address(agent.address).get_observed())
        plane.wait_for(lambda: len(plane.of("heartbeat")) >= 1)
    assert len(plane.of("register")) == 7
    assert len(delays) == 6 and max(delays) <= 0.4, delays  # one backoff per failure, capped
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and r.name == "stortune.agent.registration"]
    assert len(warnings) == 1, warnings  # once per state change, not per attempt
    assert "HTTP 503" in warnings[0] and "starting up" in warnings[0]
    assert any("reachable again after 6 failed attempt(s)" in r.getMessage() for r in caplog.records)


def test_backoff_is_exponential_full_jitter_and_capped() -> None:
    highest = [backoff_delay(n, 1.0, 30.0, lambda lo, hi: hi) for n in range(1, 9)]
    assert highest == [1, 2, 4, 8, 16, 30, 30, 30]
    assert all(backoff_delay(n, 1.0, 30.0, lambda lo, hi: lo) == 0 for n in range(1, 9))
    assert backoff_delay(10_000, 1.0, 30.0, lambda lo, hi: hi) == 30  # no overflow


def test_an_unreachable_server_is_retried_with_growing_delays(host: Host) -> None:
    """Against a closed port, with the jitter pinned to its maximum."""
    from tests.rpc.conftest import free_port

    times: list[float] = []

    def discover() -> Topology:
        times.append(time.monotonic())
        return Topology(hostname="x")

    registrar = Registrar(
        RegistrationConfig(server=f"http://127.0.0.1:{free_port()}", name="x", address="x:1",
                           backoff_base=0.05, backoff_cap=0.2, timeout=1),
        facts=dict, discover=discover, topology_hash=lambda: "h", boot_id="b",
        uniform=lambda lo, hi: hi)
    waits: list[float] = []  # the loop's waits: the first attempt's, then one per failure
    real_sleep = registrar._sleep
    registrar._sleep = lambda delay: waits.append(delay) or real_sleep(delay)  # type: ignore[method-assign]
    thread = threading.Thread(target=registrar.run)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while len(times) < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        registrar.stop()
        thread.join(5)
    assert not thread.is_alive()
    assert registrar.state == "failing" and registrar.name is None
    assert len(times) >= 6, times
    assert waits[:6] == pytest.approx([0.0, 0.05, 0.1, 0.2, 0.2, 0.2]), waits
    # Lower bounds only: each attempt waited its delay, which a slow machine can only lengthen.
    gaps = [b - a for a, b in itertools.pairwise(times)][:5]
    assert all(gap >= expected * 0.9 for gap, expected in zip(gaps, waits[1:6], strict=True)), gaps


def test_serve_subprocess_registers_and_stops_cleanly_on_sigterm(
        host: Host, tmp_path: Path, plane: FakeControlPlane) -> None:
    secret = "stt_" + secrets.token_urlsafe(32)
    (tmp_path / "agent.token").write_text(secret + "\n")
    cmd = [sys.executable, "-m", "stortune.agent.cli", "-v", "serve", "--server", plane.url,
           "--listen", "127.0.0.1:0", "--name", "sub-agent", "--label", "role=test",
           "--sysfs", str(host.fs.sysfs), "--procfs", str(host.fs.procfs),
           "--state-dir", str(tmp_path / "state"), "--token-file", str(tmp_path / "agent.token"),
           "--insecure"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        plane.wait_for(lambda: len(plane.of("heartbeat")) >= 1, timeout=20)
        register = plane.of("register")[0].body
        assert register["name"] == "sub-agent" and register["labels"] == {"role": "test"}
        assert {r.authorization for r in plane.requests} == {f"Bearer {secret}"}
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    assert f"agent API listening on {register['address']}" in stderr
    assert "agent stopped" in stderr
    assert "Traceback" not in stderr
    assert secret not in stderr  # debug logging (-v) included


def test_a_refused_token_is_retried_with_backoff_and_a_hint(
        managed: Callable[..., Agent], plane: FakeControlPlane,
        caplog: pytest.LogCaptureFixture) -> None:
    plane.script["register"] = [(401, {"message": "unknown token"})] * 2
    secret = "stt_" + secrets.token_urlsafe(32)
    with caplog.at_level(logging.DEBUG, logger="stortune.agent"):
        managed(token=secret)
        plane.wait_for(lambda: len(plane.of("heartbeat")) >= 1)
    assert len(plane.of("register")) == 3
    assert {r.authorization for r in plane.requests} == {f"Bearer {secret}"}
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "HTTP 401" in logged and "--token-file" in logged
    assert secret not in logged


@pytest.mark.parametrize(("argv", "message"), [
    (["--label", "no-equals-sign"], "expected KEY=VALUE"),
    (["--label", "bad key=x"], "is not a valid label key"),
    (["--label", "k=" + "v" * 64], "is not valid"),
    (["--heartbeat", "0"], "must be more than 0 seconds"),
])
def test_bad_serve_arguments_are_clear_cli_errors(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["serve", "--server", "http://127.0.0.1:1", "--listen", "127.0.0.1:0", *argv])
    assert exit_.value.code == 1  # a usage error
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["--server", "http://127.0.0.1:1"], "--server needs --listen"),
    (["--server", "127.0.0.1:8000", "--listen", "127.0.0.1:0"], "expected an http:// or https:// URL"),
    (["--listen", "127.0.0.1:0", "--once"], "cannot be combined"),
    (["--listen", "127.0.0.1:0", "--label", "a=1", "--label", "a=2"], "--label a given more than once"),
])
def test_inconsistent_serve_options_are_refused(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str], host: Host,
        tmp_path: Path) -> None:
    code = cli.main(["serve", "--sysfs", str(host.fs.sysfs), "--procfs", str(host.fs.procfs),
                     "--state-dir", str(tmp_path / "state"), *argv])
    assert code == 1
    assert message in capsys.readouterr().err


def test_a_busy_listen_address_is_a_clear_error(
        host: Host, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        code = cli.main(["serve", "--listen", f"127.0.0.1:{port}", "--sysfs", str(host.fs.sysfs),
                         "--procfs", str(host.fs.procfs), "--state-dir", str(tmp_path / "state"),
                         "--insecure"])
    assert code == 1
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


def _refusal(code: int) -> Reply:
    """What the control plane answers a call for an enrolled host without its key."""
    return code, {"kind": "Status", "code": code, "reason": "Conflict" if code == 409 else "Forbidden",
                  "message": "host 'rpc-host' is enrolled with another host key",
                  "details": {"kind": "Host", "name": "rpc-host", "causes": [
                      {"field": f"header.{HOST_KEY_HEADER}", "message": "does not match"}]}}


def test_every_call_carries_the_host_key_kept_in_the_state_directory(
        managed: Callable[..., Agent], plane: FakeControlPlane, tmp_path: Path) -> None:
    plane.script["heartbeat"] = [(200, {"topology_wanted": True})]
    first = managed()
    plane.wait_for(lambda: len(plane.of("topology")) >= 1 and len(plane.of("heartbeat")) >= 2)
    key = hostkey.path_in(tmp_path / "state").read_text().strip()
    assert {r.host_key for r in plane.requests} == {key}
    assert hostkey.path_in(tmp_path / "state").stat().st_mode & 0o777 == 0o600
    first.stop()
    plane.requests.clear()
    managed()  # restarted with its state directory: the same key
    plane.wait_for(lambda: len(plane.of("heartbeat")) >= 1)
    assert {r.host_key for r in plane.requests} == {key}


@pytest.mark.parametrize(("kind", "code"), [("register", 409), ("heartbeat", 403)])
def test_a_refused_identity_is_logged_once_with_what_to_do_and_retried_slowly(
        plane: FakeControlPlane, caplog: pytest.LogCaptureFixture, kind: str, code: int) -> None:
    """The name is enrolled with another key: one ERROR that says what to do (an admin deletes
    the host, or the state directory is restored), then attempts ten times further apart than
    for an outage, until the control plane accepts (here: after the admin deleted the host)."""
    times: list[float] = []
    refusals = 7
    plane.script[kind] = [_refusal(code)] * refusals
    if kind == "heartbeat":
        plane.script["heartbeat"].append((404, {}))  # deleted by an admin: register again
    registrar = Registrar(
        RegistrationConfig(server=plane.url, name="rpc-host", address="x:1", backoff_base=0.01,
                           backoff_cap=0.02, host_key="K" * 43, host_key_file="/var/lib/stortune/host.key"),
        facts=dict, discover=lambda: (times.append(time.monotonic()), Topology(hostname="x"))[1],
        topology_hash=lambda: "h", boot_id="b", uniform=lambda lo, hi: hi)
    thread = threading.Thread(target=registrar.run)
    with caplog.at_level(logging.DEBUG, logger="stortune.agent.registration"):
        thread.start()
        try:
            plane.wait_for(lambda: registrar.state == "registered" and len(plane.of(kind)) > refusals,
                           timeout=20)
        finally:
            registrar.stop()
            thread.join(5)
    attempts = [r.at for r in plane.of(kind)][:refusals + 1]
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert max(gaps) >= 0.15, gaps  # beyond the 0.02 s cap of an outage: up to 0.2 s apart
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors  # once, not per attempt
    assert "enrolled with another host key" in errors[0]
    assert "an admin deletes the host (DELETE /api/v1/hosts/rpc-host" in errors[0]
    assert "restore its state directory (the key is /var/lib/stortune/host.key)" in errors[0]
    assert "token's role" not in errors[0]
    assert "K" * 43 not in "\n".join(r.getMessage() for r in caplog.records)
    assert {r.host_key for r in plane.requests} == {"K" * 43}


# -- watches: a control plane that holds them ---------------------------------------------------

def _observed_digest(agent: Agent) -> str:
    """The digest of what GetObserved answers now, as the control plane computes it."""
    return str(call(lambda c: c.for_address(agent.address).get_observed()).digest)


def test_a_watching_agent_sends_no_heartbeat_until_its_values_change(
        managed: Callable[..., Agent], plane: FakeControlPlane, host: Host) -> None:
    plane.watch_s = 0.2
    agent = managed(observe_interval=0.1)
    plane.wait_for(lambda: len(plane.of("watch")) >= 4)
    assert plane.kinds(watches=True)[:2] == ["register", "watch"]
    assert plane.of("heartbeat") == []  # held watches keep the lease: nothing else is sent
    watch = plane.of("watch")[0]
    assert watch.path == "/api/v1/agents/rpc-host/watch"
    assert watch.body["observed_digest"] == _observed_digest(agent)
    assert plane.of("register")[0].body["observed_digest"] == watch.body["observed_digest"]

    # A hand-made change: reported by a heartbeat at once, with the digest the control plane
    # will compute from GetObserved, while the watch stays held.
    (host.fs.sysfs / "block/loop7/queue/read_ahead_kb").write_text("4096\n")
    plane.wait_for(lambda: len(plane.of("heartbeat")) >= 1)
    changed = plane.of("heartbeat")[0].body["observed_digest"]
    assert changed != watch.body["observed_digest"] and changed == _observed_digest(agent)
    plane.wait_for(lambda: plane.of("watch")[-1].body["observed_digest"] == changed)
    assert len(plane.of("heartbeat")) == 1  # one change, one report


def test_stop_ends_a_held_watch_at_once(managed: Callable[..., Agent], plane: FakeControlPlane) -> None:
    """The control plane holds the watch until the test ends. stop() ends the agent's registration
    thread while the watch is still held there: the agent cut its call short rather than waiting
    for the answer (had it waited, the thread would still be blocked when stop() gives up
    joining it)."""
    plane.watch_s = 3600.0  # until released: the fixture's end
    before = set(threading.enumerate())
    agent = managed()
    plane.wait_for(lambda: plane.holding == 1)
    (registering,) = [t for t in threading.enumerate()
                     if t not in before and t.name == "stortune-registration"]
    agent.stop()
    assert not registering.is_alive(), "the registration thread still waits on the held watch"
    assert plane.holding == 1 and len(plane.of("watch")) == 1  # the hold the agent left
    registrar = agent.registrar
    assert registrar is not None and registrar.state == "registered"


def test_hostile_a_server_answering_every_watch_at_once_does_not_make_a_busy_loop(
        managed: Callable[..., Agent], plane: FakeControlPlane) -> None:
    plane.script["watch"] = [(200, {"watch_s": 0, "topology_wanted": False})] * 50
    managed()
    plane.wait_for(lambda: len(plane.of("watch")) >= 3, timeout=60)
    watches = plane.of("watch")
    # Lower bounds only (a slow machine can only widen the gaps): a busy loop's would be milliseconds.
    gaps = [b.at - a.at for a, b in itertools.pairwise(watches)]
    assert all(gap >= 0.9 for gap in gaps), gaps
    assert plane.of("heartbeat") == []


def test_a_watch_asking_for_the_topology_gets_it_then_the_agent_watches_again(
        managed: Callable[..., Agent], plane: FakeControlPlane) -> None:
    plane.watch_s = 0.1
    plane.script["watch"] = [(200, {"watch_s": 0.1, "topology_wanted": True})]
    managed()
    plane.wait_for(lambda: len(plane.of("topology")) == 1 and len(plane.of("watch")) >= 3)
    assert plane.kinds(watches=True)[:4] == ["register", "watch", "topology", "watch"]


def test_hostile_corrections_go_only_to_a_server_that_takes_them_and_stop_once_recorded(
        managed: Callable[..., Agent], plane: FakeControlPlane, tmp_path: Path) -> None:
    """An older control plane refuses a heartbeat with a field it does not know (422): the agent's
    corrections go only after an answer saying ``accepts_corrections``, and are dropped once one
    says they are recorded."""
    state = tmp_path / "state"
    found = Desired(device="loop7", device_id="loop:/var/tmp/rpc-test.img", tunable="read_ahead_kb",
                    desired=4096, observed=256, in_sync=False,
                    source=Source(profile="streaming", rule="loops"))
    (kept,) = corrections.add(state, [found], "runtime", "start")
    accepts = {"topology_wanted": False, "accepts_corrections": True}
    plane.script["heartbeat"] = [(200, accepts), (200, {**accepts, "corrections_recorded": kept.seq})]

    managed()
    plane.wait_for(lambda: len(plane.of("heartbeat")) >= 3)

    beats = [r.body for r in plane.of("heartbeat")[:3]]
    assert "corrections" not in beats[0]  # the registration's answer did not say it takes them
    sent = beats[1]["corrections"]
    assert [(c["seq"], c["found"], c["set_to"], c["cause"]) for c in sent["items"]] == [
        (1, 256, 4096, "runtime")]
    assert "corrections" not in beats[2]
    assert corrections.batch(state) is None


def test_sends_the_topology_when_swap_is_turned_on_though_no_device_changed(
        managed: Callable[..., Agent], plane: FakeControlPlane, host: Host) -> None:
    """The protected devices travel with the topology (the control plane's dry runs refuse them):
    `swapon /dev/loop7` changes them and not the device graph's hash, and is sent all the same."""
    managed(rescan_interval=0.2)
    plane.wait_for(lambda: len(plane.of("heartbeat")) >= 1)
    assert plane.of("register")[0].body["topology"]["protected"] == [] and plane.of("topology") == []
    swaps = "Filename Type Size Used Priority\n/dev/loop7 partition 65532 0 -2\n"
    (host.fs.procfs / "swaps").write_text(swaps)
    plane.wait_for(lambda: len(plane.of("topology")) >= 1)
    put = plane.of("topology")[0].body
    assert [(p["name"], p["reason"]) for p in put["topology"]["protected"]] == [
        ("loop7", "loop7 backs swap (/dev/loop7)")]
    assert put["topology_hash"] == plane.of("register")[0].body["topology_hash"]
