"""Documents from request bodies (JSON or YAML), parsed off the event loop within bounds.

A parser holds whichever thread runs it: on the event loop, one 1.3 MiB profile of
100,000 keys kept /healthz and every heartbeat waiting 16 s (issue 26). So the parse
runs in a worker thread, at most ``document_parsers`` at once (one: the parsers hold the
GIL, so more would only take turns with the event loop) with a few more waiting (the rest
are answered 503 at once, not queued), and each document's work is bounded:
nodes and one value's characters are counted as the parser produces them, so a hostile
document is refused after work proportional to the limit, not to its size. Bytes and
JSON depth are bounded before this runs (api/limits.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import yaml

from stortune.schemas import yamlsafe
from stortune.server.api.limits import too_deep_message
from stortune.server.errors import BadRequest, TooLarge, Unavailable
from stortune.server.settings import Settings

T = TypeVar("T")
#: Parses that may wait for a parser, per parser; past them a request is answered 503 at once.
WAITING_PER_PARSER = 16
#: libyaml's parser when PyYAML has it: the pure-Python one is some 20 times slower.
_EVENTS: type[Any] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True)
class DocumentLimits:
    max_depth: int
    max_nodes: int
    max_value_chars: int
    max_bytes: int

    @classmethod
    def of(cls, settings: Settings) -> DocumentLimits:
        return cls(settings.max_document_depth, settings.max_document_nodes,
                   settings.max_document_value_chars, settings.max_document_bytes)

    def too_many_bytes(self) -> TooLarge:
        return TooLarge(f"the document is larger than {self.max_bytes} bytes, the limit of this server "
                        "for documents (stortune-server --max-document-size)")

    def too_many_nodes(self) -> TooLarge:
        return TooLarge(f"the document holds more than {self.max_nodes} values, lists and mappings (keys "
                        "included), the limit of this server (stortune-server --max-document-nodes)")

    def too_long(self, where: str) -> TooLarge:
        return TooLarge(f"{where} is longer than {self.max_value_chars} characters, the limit of this "
                        "server for one value (stortune-server --max-document-value)")


def parse_yaml(body: bytes, limits: DocumentLimits) -> Any:
    """The one YAML document of ``body``. Its events are walked first, as libyaml produces them,
    so the walk stops at the first bound passed; only a document within all of them is built."""
    try:
        _walk_yaml(body, limits)
    except yaml.MarkedYAMLError as exc:
        # libyaml stops past 1000 levels itself, sometimes before yielding the 65th.
        if "maximum nesting depth" in str(exc.problem):
            raise BadRequest(too_deep_message(limits.max_depth)) from None
        raise
    # Built by the documents' own rules: a duplicate key is an error, not a silent replacement.
    loaded = yamlsafe.load_all_walked(body)
    return loaded[0] if loaded else None


def _walk_yaml(body: bytes, limits: DocumentLimits) -> None:
    nodes = depth = documents = 0
    for event in yaml.parse(body, Loader=_EVENTS):
        if isinstance(event, yaml.ScalarEvent):
            nodes += 1
            if len(event.value) > limits.max_value_chars:
                where = f" at line {event.start_mark.line + 1}" if event.start_mark else ""
                raise limits.too_long(f"the value{where}")
        elif isinstance(event, yaml.CollectionStartEvent):
            nodes += 1
            depth += 1
            if depth > limits.max_depth:
                raise BadRequest(too_deep_message(limits.max_depth))
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
        elif isinstance(event, yaml.AliasEvent):
            # An alias repeats a node by reference; a few lines of them expand into
            # billions of nodes for whoever walks the result ("billion laughs").
            raise BadRequest("YAML aliases (*name) are not accepted in documents; write the values out")
        elif isinstance(event, yaml.DocumentStartEvent):
            documents += 1
            if documents > 1:
                raise BadRequest("the body holds more than one YAML document; send one per request")
        if nodes > limits.max_nodes:
            raise limits.too_many_nodes()


def parse_json(body: bytes, limits: DocumentLimits) -> Any:
    """The JSON document of ``body``: json's C parser is fast enough for any body within the byte
    limit; its result is then counted, stopping at the first bound passed."""
    document = json.loads(body, object_pairs_hook=_no_duplicate_keys)
    nodes = 0
    pending = [document]
    while pending:
        value = pending.pop()
        nodes += 1
        if isinstance(value, dict):
            nodes += len(value)  # the keys
            for key in value:
                if len(key) > limits.max_value_chars:
                    raise limits.too_long("a key")
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
        elif isinstance(value, str) and len(value) > limits.max_value_chars:
            raise limits.too_long("a string")
        if nodes > limits.max_nodes:
            raise limits.too_many_nodes()
    return document


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refused when a key repeats: json keeps the last one silently, so a reviewer
    reading the first ``metadata`` would approve another document (YAML refuses it too)."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise ValueError(f"found duplicate key {key!r:.80}")
        found[key] = value
    return found


def parse(body: bytes, syntax: str, limits: DocumentLimits) -> Any:
    """``body`` as a ``syntax`` ("JSON" or "YAML") document; ApiError for anything it refuses."""
    try:
        return parse_yaml(body, limits) if syntax == "YAML" else parse_json(body, limits)
    except (ValueError, yaml.YAMLError) as exc:
        raise BadRequest(f"the body is not valid {syntax}: {exc}") from None
    except RecursionError:
        raise BadRequest(f"the body nests too deeply to be a {syntax} document") from None


class Parsers:
    """The worker threads documents and large bodies are parsed in: at most ``parsers`` at once,
    a few waiting."""

    def __init__(self, parsers: int) -> None:
        self.limiter = anyio.CapacityLimiter(parsers)
        self.max_waiting = parsers * WAITING_PER_PARSER

    async def run(self, work: Callable[..., T], *args: Any) -> T:
        """``work(*args)`` in a parser's thread; 503 at once when too many already wait for one."""
        if self.limiter.statistics().tasks_waiting >= self.max_waiting:
            raise Unavailable("too many documents are being read at once on this server; retry in a few "
                              "seconds", headers={"Retry-After": "2"})
        return await anyio.to_thread.run_sync(work, *args, limiter=self.limiter)

    async def parse(self, body: bytes, syntax: str, limits: DocumentLimits) -> Any:
        if len(body) > limits.max_bytes:  # a chunked body: its length was not declared
            raise limits.too_many_bytes()
        # ``parse`` is looked up at each call, so a test can put a slow parser in its place.
        return await self.run(parse, body, syntax, limits)
