"""End to end on a real loop device (issue 26, point 9): a scheduler the device does not offer, in
one profile, is an error on that setting alone. The server, a real agent over gRPC and the CLI
run as processes; the other profile's nr_requests is applied, and put back after a hand change."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.e2e.test_control_plane_e2e import Fleet, agent_proc, eventually, fleet  # noqa: F401


def _profile(name: str, priority: int, dev: str, settings: str) -> str:
    # all-at-once: in waves a blocked setting halts the rollout and rolls it back (issue 27).
    return f"""apiVersion: stortune/v1
kind: StorageProfile
metadata: {{name: {name}}}
spec:
  hostSelector: {{matchLabels: {{e2e: blocked}}}}
  priority: {priority}
  rollout: {{strategy: all-at-once}}
  rules:
    - name: the-loop
      match: {{kind: [loop], name: [{dev}]}}
      settings: {settings}
"""


def _status(f: Fleet, profile: str) -> dict[str, object]:
    with f.api() as c:
        r = c.get(f"/api/v1/profiles/{profile}")
        r.raise_for_status()
        return dict(r.json().get("status") or {})


def _has_device(f: Fleet, dev: str) -> bool:
    with f.api() as c:
        r = c.get("/api/v1/hosts/loophost/topology")
        return r.is_success and any(d["name"] == dev for d in r.json().get("devices", []))


def _start(f: Fleet, tmp_path: Path, dev: str, profiles: dict[str, tuple[int, str]]) -> Path:
    """loophost's agent started, a directory of profiles ({name: (priority, settings)}) written for
    ``dev``; returns the directory once the agent registered and reported the device."""
    f.agents["loophost"] = agent_proc(f, "loophost", [], "e2e=blocked")
    f.agents["loophost"].start()
    files = tmp_path / "profiles"
    files.mkdir()
    for name, (priority, settings) in profiles.items():
        (files / f"{name}.yaml").write_text(_profile(name, priority, dev, settings))
    eventually("the agent registered", lambda: f.condition("loophost", "Reachable"))
    eventually("its topology", lambda: _has_device(f, dev))
    return files


def _delete(f: Fleet, *names: str) -> None:
    with f.api() as c:
        for name in names:
            assert c.delete(f"/api/v1/profiles/{name}").status_code in (200, 202)


def test_hostile_a_scheduler_the_device_does_not_offer_blocks_only_itself(
        fleet: Fleet, loop_devices: Callable[[int], list[str]], tmp_path: Path) -> None:  # noqa: F811
    (dev,) = loop_devices(1)
    queue = Path("/sys/block") / dev / "queue"
    nr, sched = queue / "nr_requests", queue / "scheduler"
    original_nr, original_sched = nr.read_text().strip(), sched.read_text()
    want = "64" if original_nr != "64" else "48"  # at most 128: a loop queue without an elevator

    files = _start(fleet, tmp_path, dev, {"turbo": (20, "{scheduler: bfq-turbo}"),
                                          "queue": (0, f"{{nr_requests: {want}}}")})

    # -- the CLI says so before and after: exit 1, naming the setting ---------------------------
    error = f"loophost: {dev} scheduler=bfq-turbo (turbo/the-loop) cannot be set"
    for args in (("apply", "--dry-run"), ("diff",)):
        run = fleet.cli(*args, "-f", str(files))
        assert run.returncode == 1 and error in run.stderr, (args, run.stdout, run.stderr)
    applied = fleet.cli("apply", "-f", str(files))
    assert applied.returncode == 1 and error in applied.stderr, applied.stdout + applied.stderr
    assert "storageprofile/queue created" in applied.stdout

    # -- the other profile's setting is applied; the error is on the host and the profile -------
    eventually("nr_requests applied", lambda: nr.read_text().strip() == want)
    rejected = eventually("Applied=False Rejected", lambda: fleet.is_("loophost", "Applied", "False"))
    assert rejected["reason"] == "Rejected" and "every other setting is applied" in rejected["message"]
    assert "scheduler=bfq-turbo" in rejected["message"]
    assert sched.read_text() == original_sched
    turbo = eventually("turbo's status",
                       lambda: (s := _status(fleet, "turbo")).get("phase") == "Failed" and s)
    assert turbo["rejectedHosts"] == ["loophost"]
    eventually("queue applied", lambda: _status(fleet, "queue").get("phase") == "Applied")

    # -- a hand change of the other profile's setting is put back --------------------------------
    nr.write_text("32")
    eventually("nr_requests put back after the hand change", lambda: nr.read_text().strip() == want)
    assert fleet.is_("loophost", "Applied", "False")["reason"] == "Rejected"  # type: ignore[index]

    # -- fixed: the scheduler profile removed, the error is gone, and everything put back -------
    _delete(fleet, "turbo", "queue")
    eventually("nr_requests original restored", lambda: nr.read_text().strip() == original_nr)
    eventually("Applied=True", lambda: fleet.is_("loophost", "Applied"))
    assert sched.read_text() == original_sched
