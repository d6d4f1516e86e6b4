"""wire: documents survive the trip, and bad content fails naming its field."""

from __future__ import annotations

import json

import pytest

from stortune.api.agent import wire
from stortune.schemas.documents import DocumentError
from tests.rpc.conftest import profile


def test_a_profile_round_trips_through_its_wire_json() -> None:
    original = profile(read_ahead_kb=4096, scheduler="mq-deadline")
    (back,) = wire.profiles_from_json([wire.profile_to_json(original)])
    assert back == original


def test_every_bad_profile_is_reported_with_its_index_and_field_path() -> None:
    good = json.loads(wire.profile_to_json(profile()))
    bad = json.loads(wire.profile_to_json(profile()))
    bad["spec"]["rules"][0]["settings"]["read_ahead_kb"] = "lots"
    with pytest.raises(DocumentError) as err:
        wire.profiles_from_json([json.dumps(good), "{not json", json.dumps(bad), json.dumps(good)])
    text = str(err.value)
    assert "profiles_json[1]: not valid JSON" in text
    assert "profiles_json[2] (StorageProfile/rpc-test): spec.rules[0].settings.read_ahead_kb" in text
    assert "metadata.name: 'rpc-test' is defined more than once" in text


def test_apply_request_round_trip() -> None:
    request = wire.apply_request([profile()], {"rpc-test": 7}, "req-9")
    call = wire.apply_call(wire.ApplyRequest.FromString(request.SerializeToString()))
    assert call == wire.ApplyCall([profile()], {"rpc-test": 7}, "req-9")


def test_restore_keys_empty_means_everything_and_an_empty_filter_is_refused() -> None:
    assert wire.restore_keys(wire.restore_request(None)) is None
    keys = {("loop:/x", "read_ahead_kb"), ("host", "dev.raid.speed_limit_min")}
    assert wire.restore_keys(wire.restore_request(keys)) == keys
    with pytest.raises(ValueError, match="pass None to restore everything"):
        wire.restore_request(set())


def test_a_malformed_document_from_an_agent_names_the_field() -> None:
    response = wire.PlanResponse(plan_json='{"changes": [{"device": 1}]}')
    with pytest.raises(wire.WireError, match=r"^plan_json: not a valid Plan: changes\.0\."):
        wire.plan_from(response)
    with pytest.raises(wire.WireError, match=r"^report_json: expected a JSON object"):
        wire.restore_from(wire.RestoreResponse(report_json="[]"))


def test_progress_round_trip_keeps_unknown_states_from_newer_agents() -> None:
    p = wire.BenchmarkProgress("r", "paused", percent=50.5, eta_seconds=3, message="m")
    assert wire.progress_from(wire.progress_message(p)) == p
    assert not p.finished and wire.BenchmarkProgress("r", "cancelled").finished
