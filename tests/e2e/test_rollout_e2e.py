"""Rollouts end to end on real loop devices (issue 27): stortune-server under uvicorn and two
stortune-agent processes over real gRPC, h-a and h-b, driven with the stortune CLI.

Each agent runs in its own mount namespace whose /sys/class/block is a tmpfs holding one symlink,
to its own direct-I/O loop device (a fresh one, over a file of real blocks): the agent discovers
that device and nothing else, as if each were a machine with one disk. A thread in the test reads
both devices' queues all along, so "the second host was never touched" is what the kernel showed,
not what the control plane says.

- a change from read_ahead_kb 4096 to 0, gated by a stream-32k analysis on the canary, halts
  after the canary (AnalysisFailed), the canary goes back to 4096, the other host never leaves
  it, and `stortune wait profile P --for rollout=complete` exits 1;
- a change from 0 to 4096 completes on both (`wait` exits 0);
- a change whose value the device refuses halts after the canary; the other host is untouched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_control_plane_e2e import (
    Fleet,
    Proc,
    agent_proc,
    eventually,
    fleet,  # noqa: F401 - the fixture, used by name
)
from tests.loopdev import STREAM_BYTES, fresh_loop

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(shutil.which("unshare") is None,
                       reason="unshare is not installed (Debian package util-linux)"),
]

PROFILE = "rollout-e2e"
LABEL = "rollout-e2e=pair"
HOSTS = ("h-a", "h-b")
#: Halted or complete well within this: two 5 s benchmarks, two applies, a rollback.
ROLLOUT_TIMEOUT = 300.0
#: A canary, then everyone; the analysis gates the first wave (its default).
GATED = "{waves: [{hosts: 1}, {percent: 100}], analysis: {benchmark: {preset: stream-32k, runtime: 5s}}}"

# The agent's own view of block devices: a tmpfs over /sys/class/block holding one link, as
# the kernel writes it (relative, into /sys/devices). Private propagation: the host never sees it.
_ONE_DEVICE = ('mount -t tmpfs -o size=64k,mode=0755 stortune-e2e /sys/class/block'
               ' && ln -s "$1" "/sys/class/block/$2" && shift 2 && exec "$@"')


@dataclass
class LoopHost:
    name: str
    device: str
    agent: Proc

    def queue(self, attr: str) -> str:
        """The device's queue attribute as the kernel shows it (a list as its current choice)."""
        raw = (Path("/sys/block") / self.device / "queue" / attr).read_text()
        return next((w.strip("[]") for w in raw.split() if w.startswith("[")), raw.strip())


def alone_with(proc: Proc, device: str) -> Proc:
    """``proc`` run in a new mount namespace where /sys/class/block lists ``device`` only."""
    link = os.readlink(f"/sys/class/block/{device}")
    proc.args = ["unshare", "--mount", "--propagation", "private", "sh", "-c", _ONE_DEVICE, "sh",
                 link, device, *proc.args]
    return proc


def _topology_names(f: Fleet, host: str) -> list[str] | None:
    with f.api() as c:
        r = c.get(f"/api/v1/hosts/{host}/topology")
        if not r.is_success or not r.json():
            return None
        return [d["name"] for d in r.json().get("devices", [])]


