"""405 answers list every method a path has (Allow), and OPTIONS answers with the same list.

A path often has several routes (GET, PUT and DELETE of /profiles/{name} are registered apart);
Starlette's own 405 named only the methods of the first of them."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi import FastAPI

from tests.server.builders import API, profile_doc, registration
from tests.server.support import TestClient, bearer

TRIED = ("GET", "POST", "PUT", "PATCH", "DELETE")


def allow(response: Any) -> list[str]:
    return [m.strip() for m in response.headers["allow"].split(",")]


@pytest.mark.parametrize(("method", "path", "methods"), [
    ("PATCH", "/profiles/streaming", ["GET", "PUT", "DELETE"]),
    ("POST", "/profiles/streaming", ["GET", "PUT", "DELETE"]),
    ("DELETE", "/profiles", ["GET", "POST"]),
    ("POST", "/hosts/h1/labels", ["PUT", "PATCH"]),
    ("GET", "/hosts/h1/labels", ["PUT", "PATCH"]),
    ("PUT", "/hosts/h1", ["GET", "DELETE"]),
    ("PUT", "/tokens/0123456789ab", ["GET", "DELETE"]),
    ("POST", "/benchmarks/schedules/nightly", ["GET", "PUT", "DELETE"]),
    ("GET", "/agents/register", ["POST"]),
])
def test_405_lists_every_method_of_the_path(client: TestClient, method: str, path: str,
                                            methods: list[str]) -> None:
    client.post(f"{API}/profiles", json=profile_doc())
    client.post(f"{API}/agents/register", json=registration("h1"))
    response = client.request(method, API + path)
    assert response.status_code == 405, response.text
    assert allow(response) == [*methods, "OPTIONS"]
    assert response.json()["reason"] == "MethodNotAllowed"


def _template(path: str) -> re.Pattern[str]:
    return re.compile(re.sub(r"\{[^}]+\}", "[^/]+", path) + "$")


def test_every_documented_path_answers_405_with_its_documented_methods(
    app: FastAPI, client: TestClient,
) -> None:
    """The whole API, from its own OpenAPI description: any method a path lacks is a 405 whose
    Allow is what the description lists for that path (for every template that matches it)."""
    paths: dict[str, Any] = client.get("/openapi.json").json()["paths"]
    documented = {template: {m.upper() for m in operations} for template, operations in paths.items()}
    checked = 0
    for template in paths:
        concrete = re.sub(r"\{[^}]+\}", "x1", template)
        expected = set().union(*(methods for other, methods in documented.items()
                                 if _template(other).match(concrete)))
        for method in (m for m in TRIED if m not in expected):
            response = client.request(method, concrete)
            assert response.status_code == 405, (method, concrete, response.status_code)
            assert set(allow(response)) == expected | {"OPTIONS"}, (method, concrete)
            checked += 1
    assert checked > 40


def test_options_answers_with_the_allowed_methods(app: FastAPI, client: TestClient) -> None:
    response = client.options(f"{API}/profiles/streaming")
    assert response.status_code == 204 and response.content == b""
    assert allow(response) == ["GET", "PUT", "DELETE", "OPTIONS"]
    assert allow(client.options("/healthz")) == ["GET", "OPTIONS"]
    # Under /api/v1 a token is needed first, as for every other call; unknown paths stay 404.
    # (Extra clients without `with`: the app's lifespan runs once, in the fixture's client.)
    assert TestClient(app).options(f"{API}/profiles").status_code == 401
    assert TestClient(app, headers=bearer("stt_" + "z" * 43)).options(f"{API}/profiles").status_code == 401
    assert client.options(f"{API}/nothing-here").status_code == 404
