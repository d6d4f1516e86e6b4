"""A probe result comes from an agent: huge lists and strings, negative or infinite rates
are refused naming the field, so the control plane never stores them."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from stortune.api.agent import wire
from stortune.schemas.analysis.probe import ProbeResult
from stortune.schemas.topology import MAX_DEVICES, TEXT_MAX

GOOD: dict[str, Any] = {
    "probeId": "probe-1", "state": "done", "device": "md0", "members": ["sda", "sdb"],
    "stepSeconds": 5.0,
    "ceilings": [{"device": "sda", "readBytesPerSecond": 1.5e8, "readIops": 180.0},
                 {"device": "sda+sdb", "readBytesPerSecond": 3e8}],
    "scaling": [{"count": 1, "devices": ["sda"], "readBytesPerSecond": 1.5e8},
                {"count": 2, "devices": ["sda", "sdb"], "readBytesPerSecond": 3e8}],
    "scalingStopsAt": None, "message": "ok",
}


def _with(path: str, value: object) -> dict[str, Any]:
    doc = json.loads(json.dumps(GOOD))
    *parents, last = path.split(".")
    node: Any = doc
    for key in parents:
        node = node[int(key)] if key.isdigit() else node[key]
    node[int(last) if last.isdigit() else last] = value
    return doc


HOSTILE = [
    ("probeId", "p" * 65),
    ("probeId", ""),
    ("device", "d" * 65),
    ("members", ["sda"] * (MAX_DEVICES + 1)),
    ("members.0", "x" * 100_000),
    ("message", "m" * (TEXT_MAX + 1)),
    ("stepSeconds", -1),
    ("ceilings", [{"device": "sda"}] * (MAX_DEVICES + 2)),
    ("ceilings.0.device", "s" * (MAX_DEVICES * 65 + 1)),
    ("ceilings.0.readBytesPerSecond", -1.0),
    ("ceilings.0.readIops", "Infinity"),
    ("ceilings.0.runId", "r" * 65),
    ("scaling", [{"count": 1, "devices": [], "readBytesPerSecond": 1.0}] * 100),
    ("scaling.0.devices", ["sda"] * (MAX_DEVICES + 1)),
    ("scaling.0.count", 0),
    ("scaling.0.readBytesPerSecond", "NaN"),
    ("scalingStopsAt", MAX_DEVICES + 1),
]


@pytest.mark.parametrize(("field", "value"), HOSTILE, ids=[f for f, _ in HOSTILE])
def test_junk_from_an_agent_is_refused_naming_the_field(field: str, value: object) -> None:
    text = json.dumps(_with(field, value)).replace('"Infinity"', "Infinity").replace('"NaN"', "NaN")
    with pytest.raises(ValidationError) as err:
        ProbeResult.model_validate_json(text)
    first = err.value.errors()[0]["loc"]
    assert ".".join(str(p) for p in first).startswith(field.split(".", maxsplit=1)[0])
    # the server's decoder turns it into a wire error naming the field, not a stored row
    message = wire.probe_result_response(
        wire.HostInfo(hostname="h", kernel="6.8", boot_id="b"),
        wire.BenchmarkProgress(run_id="probe-1", state="done"), None)
    message.result_json = text
    with pytest.raises(wire.WireError, match=field.split(".", maxsplit=1)[0]):
        wire.probe_result_from(message)


def test_a_real_result_still_validates() -> None:
    result = ProbeResult.model_validate(GOOD)
    assert result.ceilings[1].device == "sda+sdb"
    assert ProbeResult.model_validate_json(result.model_dump_json()) == result