@contextlib.contextmanager
def _pair(f: Fleet, tmp: Path, *, fill: bool) -> Iterator[dict[str, LoopHost]]:
    if os.geteuid() != 0:
        pytest.skip("loop devices and mount namespaces need root")
    if shutil.which("losetup") is None or not Path("/dev/loop-control").exists():
        pytest.skip("no loop devices here (losetup, /dev/loop-control)")
    hosts: dict[str, LoopHost] = {}
    with contextlib.ExitStack() as stack:
        for name in HOSTS:
            dev = stack.enter_context(fresh_loop(tmp, STREAM_BYTES, direct_io=True, fill=fill))
            if (Path("/sys/block") / dev / "loop" / "dio").read_text().strip() != "1":
                pytest.skip(f"the filesystem of {tmp} refuses direct I/O to a loop device")
            agent = alone_with(agent_proc(f, name, [], LABEL), dev)
            f.agents[name] = agent
            stack.callback(agent.stop)  # before the device it holds is released (LIFO)
            hosts[name] = LoopHost(name, dev, agent)
        for host in hosts.values():
            host.agent.start()
        for host in hosts.values():
            eventually(f"{host.name} registered", partial(f.is_, host.name, "Reachable"))
            # Its discovery sees its own device and nothing else: not the other's, not this
            # machine's disks, not the loop devices other tests hold.
            seen = eventually(f"{host.name}'s topology", partial(_topology_names, f, host.name))
            assert seen == [host.device], (host.name, seen)
        yield hosts


@pytest.fixture
def pair(fleet: Fleet, tmp_path: Path) -> Iterator[dict[str, LoopHost]]:  # noqa: F811
    """h-a and h-b, each an agent alone with its own fresh direct-I/O loop device (sparse).
    Agents are stopped before their devices are released, whatever happens."""
    with _pair(fleet, tmp_path, fill=False) as hosts:
        yield hosts


@pytest.fixture
def filled_pair(fleet: Fleet, tmp_path: Path) -> Iterator[dict[str, LoopHost]]:  # noqa: F811
    """The same pair over files of real blocks: a benchmark must read the disk, not holes."""
    if shutil.which("fio") is None:
        pytest.skip("fio is not installed (Debian package fio)")
    with _pair(fleet, tmp_path, fill=True) as hosts:
        yield hosts


class Sampler:
    """Reads queue attributes of the pair's devices every 10 ms in a thread, keeping each value
    that differs from the one before: what the kernel showed, in order, while the test ran."""

    def __init__(self, hosts: dict[str, LoopHost], attrs: tuple[str, ...]) -> None:
        self.hosts, self.attrs = hosts, attrs
        self.seen: dict[tuple[str, str], list[str]] = {}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sysfs-sampler", daemon=True)

    def _sample(self) -> None:
        for host in self.hosts.values():
            for attr in self.attrs:
                try:
                    value = host.queue(attr)
                except OSError as exc:
                    self.errors.append(f"{host.device} {attr}: {exc}")
                    continue
                values = self.seen.setdefault((host.name, attr), [])
                if not values or values[-1] != value:
                    values.append(value)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(0.01)

    def __enter__(self) -> Sampler:
        self._sample()  # the starting values, before the caller changes anything
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._sample()

    def history(self, host: str, attr: str) -> list[str]:
        return self.seen[(host, attr)]


def profile(hosts: dict[str, LoopHost], settings: str, rollout: str | None = None) -> str:
    devices = ", ".join(h.device for h in hosts.values())
    text = f"""apiVersion: stortune/v1
kind: StorageProfile
metadata: {{name: {PROFILE}}}
spec:
  hostSelector: {{matchLabels: {{rollout-e2e: pair}}}}
  rules:
    - name: the-loops
      match: {{kind: [loop], name: [{devices}]}}
      settings: {settings}
"""
    return text + (f"  rollout: {rollout}\n" if rollout else "")


def apply(f: Fleet, tmp: Path, text: str, *, refused: str | None = None) -> None:
    """``stortune apply -f`` of one profile document. ``refused``: the CLI foresees that this
    setting cannot be set (exit 1, naming it) but stores the profile all the same."""
    path = tmp / f"{PROFILE}.yaml"
    path.write_text(text)
    run = f.cli("apply", "-f", str(path))
    out = run.stdout + run.stderr
    if refused is None:
        assert run.returncode == 0, out
    else:
        assert run.returncode == 1 and refused in run.stderr, out
    assert f"storageprofile/{PROFILE} " in run.stdout, out


def generation(f: Fleet) -> int:
    with f.api() as c:
        r = c.get(f"/api/v1/profiles/{PROFILE}")
        r.raise_for_status()
        return int(r.json()["metadata"]["generation"])


