"""`stortune rollout ...` and `stortune wait ...` against the real control plane over TCP.

A rollout is started by applying a profile; what the driver would store later (Complete,
Halted) is written to its row by the test, so each case decides the phase: the driver is not
started, so nothing moves under a test that did not ask.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI

from stortune.cli import rollout as cli_rollout
from stortune.cli.client import Client
from stortune.schemas.rollout import machine
from stortune.server import RecordingController, Settings, create_app
from stortune.server.db.tables import Rollout
from tests.cli.conftest import ControlPlane, Run, profile_yaml, serve

HOSTS = ("web-1", "web-2", "web-3")


@pytest.fixture
def app(tmp_path: Path) -> FastAPI:
    app = create_app(Settings(db_url=f"sqlite:///{tmp_path / 'control-plane.db'}"),
                     controller=RecordingController())

    async def not_started() -> None:
        """The rollout driver stays stopped: the test is the driver."""

    app.state.rollouts.start = not_started
    return app


@pytest.fixture
def control_plane(app: FastAPI) -> Iterator[ControlPlane]:
    yield from serve(app)


def start(app: FastAPI, control_plane: ControlPlane, stortune: Run, tmp_path: Path,
          name: str = "vod") -> None:
    """Hosts the profile selects and the profile: applying it starts its rollout."""
    for host in HOSTS:
        control_plane.register(host, {"role": "streamer"})
    path = tmp_path / f"{name}.yaml"
    path.write_text(profile_yaml(name))
    assert stortune("apply", "-f", str(path)).code == 0
    with app.state.sessions() as session:
        assert session.get(Rollout, name) is not None


def rewrite(app: FastAPI, name: str, **changes: Any) -> None:
    with app.state.sessions() as session:
        row = session.get(Rollout, name)
        assert row is not None
        state = machine.RolloutState.model_validate(row.state).model_copy(update=changes)
        row.state, row.phase = state.model_dump(mode="json"), state.phase
        session.commit()


# -- hostile --------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["10", "10x", "m", "-5m", "0s", "0m0s", "7d1s", "8d", "1h 30m", "", "1e3s"])
def test_hostile_durations_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        cli_rollout.duration(text)


@pytest.mark.parametrize(("text", "seconds"), [
    ("90s", 90), ("10m", 600), ("2h", 7200), ("1h30m", 5400), ("0.5s", 0.5), ("7d", 7 * 86400)])
def test_durations(text: str, seconds: float) -> None:
    assert cli_rollout.duration(text) == seconds


def test_hostile_unknown_profile_and_profile_without_rollout(stortune: Run, tmp_path: Path) -> None:
    for args in (("rollout", "status", "ghost"), ("rollout", "pause", "ghost"),
                 ("wait", "profile", "ghost", "--for", "rollout=complete", "--timeout", "5s")):
        result = stortune(*args)
        assert result.code == 1, args
        assert 'StorageProfile "ghost" not found' in result.err, (args, result.err)
    path = tmp_path / "plain.yaml"
    path.write_text(profile_yaml("plain"))
    assert stortune("apply", "-f", str(path)).code == 0
    status = stortune("rollout", "status", "plain")
    assert status.code == 1 and 'StorageProfile "plain" has no rollout' in status.err
    # Nothing is rolling out: every host took the generation at once, which is what wait waits for.
    waited = stortune("wait", "profile", "plain", "--for", "rollout=complete", "--timeout", "5s")
    assert waited.code == 0 and "plain has no rollout: generation 1 went to every host at once" in waited.err


@pytest.mark.parametrize(("args", "message"), [
    (("wait", "profile", "vod", "--for", "rollout=done"), "rollout=complete"),
    (("wait", "profile", "vod", "--for", "condition=Ready"), "rollout=complete"),
    (("wait", "host", "web-1", "--for", "condition=Ready=maybe"), "condition=TYPE"),
    (("wait", "host", "web-1", "--for", "rollout=complete"), "condition=TYPE"),
    (("rollout", "status", "vod", "--timeout", "1m"), "--timeout applies to --watch"),
])
def test_hostile_usage_is_refused_naming_what_to_write(
    stortune: Run, args: tuple[str, ...], message: str,
) -> None:
    result = stortune(*args)
    assert result.code == 1 and message in result.err, result.err


def test_hostile_wait_timeout_past_its_bound_is_refused(stortune: Run) -> None:
    result = stortune("wait", "profile", "vod", "--for", "rollout=complete", "--timeout", "8d")
    assert result.code != 0 and "at most 7d" in result.err


def test_hostile_viewer_reads_but_may_not_steer(
    app: FastAPI, control_plane: ControlPlane, stortune: Run, tmp_path: Path,
) -> None:
    start(app, control_plane, stortune, tmp_path)
    viewer = control_plane.issue("viewer", name="dashboards")
    assert stortune("rollout", "status", "vod", token=viewer).code == 0
    for command in ("pause", "resume", "undo"):
        refused = stortune("rollout", command, "vod", token=viewer)
        assert refused.code == 1 and "role viewer) may not write profiles" in refused.err
    assert json.loads(stortune("rollout", "status", "vod", "-o", "json").out)["pendingCommands"] == []


# -- status and steering --------------------------------------------------------------------------


def test_status_as_a_table_and_as_json(
    app: FastAPI, control_plane: ControlPlane, stortune: Run, tmp_path: Path,
) -> None:
    start(app, control_plane, stortune, tmp_path)
    table = stortune("rollout", "status", "vod")
    assert table.code == 0, table.err
    first = table.out.splitlines()[0]
    assert first.startswith("rollout of vod: generation 1 (from 0), Progressing, wave 1 of ")
    assert "hosts: 3; changed 0" in table.out and "failures: 0 of 0 tolerated" in table.out
    assert all(host in table.out for host in HOSTS)
    assert "WAVE" in table.out and "STAGE" in table.out
    document = json.loads(stortune("rollout", "status", "vod", "-o", "json").out)
    assert document["profile"] == "vod" and sorted(h["name"] for h in document["hosts"]) == list(HOSTS)
    limited = json.loads(stortune("rollout", "status", "vod", "-o", "json", "--limit", "1").out)
    assert len(limited["hosts"]) == 1


def test_operator_pauses_and_the_command_is_pending_with_who(
    app: FastAPI, control_plane: ControlPlane, stortune: Run, tmp_path: Path,
) -> None:
    start(app, control_plane, stortune, tmp_path)
    operator = control_plane.issue("operator", name="alice")
    paused = stortune("rollout", "pause", "vod", token=operator)
    assert paused.code == 0, paused.err
    assert "rollout of vod: pause requested" in paused.out
    pending = json.loads(stortune("rollout", "status", "vod", "-o", "json").out)["pendingCommands"]
    assert [c["command"] for c in pending] == ["pause"] and "alice" in pending[0]["by"]


# -- watch and wait ---------------------------------------------------------------------------------


def test_wait_exits_0_on_complete(
    app: FastAPI, control_plane: ControlPlane, stortune: Run, tmp_path: Path,
) -> None:
    start(app, control_plane, stortune, tmp_path)
    rewrite(app, "vod", phase="Complete")
    result = stortune("wait", "profile", "vod", "--for", "rollout=complete", "--timeout", "10m")
    assert result.code == 0 and "rollout of vod is complete" in result.err


def test_wait_exits_1_on_halted_saying_why(
    app: FastAPI, control_plane: ControlPlane, stortune: Run, tmp_path: Path,
) -> None:
    start(app, control_plane, stortune, tmp_path)
    rewrite(app, "vod", phase="Halted", reason="FailureLimit", rollback=True, rolledBack=True)
    result = stortune("wait", "profile", "vod", "--for", "rollout=complete", "--timeout", "10m")
    assert result.code == 1
    assert "rollout of vod halted (Halted (FailureLimit) rolled back)" in result.err


def test_wait_exits_1_on_timeout_saying_so(
    app: FastAPI, control_plane: ControlPlane, stortune: Run, tmp_path: Path,
) -> None:
    start(app, control_plane, stortune, tmp_path)
    result = stortune("wait", "profile", "vod", "--for", "rollout=complete", "--timeout", "1s")
    assert result.code == 1 and "timed out: the rollout of vod is still Progressing" in result.err


def test_status_watch_prints_then_reports_the_end(
    app: FastAPI, control_plane: ControlPlane, stortune: Run, tmp_path: Path,
) -> None:
    start(app, control_plane, stortune, tmp_path)
    rewrite(app, "vod", phase="Complete")
    watched = stortune("rollout", "status", "vod", "--watch", "-o", "json")
    assert watched.code == 0 and json.loads(watched.out)["phase"] == "Complete"
    assert "rollout of vod is complete" in watched.err


def test_wait_host_condition(control_plane: ControlPlane, stortune: Run) -> None:
    control_plane.register("web-1", {"role": "streamer"})
    reachable = stortune("wait", "host", "web-1", "--for", "condition=Reachable", "--timeout", "5s")
    assert reachable.code == 0 and "host web-1: Reachable is True" in reachable.err
    # Nothing reconciles here (a recording controller): Ready is never True.
    ready = stortune("wait", "host", "web-1", "--for", "condition=Ready", "--timeout", "1s")
    assert ready.code == 1 and "timed out: host web-1's condition Ready is" in ready.err
    missing = stortune("wait", "host", "ghost", "--for", "condition=Ready", "--timeout", "1s")
    assert missing.code == 1 and 'Host "ghost" not found' in missing.err


def test_wait_ends_0_when_a_change_all_at_once_replaces_the_rollout_mid_watch(
    app: FastAPI, control_plane: ControlPlane, stortune: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    start(app, control_plane, stortune, tmp_path)
    changed = tmp_path / "all-at-once.yaml"
    changed.write_text(profile_yaml("vod", read_ahead_kb=8192) + "  rollout: {strategy: all-at-once}\n")
    watch = Client.watch_rollout
    seen: list[dict[str, Any]] = []

    def spied(self: Client, profile: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
        for event in watch(self, profile, **kwargs):
            seen.append(event)
            yield event
            if event.get("type") == "status" and event["status"]["generation"] == 1:
                # The watch is open and has said where the rollout is: now the change goes
                # everywhere at once, which ends the rollout (its row goes).
                assert stortune("apply", "-f", str(changed)).code == 0

    monkeypatch.setattr(Client, "watch_rollout", spied)
    result = stortune("wait", "profile", "vod", "--for", "rollout=complete", "--timeout", "1m")
    assert result.code == 0, result.err
    assert "vod has no rollout: generation 2 went to every host at once" in result.err
    assert seen[-1] == {"type": "end", "reason": "Gone", "phase": "Progressing"}


def test_status_watch_follows_each_change_to_halted(
    app: FastAPI, control_plane: ControlPlane, stortune: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    start(app, control_plane, stortune, tmp_path)
    watch = Client.watch_rollout
    steps: Iterator[dict[str, Any]] = iter([{"wave": 1}, {"phase": "Halted", "reason": "FailureLimit"}])

    def spied(self: Client, profile: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
        for event in watch(self, profile, **kwargs):
            yield event
            if event.get("type") == "status" and (step := next(steps, None)) is not None:
                rewrite(app, profile, **step)  # what the driver's next step would store

    monkeypatch.setattr(Client, "watch_rollout", spied)
    result = stortune("rollout", "status", "vod", "--watch", "--timeout", "1m")
    assert result.code == 1, result.err
    firsts = [line for line in result.out.splitlines() if line.startswith("rollout of vod:")]
    assert [line.split(", ", 1)[1] for line in firsts] == [
        "Progressing, wave 1 of 3", "Progressing, wave 2 of 3", "Halted (FailureLimit), wave 2 of 3"]
    assert "rollout of vod halted (Halted (FailureLimit))" in result.err
