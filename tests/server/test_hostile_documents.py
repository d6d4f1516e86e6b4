"""Documents are parsed off the event loop, a few at a time, and each within bounds (issue 26.1).

The bounds are tested on the parser at their edges (the limit and one past it) and through
the API for what a user sees; the event loop's freedom by ordering, never by timing.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute

from stortune.server.api import documents
from stortune.server.api.bodies import INLINE_BYTES, OffLoopBodyRoute
from stortune.server.api.documents import DocumentLimits, parse
from stortune.server.api.router import INCLUDED
from stortune.server.errors import ApiError, BadRequest, TooLarge
from tests.server.builders import API, profile_doc, registration
from tests.server.support import AppFactory, TestClient, admin_client

YAML = {"content-type": "application/yaml"}
JSON = {"content-type": "application/json"}
LIMITS = DocumentLimits(max_depth=64, max_nodes=1000, max_value_chars=1024, max_bytes=1 << 20)


def _nodes(keys: int) -> int:
    """Nodes of _keys_yaml and _keys_json: root, "spec", its mapping, "x", its mapping, each key and value."""
    return 5 + 2 * keys


def _keys_yaml(keys: int) -> bytes:
    return ("spec:\n  x:\n" + "".join(f"    k{i}: {i}\n" for i in range(keys))).encode()


def _keys_json(keys: int) -> bytes:
    return json.dumps({"spec": {"x": {f"k{i}": i for i in range(keys)}}}).encode()


def _refusal(body: bytes, syntax: str, limits: DocumentLimits = LIMITS) -> ApiError | None:
    try:
        parse(body, syntax, limits)
    except ApiError as exc:
        return exc
    return None


# Hostile documents first ---------------------------------------------------------------


@pytest.mark.parametrize(("syntax", "document"), [("YAML", _keys_yaml), ("JSON", _keys_json)])
def test_hostile_nodes_at_the_limit_pass_and_one_past_is_refused(
        syntax: str, document: Callable[..., bytes]) -> None:
    body, nodes = document(400), _nodes(400)
    assert _refusal(body, syntax, DocumentLimits(64, nodes, 1024, 1 << 20)) is None
    past = _refusal(body, syntax, DocumentLimits(64, nodes - 1, 1024, 1 << 20))
    assert isinstance(past, TooLarge) and f"more than {nodes - 1} values" in past.message
    assert "--max-document-nodes" in past.message


@pytest.mark.parametrize("syntax", ["YAML", "JSON"])
def test_hostile_value_at_the_limit_passes_and_one_past_is_refused(syntax: str) -> None:
    def body(chars: int) -> bytes:
        value = "v" * chars
        return json.dumps({"a": value}).encode() if syntax == "JSON" else f"a: {value}\n".encode()

    assert _refusal(body(LIMITS.max_value_chars), syntax) is None
    past = _refusal(body(LIMITS.max_value_chars + 1), syntax)
    assert isinstance(past, TooLarge), past
    assert "longer than 1024 characters" in past.message and "--max-document-value" in past.message
    if syntax == "YAML":
        assert "the value at line 1" in past.message


def test_hostile_long_key_is_refused() -> None:
    past = _refusal(json.dumps({"k" * 1025: 1}).encode(), "JSON")
    assert isinstance(past, TooLarge) and "a key is longer than 1024" in past.message


def test_hostile_alias_bomb_is_refused_before_it_is_built() -> None:
    levels = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    levels += [f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi", strict=True)]
    refused = _refusal("\n".join(levels).encode(), "YAML")
    assert isinstance(refused, BadRequest) and "aliases" in refused.message


def test_hostile_second_yaml_document_is_refused() -> None:
    refused = _refusal(b"a: 1\n---\nb: 2\n", "YAML")
    assert isinstance(refused, BadRequest) and "more than one YAML document" in refused.message


def test_hostile_document_bytes_at_the_limit_pass_and_one_past_is_refused(make_app: AppFactory) -> None:
    app = make_app(max_document_bytes=4096)

    def body(size: int) -> bytes:
        return b"a: 1\n" + b"#" * (size - 6) + b"\n"  # a comment: only the bytes count

    with admin_client(app) as client:
        at = client.post(f"{API}/profiles", content=body(4096), headers=YAML)
        assert at.status_code == 422 and "StorageProfile" in at.text, at.text  # parsed, judged by its schema
        for sent in (body(4097), iter([body(4097)])):  # with a Content-Length, then chunked
            past = client.post(f"{API}/profiles", content=sent, headers=YAML)
            assert past.status_code == 413, past.text
            assert "larger than 4096 bytes" in past.text and "--max-document-size" in past.text


def test_hostile_many_keys_through_the_api_name_the_limit(make_app: AppFactory) -> None:
    app = make_app(max_document_nodes=1000)
    with admin_client(app) as client:
        for body, headers in ((_keys_yaml(600), YAML), (_keys_json(600), {})):
            answer = client.post(f"{API}/profiles", content=body, headers=headers)
            assert answer.status_code == 413, answer.text
            assert answer.json()["reason"] == "RequestEntityTooLarge"
            assert "--max-document-nodes" in answer.json()["message"]
        # At the limit the document is parsed, and judged by its schema as usual.
        answer = client.post(f"{API}/profiles", content=_keys_yaml(497), headers=YAML)  # 999 nodes
        assert answer.status_code == 422, answer.text


def test_hostile_long_value_through_the_api_names_the_limit(make_app: AppFactory) -> None:
    app = make_app(max_document_value_chars=4096)
    doc = profile_doc("long")
    doc["metadata"]["annotations"] = {"note": "x" * 4097}
    with admin_client(app) as client:
        for body, headers in ((json.dumps(doc).encode(), {}), (f"a: {'x' * 4097}\n".encode(), YAML)):
            answer = client.post(f"{API}/profiles", content=body, headers=headers)
            assert answer.status_code == 413, answer.text
            assert "longer than 4096 characters" in answer.json()["message"]
        doc["metadata"]["annotations"] = {"note": "x" * 4096}
        assert client.post(f"{API}/profiles", json=doc).status_code == 201


class _HeldParser:
    """Stands in for documents.parse: holds its worker until released, recording the order of events."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()

    def __call__(self, body: bytes, syntax: str, limits: DocumentLimits) -> Any:
        self.order.append("parse started")
        self.entered.release()
        # The timeout only keeps a broken server (parsing on the loop) from hanging the suite.
        self.release.wait(timeout=10)
        self.order.append("parse finished")
        return json.loads(body)


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[_HeldParser]:
    parser = _HeldParser()
    monkeypatch.setattr(documents, "parse", parser)
    yield parser
    parser.release.set()