def rollout(f: Fleet) -> dict[str, Any] | None:
    with f.api() as c:
        r = c.get(f"/api/v1/profiles/{PROFILE}/rollout")
        if r.status_code == 404:
            return None
        r.raise_for_status()
        return dict(r.json())


def applied(f: Fleet, host: str) -> int | None:
    value = f.host(host)["status"].get("appliedGenerations", {}).get(PROFILE)
    return None if value is None else int(value)


def wait_complete(f: Fleet, timeout: str) -> tuple[int, str]:
    run = f.cli("wait", "profile", PROFILE, "--for", "rollout=complete", "--timeout", timeout)
    return run.returncode, run.stdout + run.stderr


def settle(f: Fleet, hosts: dict[str, LoopHost], expect: dict[str, str]) -> int:
    """Every host converged on the profile's current generation, its rollout complete, and the
    devices showing ``expect``; returns that generation."""
    g = generation(f)
    code, out = wait_complete(f, "5m")
    assert code == 0, out
    for host in hosts.values():
        eventually(f"{host.name} at generation {g}", partial(f.converged, host.name, PROFILE))
        for attr, value in expect.items():
            assert host.queue(attr) == value, (host.name, attr)
    state = rollout(f)
    assert state is None or (state["phase"] == "Complete" and state["generation"] == g), state
    return g


def reasons(f: Fleet) -> list[str]:
    """The reasons of the profile's events, oldest first."""
    with f.api() as c:
        r = c.get("/api/v1/events", params={"profile": PROFILE, "limit": 1000})
        r.raise_for_status()
        items = r.json()["items"]
    return [e["reason"] for e in sorted(items, key=lambda e: str(e.get("firstTimestamp") or ""))]


def canary_and_other(state: dict[str, Any]) -> tuple[str, str]:
    waves = {h["name"]: h["wave"] for h in state["hosts"]}
    assert sorted(waves) == sorted(HOSTS) and sorted(waves.values()) == [1, 2], state
    canary = next(n for n, w in waves.items() if w == 1)
    return canary, next(n for n in HOSTS if n != canary)


def halted(f: Fleet, reason: str) -> dict[str, Any]:
    """The rollout halted for ``reason`` and, rolled back, settled."""
    return dict(eventually(f"the rollout halted ({reason}) and rolled back", lambda: (
        (s := rollout(f)) and s["phase"] == "Halted" and s["reason"] == reason and s["rolledBack"]
        and s), timeout=ROLLOUT_TIMEOUT))


def evidence(f: Fleet, state: dict[str, Any], host: LoopHost, verdict: str,
             read_ahead: tuple[int, int]) -> dict[str, Any]:
    """The rollout's analysis: one entry, for ``host``, with ``verdict``; its before-run read the
    device at ``read_ahead[0]`` and its after-run at ``read_ahead[1]`` (as the runs recorded)."""
    (entry,) = state["analysis"]
    assert (entry["host"], entry["device"], entry["verdict"]) == (host.name, host.device, verdict), entry
    assert not entry["reused"] and entry["reason"], entry
    with f.api() as c:
        for key, want in zip(("before", "after"), read_ahead, strict=True):
            r = c.get(f"/api/v1/benchmarks/runs/{entry[key]}")
            r.raise_for_status()
            run = r.json()["status"]
            assert run["state"] == "done", (key, run)
            assert run["result"]["context"]["settings"][host.device]["read_ahead_kb"] == want, (key, run)
    bandwidth = [o for o in entry["objectives"] if o["metric"] == "read_bandwidth"]
    assert bandwidth, entry
    return dict(entry)


# -- the harness itself ------------------------------------------------------------------------


