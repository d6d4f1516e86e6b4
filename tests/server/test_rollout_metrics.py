"""/metrics for rollouts: hosts per stage and halted, one query of the rollouts table per change.

Rollout rows are written here as the control plane stores them (the pure machine's state as
JSON, a resourceVersion bump with every write), so what is tested is the scrape's reading of
the table, on SQLite and PostgreSQL; the statements a refresh sends are counted on the engine.
The app's gauges are read without starting the app (its rollout driver would step rows whose
hosts do not exist); the scrape over HTTP is tested with rows the driver leaves alone
(Complete, and Halted after a rollback).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi import FastAPI
from sqlalchemy import Engine, event, select
from sqlalchemy.orm import Session, sessionmaker

from stortune.schemas.rollout import machine
from stortune.schemas.rollout.spec import RolloutSpec
from stortune.server.db.tables import Rollout
from stortune.server.metrics.rollouts import STAGES, RolloutGauges, rollout_lines, stage_counts
from stortune.server.services.versions import next_resource_version
from tests.server.builders import API, loop_topology, profile_doc, registration
from tests.server.conftest import Eventually
from tests.server.support import admin_client
from tests.server.test_metrics import Samples, lint, parse, sample, scrape

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def started(profile: str, hosts: int, generation: int = 2) -> machine.RolloutState:
    state, _ = machine.start(profile, RolloutSpec(), generation, generation - 1,
                             [f"h{i}" for i in range(hosts)], now=0.0)
    return state


def with_stages(state: machine.RolloutState, **stages: str) -> machine.RolloutState:
    hosts = {h: s.model_copy(update={"stage": stages.get(h, s.stage)}) for h, s in state.hosts.items()}
    return state.model_copy(update={"hosts": hosts})


def store(app: FastAPI, state: machine.RolloutState, *, bump: bool = True) -> None:
    """Insert or update the profile's rollout row as the control plane does (``bump``: with the
    resourceVersion bump every write makes; False: a write that missed it)."""
    sessions: sessionmaker[Session] = app.state.sessions
    with sessions.begin() as session:
        if bump:
            next_resource_version(session)
        row = session.get(Rollout, state.profile)
        values: dict[str, Any] = {"generation": state.generation, "phase": state.phase,
                                  "state": state.model_dump(mode="json"), "updated_at": NOW}
        if row is None:
            session.add(Rollout(profile=state.profile, known=sorted(state.hosts), commands=[], **values))
        else:
            for key, value in values.items():
                setattr(row, key, value)


def remove(app: FastAPI, profile: str) -> None:
    sessions: sessionmaker[Session] = app.state.sessions
    with sessions.begin() as session:
        next_resource_version(session)
        session.delete(session.scalars(select(Rollout).where(Rollout.profile == profile)).one())


@contextmanager
def statements(app: FastAPI) -> Iterator[list[str]]:
    """The queries sent on the app's engine meanwhile (SQLite's explicit BEGIN is no query)."""
    engine: Engine = app.state.sessions.kw["bind"]
    sent: list[str] = []

    def note(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            sent.append(statement)

    event.listen(engine, "before_cursor_execute", note)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", note)


def total(samples: Samples, profile: str) -> float:
    return sum(v for (n, ls), v in samples.items()
               if n == "stortune_rollout_hosts" and ("profile", profile) in ls)


def gauges_of(app: FastAPI) -> Samples:
    """What the app's scrape says of rollouts now (its gauges refreshed as a scrape does)."""
    gauges: RolloutGauges = app.state.metrics_rollouts
    gauges.refresh()
    text = gauges.render()
    lint(text)
    return parse(text)


class Ticks:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# -- hostile rows and names ----------------------------------------------------------------
def test_hostile_profile_names_reasons_and_unknown_stages_are_escaped_label_values() -> None:
    evil = 'p"} 1\nstortune_rollout_halted{profile="x\\'
    state = {"reason": evil, "hosts": {"a": {"stage": "updated"}, "b": {"stage": evil}}}
    text = "".join(rollout_lines(evil, "Halted", state))
    s = parse(text)
    assert sample(s, "stortune_rollout_hosts", profile=evil, phase="updated") == 1
    assert sample(s, "stortune_rollout_hosts", profile=evil, phase=evil) == 1  # a newer server's stage
    assert sample(s, "stortune_rollout_halted", profile=evil) == 1
    assert sample(s, "stortune_rollout_info", profile=evil, phase="Halted", reason=evil) == 1
    assert sample(s, "stortune_rollout_halted", profile="x\\") is None  # nothing injected