def _post_in_thread(client: TestClient, answers: list[int]) -> threading.Thread:
    def post() -> None:
        answers.append(client.post(f"{API}/profiles", json=profile_doc("held")).status_code)

    thread = threading.Thread(target=post)
    thread.start()
    return thread


def test_hostile_slow_parse_leaves_healthz_and_heartbeats_answering(make_app: AppFactory,
                                                                    held: _HeldParser) -> None:
    app = make_app()
    with admin_client(app) as client:
        answers: list[int] = []
        poster = _post_in_thread(client, answers)
        assert held.entered.acquire(timeout=10)
        # The parse is running and cannot finish until released: these answer meanwhile.
        assert client.get("/healthz").status_code == 200
        assert client.get(f"{API}/hosts").status_code == 200
        held.order.append("others answered")
        held.release.set()
        poster.join()
    assert held.order == ["parse started", "others answered", "parse finished"]
    assert answers == [201]


def _waiting(app: FastAPI, count: int) -> bool:
    """Whether ``count`` requests come to wait for a parser (looked at for up to 10 s)."""
    parsers: documents.Parsers = app.state.document_parsers
    for _ in range(1000):
        if parsers.limiter.statistics().tasks_waiting >= count:
            return True
        threading.Event().wait(0.01)
    return False