def test_two_agents_each_alone_with_its_loop_device(fleet: Fleet, pair: dict[str, LoopHost],  # noqa: F811
                                                    tmp_path: Path) -> None:
    """The pair fixture checked each agent discovers only its device; a profile naming both
    devices, without spec.rollout (the default waves, health-gated), changes each through its
    own agent."""
    a, b = pair["h-a"], pair["h-b"]
    assert a.device != b.device
    for host in pair.values():
        labels = fleet.host(host.name)["metadata"].get("labels", {})
        assert labels.get("rollout-e2e") == "pair", labels
    start = "512" if a.queue("read_ahead_kb") != "512" else "1024"
    apply(fleet, tmp_path, profile(pair, f"{{read_ahead_kb: {start}}}"))
    settle(fleet, pair, {"read_ahead_kb": start})
    state = rollout(fleet)
    assert state is not None and [w["hosts"] for w in state["waves"]] == [1, 0, 1], state
    # Each agent's status rows name its own device only.
    for host in pair.values():
        rows = fleet.host(host.name)["status"]["devices"]
        assert {r["device"] for r in rows} == {host.device}, (host.name, rows)


# -- the tests issue 27 asks for ---------------------------------------------------------------


@pytest.mark.slow(seconds=60)
def test_a_regression_halts_after_the_canary_and_rolls_it_back(
        fleet: Fleet, filled_pair: dict[str, LoopHost], tmp_path: Path) -> None:  # noqa: F811
    pair = filled_pair
    apply(fleet, tmp_path, profile(pair, "{read_ahead_kb: 4096}"))
    first = settle(fleet, pair, {"read_ahead_kb": "4096"})

    with Sampler(pair, ("read_ahead_kb",)) as seen:
        apply(fleet, tmp_path, profile(pair, "{read_ahead_kb: 0}", GATED))
        assert generation(fleet) == first + 1
        state = halted(fleet, "AnalysisFailed")
        canary, other = canary_and_other(state)
        eventually(f"{canary}'s device back at 4096",
                   lambda: pair[canary].queue("read_ahead_kb") == "4096")
        eventually(f"{canary} reports generation {first} again",
                   lambda: applied(fleet, canary) == first and fleet.is_(canary, "Ready"))
        code, out = wait_complete(fleet, "30s")

    assert code == 1 and f"rollout of {PROFILE} halted" in out, out
    assert seen.errors == []
    # The canary took 0 (its after-run read at 0) and went back; the other host never moved.
    assert seen.history(canary, "read_ahead_kb") == ["4096", "0", "4096"]
    assert seen.history(other, "read_ahead_kb") == ["4096"]
    assert applied(fleet, other) == first
    final = rollout(fleet)
    assert final is not None and final["phase"] == "Halted" and final["reason"] == "AnalysisFailed"
    assert final["generation"] == first + 1 and final["previous"] == first
    by_host = {h["name"]: h for h in final["hosts"]}
    assert by_host[other]["generation"] == first and by_host[other]["stage"] == "pending", final
    assert by_host[canary]["stage"] == "reverted", final
    assert {"Halted", "RolledBack"} <= set(reasons(fleet)), reasons(fleet)
    shown = fleet.cli("rollout", "status", PROFILE)
    assert shown.returncode == 0 and "Halted (AnalysisFailed)" in shown.stdout, shown.stdout + shown.stderr
    assert canary in shown.stdout and other in shown.stdout, shown.stdout
    # The canary's runs and verdict, kept with the rollout: a regression beyond the noise.
    entry = evidence(fleet, final, pair[canary], "failed", (4096, 0))
    assert {o["verdict"] for o in entry["objectives"] if o["metric"] == "read_bandwidth"} == {"worse"}