@pytest.mark.parametrize("state", [
    {}, {"hosts": None}, {"hosts": ["h1", "h2"]}, {"hosts": {"h1": "updated", "h2": None}},
    {"hosts": {"h1": {"stage": 3}}}, {"hosts": {"h1": {}}}, {"reason": {"x": 1}},
])
def test_hostile_a_state_the_scrape_cannot_read_counts_nothing_and_fails_nothing(
        state: dict[str, Any]) -> None:
    counts = stage_counts(state)
    assert set(STAGES) <= set(counts)
    # a host without a stage is pending (the machine's default); nothing else is counted
    assert sum(counts.values()) == (1 if state == {"hosts": {"h1": {}}} else 0)
    s = parse("".join(rollout_lines("p", "Progressing", state)))
    assert sample(s, "stortune_rollout_info", profile="p", phase="Progressing", reason="") == 1


def test_hostile_a_row_whose_state_is_not_an_object_is_scraped_as_empty(app: FastAPI) -> None:
    sessions: sessionmaker[Session] = app.state.sessions
    with sessions.begin() as session:
        next_resource_version(session)
        session.add(Rollout(profile="odd", generation=2, phase="Progressing", state=["not", "a", "state"],
                            known=[], commands=[], updated_at=NOW))
    s = gauges_of(app)
    assert sample(s, "stortune_rollout_hosts", profile="odd", phase="pending") == 0
    assert sample(s, "stortune_rollout_halted", profile="odd") == 0


# -- what a scrape says ----------------------------------------------------------------------
def test_a_live_rollout_has_every_stage_and_a_halt_is_one(app: FastAPI) -> None:
    state = with_stages(started("web", 5), h0="updated", h1="changing")
    store(app, state)
    s = gauges_of(app)
    counts = {stage: sample(s, "stortune_rollout_hosts", profile="web", phase=stage) for stage in STAGES}
    assert counts == {**dict.fromkeys(STAGES, 0), "pending": 3, "updated": 1, "changing": 1}
    assert sample(s, "stortune_rollout_halted", profile="web") == 0
    assert sample(s, "stortune_rollout_info", profile="web", phase="Progressing", reason="") == 1

    halted = with_stages(state, h1="failed", h0="reverting").model_copy(
        update={"phase": "Halted", "reason": "FailureLimit", "rollback": True})
    store(app, halted)
    s = gauges_of(app)
    assert sample(s, "stortune_rollout_halted", profile="web") == 1
    assert sample(s, "stortune_rollout_info", profile="web", phase="Halted", reason="FailureLimit") == 1
    assert sample(s, "stortune_rollout_info", profile="web", phase="Progressing") is None
    assert sample(s, "stortune_rollout_hosts", profile="web", phase="failed") == 1
    assert sample(s, "stortune_rollout_hosts", profile="web", phase="reverting") == 1
    assert sample(s, "stortune_rollout_hosts", profile="web", phase="updated") == 0


def test_paused_and_complete_are_not_halted_and_a_deleted_rollout_leaves_the_scrape(app: FastAPI) -> None:
    store(app, started("paused", 2).model_copy(update={"phase": "Paused"}))
    store(app, with_stages(started("done", 2), h0="updated", h1="updated").model_copy(
        update={"phase": "Complete"}))
    s = gauges_of(app)
    assert sample(s, "stortune_rollout_halted", profile="paused") == 0
    assert sample(s, "stortune_rollout_halted", profile="done") == 0
    assert sample(s, "stortune_rollout_hosts", profile="done", phase="updated") == 2
    remove(app, "done")
    s = gauges_of(app)
    assert sample(s, "stortune_rollout_halted", profile="done") is None
    assert sample(s, "stortune_rollout_hosts", profile="done", phase="updated") is None
    assert sample(s, "stortune_rollout_halted", profile="paused") == 0


def test_a_new_rollout_whose_row_version_starts_again_is_formatted_again(app: FastAPI) -> None:
    store(app, started("web", 3, generation=2))
    assert total(gauges_of(app), "web") == 3
    remove(app, "web")
    store(app, started("web", 7, generation=3))  # version 1 again, as the first row had
    assert total(gauges_of(app), "web") == 7


