"""Schemathesis against the app's own OpenAPI, in process: no input makes the server fail (5xx).

Cases come from schemathesis strategies driven by Hypothesis directly:
schemathesis' lazy pytest fixture integration does not run under pytest 9.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*install `httpx2`")
    import schemathesis
    from schemathesis import GenerationMode
    from schemathesis.checks import not_a_server_error
    from schemathesis.core.result import Ok
    from schemathesis.python.asgi import shutdown_lifespans

from stortune.server.auth import Role
from tests.server.builders import API, loop_topology, profile_doc, registration
from tests.server.support import TestClient, bearer, issue_token

EXAMPLES_PER_OPERATION = 25
#: What counts is the answer, not its time: the suite shares two cores with fio and servers,
#: and schemathesis' default (10 s) once cut off a call that was only waiting for a core.
CALL_TIMEOUT_S = 120
PROFILE, HOST = "streaming", "h1"


# Negative cases are refused by validation before any query, and random names are unknown
# (404) after one lookup: SQLite covers both. Pinned names reach real rows, where the two
# databases may differ, so PostgreSQL runs those. (Listed here rather than skipped in the
# body: a skipped case would still count as one of the slow ones the shards deal out.)
@pytest.mark.parametrize(("db_url", "mode", "pinned"), [
    pytest.param("sqlite", GenerationMode.POSITIVE, False, marks=pytest.mark.slow(seconds=40),
                 id="sqlite-positive"),
    # Random names are nearly always unknown (404); pinned ones reach existing objects.
    pytest.param("sqlite", GenerationMode.POSITIVE, True, marks=pytest.mark.slow(seconds=45),
                 id="sqlite-positive-existing-names"),
    pytest.param("sqlite", GenerationMode.NEGATIVE, False, marks=pytest.mark.slow(seconds=60),
                 id="sqlite-negative"),
    pytest.param("postgresql", GenerationMode.POSITIVE, True, marks=pytest.mark.slow(seconds=40),
                 id="postgresql-positive-existing-names"),
], indirect=["db_url"])
def test_no_input_makes_the_server_fail(
    app: FastAPI, db_url: str, mode: GenerationMode, pinned: bool,
) -> None:
    token = issue_token(app, Role.ADMIN)  # admin reaches every operation
    with TestClient(app, headers=bearer(token)) as client:
        client.post(f"{API}/agents/register", json=registration(HOST, topology=loop_topology()))
        client.post(f"{API}/profiles", json=profile_doc(PROFILE))
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result
        operations.append(result.ok())
    assert len(operations) >= 15, [op.label for op in operations]
    operations.sort(key=lambda op: op.method.upper() == "DELETE")  # deletes last: others need the objects

    try:
        _fuzz(operations, token, mode, pinned)
    finally:
        # Schemathesis starts the app's lifespan on first use and keeps it for the rest of the
        # process: its workers would go on polling (a PostgreSQL one, the database the later
        # tests use) long after this test.
        shutdown_lifespans()


def _fuzz(operations: list[Any], token: str, mode: GenerationMode, pinned: bool) -> None:
    for operation in operations:
        names = {}
        if pinned and "{name}" in operation.path:
            names = {"name": PROFILE if "/profiles/" in operation.path else HOST}

        # A rollout's watch streams until its timeout: one second, so each case ends.
        query = {"timeoutSeconds": 1} if operation.path.endswith("/rollout") else None

        @given(case=operation.as_strategy(generation_mode=mode, path_parameters=names or None, query=query))
        @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def no_server_error(case: Any) -> None:
            case.call_and_validate(headers=bearer(token), checks=[not_a_server_error], timeout=CALL_TIMEOUT_S)

        try:
            no_server_error()
        except Unsatisfiable:
            # Nothing in this operation can be made invalid (GET /healthz has no inputs).
            assert mode is GenerationMode.NEGATIVE, operation.label
        except Exception as exc:
            exc.add_note(f"operation: {operation.label} ({mode.value} cases)")
            raise