@pytest.mark.slow(seconds=60)
def test_an_improvement_completes_on_both(fleet: Fleet, filled_pair: dict[str, LoopHost],  # noqa: F811
                                          tmp_path: Path) -> None:
    pair = filled_pair
    apply(fleet, tmp_path, profile(pair, "{read_ahead_kb: 0}"))
    first = settle(fleet, pair, {"read_ahead_kb": "0"})

    with Sampler(pair, ("read_ahead_kb",)) as seen:
        apply(fleet, tmp_path, profile(pair, "{read_ahead_kb: 4096}", GATED))
        code, out = wait_complete(fleet, "5m")
        assert code == 0 and f"rollout of {PROFILE} is complete" in out, out
        for host in pair.values():
            eventually(f"{host.name} at generation {first + 1}",
                       partial(fleet.converged, host.name, PROFILE))

    assert seen.errors == []
    for host in pair.values():
        assert host.queue("read_ahead_kb") == "4096"
        assert seen.history(host.name, "read_ahead_kb") == ["0", "4096"]
    final = rollout(fleet)
    assert final is not None and final["phase"] == "Complete" and final["generation"] == first + 1
    assert final["reason"] is None and not final["rolledBack"]
    canary, _ = canary_and_other(final)
    entry = evidence(fleet, final, pair[canary], "passed", (0, 4096))
    assert all(o["verdict"] != "worse" for o in entry["objectives"]), entry


#: A value each loop device refuses: a scheduler it does not offer (refused when planned), and
#: nr_requests above 128 on a queue without an elevator (EINVAL when written).
REFUSED = {
    "scheduler-not-offered": ("scheduler: bfq-turbo", "scheduler=bfq-turbo"),
    "refused-when-written": ("nr_requests: 256", "nr_requests=256"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_hostile_a_value_the_device_refuses_halts_after_the_canary(
        fleet: Fleet, pair: dict[str, LoopHost], tmp_path: Path, case: str) -> None:  # noqa: F811
    setting, named = REFUSED[case]
    for host in pair.values():
        (Path("/sys/block") / host.device / "queue/scheduler").write_text("none")
    apply(fleet, tmp_path, profile(pair, "{read_ahead_kb: 2048}"))
    first = settle(fleet, pair, {"read_ahead_kb": "2048", "scheduler": "none"})
    attrs = ("read_ahead_kb", "scheduler", "nr_requests")
    before = {(h.name, a): h.queue(a) for h in pair.values() for a in attrs}

    with Sampler(pair, attrs) as seen:
        # The CLI foresees a scheduler the device does not list; a write refusal it cannot.
        refused = named if case == "scheduler-not-offered" else None
        apply(fleet, tmp_path, profile(pair, f"{{read_ahead_kb: 1024, {setting}}}",
                                       "{waves: [{hosts: 1}, {percent: 100}]}"), refused=refused)
        state = halted(fleet, "FailureLimit")
        canary, other = canary_and_other(state)
        eventually(f"{canary} reports generation {first} again",
                   lambda: applied(fleet, canary) == first)
        eventually(f"{canary}'s read_ahead_kb back at 2048",
                   lambda: pair[canary].queue("read_ahead_kb") == "2048")
        code, out = wait_complete(fleet, "30s")

    assert code == 1 and f"rollout of {PROFILE} halted" in out, out
    assert seen.errors == []
    # The other host: every attribute as it was, all along; its generation the first.
    for attr in attrs:
        assert seen.history(other, attr) == [before[(other, attr)]], attr
    assert applied(fleet, other) == first
    # The canary never showed the refused value; its read-ahead went to 1024 at most and back.
    assert seen.history(canary, "scheduler") == ["none"]
    assert seen.history(canary, "nr_requests") == [before[(canary, "nr_requests")]]
    assert set(seen.history(canary, "read_ahead_kb")) <= {"2048", "1024"}, seen.seen
    assert seen.history(canary, "read_ahead_kb")[-1] == "2048"
    final = rollout(fleet)
    assert final is not None and final["failures"] == 1, final
    by_host = {h["name"]: h for h in final["hosts"]}
    assert by_host[canary]["failure"] == "blocked", final
    assert {"Halted", "RolledBack"} <= set(reasons(fleet)), reasons(fleet)
    assert by_host[other]["stage"] == "pending" and by_host[other]["generation"] == first, final