def test_hostile_parses_past_the_queue_get_503_at_once(make_app: AppFactory, held: _HeldParser) -> None:
    app = make_app(document_parsers=1)
    waiting = documents.WAITING_PER_PARSER
    with admin_client(app) as client:
        answers: list[int] = []
        posters = [_post_in_thread(client, answers)]
        assert held.entered.acquire(timeout=10)
        posters += [_post_in_thread(client, answers) for _ in range(waiting)]
        assert _waiting(app, waiting)  # each is queued behind the held parse
        refused = client.post(f"{API}/profiles", json=profile_doc("one-too-many"))
        assert refused.status_code == 503, refused.text
        assert "too many documents" in refused.json()["message"] and refused.headers["Retry-After"] == "2"
        held.release.set()
        for poster in posters:
            poster.join()
    # The held one and the waiting ones were all parsed in turn (one created, the rest name it again).
    assert sorted(answers) == [201] + [409] * waiting


# Large JSON bodies of the model routes ----------------------------------------------------


def _many_facts(facts: int, size: int) -> dict[str, Any]:
    """A registration of ``facts`` extra facts, each value ``size`` characters."""
    return {**registration("h9"), "facts": {f"f{i}": "v" * size for i in range(facts)}}


def test_hostile_large_invalid_body_gets_the_answer_a_small_one_gets(make_app: AppFactory) -> None:
    app = make_app()
    with admin_client(app) as client:
        small, large = _many_facts(65, 1), _many_facts(65, 1024)
        assert len(json.dumps(large)) > INLINE_BYTES >= len(json.dumps(small))
        answers = [client.post(f"{API}/agents/register", json=body) for body in (small, large)]
        assert [a.status_code for a in answers] == [422, 422]
        assert answers[0].json()["details"] == answers[1].json()["details"]
        assert "at most 64" in answers[1].json()["details"]["causes"][0]["message"]
        broken = b'{"name": "h9", "x": "' + b"y" * INLINE_BYTES + b'"'
        for body in (b'{"name": "h9", "x": "', broken):
            answer = client.post(f"{API}/agents/register", content=body, headers=JSON)
            assert answer.status_code == 422 and "JSON decode error" in answer.text, answer.text
        valid = {**registration("h9"), "facts": {f"f{i}": "v" * 1024 for i in range(64)}}
        assert len(json.dumps(valid)) > INLINE_BYTES
        assert client.post(f"{API}/agents/register", json=valid).status_code == 200


def test_hostile_large_body_waits_for_a_parser_while_small_ones_answer(make_app: AppFactory,
                                                                       held: _HeldParser) -> None:
    app = make_app(document_parsers=1)
    with admin_client(app) as client:
        assert client.post(f"{API}/agents/register", json=registration("h1")).status_code == 200
        answers: list[int] = []
        poster = _post_in_thread(client, answers)  # holds the one parser
        assert held.entered.acquire(timeout=10)
        large = threading.Thread(target=lambda: answers.append(
            client.post(f"{API}/agents/register", json=_many_facts(65, 1024)).status_code))
        large.start()
        assert _waiting(app, 1)  # the large body waits for the parser, not parsed on the loop
        heartbeat = client.post(f"{API}/agents/h1/heartbeat", json={"topology_hash": "", "boot_id": "boot-1"})
        assert heartbeat.status_code == 200 and client.get("/healthz").status_code == 200
        held.order.append("others answered")
        assert answers == []
        held.release.set()
        for thread in (poster, large):
            thread.join()
    assert held.order == ["parse started", "others answered", "parse finished"]
    assert sorted(answers) == [201, 422]


def test_every_route_with_a_body_parses_large_ones_off_the_loop() -> None:
    plain = [f"{sorted(route.methods)} {prefix}{route.path}" for prefix, router in INCLUDED
             for route in router.routes
             if isinstance(route, APIRoute) and route.body_field is not None
             and not isinstance(route, OffLoopBodyRoute)]
    assert plain == [], "give these routers route_class=OffLoopBodyRoute (api/bodies.py)"
