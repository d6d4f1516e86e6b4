"""Hostile input gets a clear 4xx, and the next normal request succeeds (in process; the real
server process gets the same cases in test_server_process.py)."""

from __future__ import annotations

import pytest

from tests.server.builders import API, registration
from tests.server.hostile import CASES, MAX_BODY, MAX_DEPTH, Case, check, still_serving
from tests.server.support import AppFactory, admin_client


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_hostile_input_is_refused_cleanly(make_app: AppFactory, case: Case) -> None:
    app = make_app(max_body_bytes=MAX_BODY, max_document_depth=MAX_DEPTH)
    with admin_client(app) as client:
        assert client.post(f"{API}/agents/register", json=registration("h1")).status_code == 200
        check(case, case.send(client))
        still_serving(client)