# -- cost: one query of the table per change, none while nothing changed --------------------
def test_a_refresh_is_one_query_of_the_table_whatever_the_number_of_rollouts_and_hosts(app: FastAPI) -> None:
    gauges = RolloutGauges(app.state.sessions)
    for i in range(30):
        store(app, started(f"p{i}", 40))
    with statements(app) as sent:
        gauges.refresh()
    assert len(sent) == 2, sent  # the counter, then the table
    assert "rollouts" in sent[1].lower() and "rollouts" not in sent[0].lower()
    assert total(parse(gauges.render()), "p29") == 40

    with statements(app) as sent:
        gauges.refresh()  # nothing written since: the counter only
    assert len(sent) == 1 and "rollouts" not in sent[0].lower(), sent
    assert gauges.reads == 1

    store(app, with_stages(started("p3", 40), h0="updated"))
    with statements(app) as sent:
        gauges.refresh()
    assert len(sent) == 2 and gauges.reads == 2
    s = parse(gauges.render())
    assert sample(s, "stortune_rollout_hosts", profile="p3", phase="updated") == 1
    assert len([k for k in s if k[0] == "stortune_rollout_halted"]) == 30


def test_a_write_that_missed_the_counter_is_seen_once_the_age_bound_passes(app: FastAPI) -> None:
    ticks = Ticks()
    gauges = RolloutGauges(app.state.sessions, every=60.0, monotonic=ticks)
    store(app, started("web", 2))
    gauges.refresh()
    halted = started("web", 2).model_copy(update={"phase": "Halted", "reason": "AnalysisFailed"})
    store(app, halted, bump=False)
    ticks.now = 59.999  # just under the bound: the counter stood still, nothing is read
    gauges.refresh()
    assert sample(parse(gauges.render()), "stortune_rollout_halted", profile="web") == 0
    ticks.now = 60.0  # at the bound: read again
    gauges.refresh()
    assert sample(parse(gauges.render()), "stortune_rollout_halted", profile="web") == 1
    assert gauges.reads == 2


def test_no_rollout_writes_the_families_without_series(app: FastAPI) -> None:
    text = scrape(app)
    lint(text)
    assert "# TYPE stortune_rollout_hosts gauge" in text
    assert not any(name.startswith("stortune_rollout") for name, _ in parse(text))


def test_the_scrape_serves_the_rollouts_next_to_the_fleet(app: FastAPI) -> None:
    store(app, with_stages(started("done", 3), h0="updated", h1="updated", h2="updated").model_copy(
        update={"phase": "Complete"}))
    undone = with_stages(started("bad", 4), h0="reverted", h1="failed")
    store(app, undone.model_copy(update={"phase": "Halted", "reason": "AnalysisFailed", "rollback": True,
                                         "rolledBack": True}))
    text = scrape(app)
    lint(text)
    s = parse(text)
    assert sample(s, "stortune_hosts") == 0
    assert sample(s, "stortune_rollout_hosts", profile="done", phase="updated") == 3
    assert sample(s, "stortune_rollout_halted", profile="done") == 0
    assert sample(s, "stortune_rollout_halted", profile="bad") == 1
    assert sample(s, "stortune_rollout_hosts", profile="bad", phase="reverted") == 1
    assert sample(s, "stortune_rollout_info", profile="bad", phase="Halted", reason="AnalysisFailed") == 1


# -- with the control plane's own rollouts ----------------------------------------------------
def test_a_rollout_a_profile_write_started_and_people_steered_is_scraped_as_the_driver_writes_it(
    app: FastAPI, eventually: Eventually,
) -> None:
    """The driver's writes bump the counter: the scrape sees each phase without the age bound."""
    gauges: RolloutGauges = app.state.metrics_rollouts

    def now() -> Samples:
        gauges.refresh()
        return parse(gauges.render())

    with admin_client(app) as admin:
        for host in ("h1", "h2", "h3", "h4"):
            assert admin.post(f"{API}/agents/register",
                              json=registration(host, topology=loop_topology(host))).status_code == 200
        assert admin.post(f"{API}/profiles", json=profile_doc("vod")).status_code == 201
        s = now()
        assert total(s, "vod") == 4
        assert sample(s, "stortune_rollout_info", profile="vod", phase="Progressing", reason="") == 1
        assert admin.post(f"{API}/profiles/vod/rollout/pause").status_code == 200
        eventually(lambda: sample(now(), "stortune_rollout_info", profile="vod", phase="Paused") == 1,
                   what="the pause in the gauges")
        assert admin.post(f"{API}/profiles/vod/rollout/undo").status_code == 200
        eventually(lambda: sample(now(), "stortune_rollout_halted", profile="vod") == 1, what="the undo")
    s = parse(scrape(app))
    assert sample(s, "stortune_rollout_info", profile="vod", phase="Halted", reason="Undone") == 1
    assert total(s, "vod") == 4
