"""POST /api/v1/raid-plans: bad bodies are 422 naming the field (never 500), then the known answers."""

from __future__ import annotations

from typing import Any

import pytest

from tests.server.builders import API
from tests.server.conftest import TokenFor
from tests.server.support import TestClient, bearer

PLANS = f"{API}/raid-plans"


@pytest.mark.parametrize(("body", "field"), [
    ({}, "disks"),
    ({"disks": {"count": -3, "iops": 180}}, "disks.count"),
    ({"disks": {"count": "16", "iops": 180}}, "disks.count"),
    ({"disks": {"count": 16, "iops": "lots"}}, "disks.iops"),
    ({"disks": {"count": 16, "iops": 1e300}}, "disks.iops"),
    ({"disks": {"count": 16, "iops": 180, "sizeBytes": "9" * 30}}, "disks.sizeBytes"),
    ({"disks": {"count": 16, "iops": 180}, "levels": ["raid5"] * 100}, "levels"),
    ({"disks": {"count": 16, "iops": 180}, "levels": "raid5"}, "levels"),
    ({"disks": {"count": 16, "iops": 180}, "workload": {"readPct": 1000}}, "workload.readPct"),
    ({"disks": {"count": 16}}, "disks"),
    ({"disks": {"count": 16, "iops": 180}, "extra": 1}, "extra"),
])
def test_bad_bodies_are_422_naming_the_field(client: TestClient, body: dict[str, Any], field: str) -> None:
    response = client.post(PLANS, json=body)
    assert response.status_code == 422, response.text
    fields = [c.get("field") for c in response.json()["details"]["causes"]]
    assert field in fields, response.json()


def test_a_body_that_is_not_json_is_refused(client: TestClient) -> None:
    response = client.post(PLANS, content=b"{not json", headers={"Content-Type": "application/json"})
    assert 400 <= response.status_code < 500


def test_a_viewer_gets_the_known_answers(client: TestClient, token_for: TokenFor) -> None:
    viewer = token_for("viewer")
    body = {"disks": {"count": 16, "iops": 180, "sizeBytes": "600GB"}, "levels": ["raid10", "raid5", "raid6"],
            "workload": {"readPct": 70}, "requirements": {"iops": 2000}}
    response = client.post(PLANS, json=body, headers=bearer(viewer))
    assert response.status_code == 200, response.text
    levels = {p["level"]: p for p in response.json()["levels"]}
    assert round(levels["raid10"]["randomIops"]) == 2215 and round(levels["raid5"]["randomIops"]) == 1516
    assert levels["raid10"]["usableBytes"] == 4_800_000_000_000
    assert levels["raid10"]["meetsRequirements"] is True and levels["raid10"]["disksNeeded"] == 15
    assert levels["raid5"]["disksNeeded"] == 22
    assert any("more than 8" in w for w in levels["raid5"]["warnings"])
    assert response.json()["request"]["disks"]["sizeBytes"] == 600 * 10**9
