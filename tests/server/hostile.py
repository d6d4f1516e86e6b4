"""Hostile requests and what each must get back; shared by the in-process and the real-server tests.

Every case is sent with any httpx client (the TestClient is one) as an admin,
so nothing but the input itself can be the reason it is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx

from stortune.server.settings import Settings
from tests.server.builders import API, profile_doc, registration

#: What the servers under test are started with, so the cases know where the limits are.
MAX_BODY = 512 * 1024  # above the 256 KiB annotations may take, to test that cap too
MAX_DEPTH: int = Settings.model_fields["max_document_depth"].default

JSON = {"content-type": "application/json"}
YAML = {"content-type": "application/yaml"}


@dataclass(frozen=True)
class Case:
    name: str
    send: Callable[[httpx.Client], httpx.Response]
    code: int
    message: str  # in the Status message, or the first cause's field and message
    field: str | None = None


def _chunks(total: int, size: int = 16 * 1024) -> Iterator[bytes]:
    """A body streamed without Content-Length (chunked transfer encoding)."""
    sent = 0
    while sent < total:
        yield b" " * min(size, total - sent)
        sent += size


def _many_labels(n: int) -> dict[str, str]:
    return {f"k{i}": "v" for i in range(n)}


def _profile_with(**metadata: object) -> dict[str, object]:
    doc = profile_doc("hostile")
    doc["metadata"] = {**doc["metadata"], **metadata}  # type: ignore[dict-item]
    return doc


def _selector_profile(selector: dict[str, object]) -> dict[str, object]:
    return profile_doc("hostile", selector=selector)


def _topology(**device: object) -> dict[str, object]:
    """A topology whose second device is hostile in the given fields."""
    return {"hostname": "h1", "devices": [{"name": "loop0", "kind": "loop", "id": "name:loop0"},
                                          {"name": "sda", "kind": "disk", "id": "name:sda", **device}]}


def _upload(**device: object) -> Callable[[httpx.Client], httpx.Response]:
    return lambda c: c.put(f"{API}/agents/h1/topology", json={"topology": _topology(**device)})


_DEEP_JSON = "[" * 100_000 + "]" * 100_000
_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n" + \
    "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"

CASES = [
    Case("oversized body with Content-Length",
         lambda c: c.post(f"{API}/profiles", content=b" " * (MAX_BODY + 1), headers=JSON),
         413, f"larger than {MAX_BODY} bytes"),
    Case("oversized chunked body",
         lambda c: c.post(f"{API}/profiles", content=_chunks(MAX_BODY * 4), headers=JSON),
         413, f"larger than {MAX_BODY} bytes"),
    Case("oversized body to a model route",
         lambda c: c.post(f"{API}/agents/register", content=_chunks(MAX_BODY * 4), headers=JSON),
         413, f"larger than {MAX_BODY} bytes"),
    Case("YAML alias bomb",
         lambda c: c.post(f"{API}/profiles", content=_BOMB, headers=YAML),
         400, "aliases"),
    Case("YAML document of 30,000 keys (issue 26: parsed on the event loop, it froze the server)",
         lambda c: c.post(f"{API}/profiles", headers=YAML, content="spec:\n" + "".join(
             f"  k{i}: {i}\n" for i in range(30_000))),
         413, "--max-document-nodes"),
    Case("JSON document holding a 300,000-character value",
         lambda c: c.post(f"{API}/profiles", json=_profile_with(annotations={"a": "x" * 300_000})),
         413, "--max-document-value"),
    Case("deeply nested JSON document",
         lambda c: c.post(f"{API}/profiles", content=f'{{"metadata": {_DEEP_JSON}}}', headers=JSON),
         400, f"more than {MAX_DEPTH} levels"),
    Case("deeply nested JSON to a model route",
         lambda c: c.put(f"{API}/hosts/h1/labels", content=f'{{"labels": {_DEEP_JSON}}}', headers=JSON),
         400, f"more than {MAX_DEPTH} levels"),
    Case("deeply nested JSON hidden in strings and escapes is measured right",
         lambda c: c.post(f"{API}/agents/register",
                          content='{"name": "h9", "x": "[[[\\"[[", "y": ' + _DEEP_JSON + "}", headers=JSON),
         400, f"more than {MAX_DEPTH} levels"),
    Case("YAML with a duplicate key (the reviewer reads one metadata, a loader would keep the other)",
         lambda c: c.post(f"{API}/profiles", headers=YAML, content=(
             "apiVersion: stortune/v1\nkind: StorageProfile\nmetadata: {name: shown}\n"
             "spec: {rules: [{name: r, match: {kind: [loop]}, settings: {read_ahead_kb: 128}}]}\n"
             "metadata: {name: hidden}\n")),
         400, "duplicate key"),
    Case("YAML base-60 float of 200 parts (PyYAML's OverflowError was a 500)",
         lambda c: c.post(f"{API}/profiles", headers=YAML,
                          content="spec: {priority: " + "1:" * 200 + "1.5}\n"),
         400, "base-60 number"),
    Case("YAML base-60 integer of 100,000 parts (quadratic to build)",
         lambda c: c.post(f"{API}/profiles", headers=YAML,
                          content="spec: {priority: 1" + ":1" * 100_000 + "}\n"),
         400, "base-60 number"),
    *(Case(f"a lone surrogate in a {kind}'s name (the Status quoting it could not be encoded: a 500)",
           lambda c, kind=kind, path=path: c.post(f"{API}/{path}", headers=JSON, content=(
               f'{{"apiVersion": "stortune/v1", "kind": "{kind}", "metadata": {{"name": "x\\ud800"}}}}')),
           422, "")
      for kind, path in (("StorageProfile", "profiles"), ("TuningExperiment", "experiments"),
                         ("Benchmark", "benchmarks/runs"), ("BenchmarkSchedule", "benchmarks/schedules"))),
    Case("JSON with a duplicate key (json.loads kept the last metadata silently; YAML refused it)",
         lambda c: c.post(f"{API}/profiles", headers=JSON, content=(
             '{"apiVersion": "stortune/v1", "kind": "StorageProfile", "metadata": {"name": "shown"},'
             ' "spec": {"rules": [{"name": "r", "match": {"kind": ["loop"]},'
             ' "settings": {"read_ahead_kb": 128}}]}, "metadata": {"name": "hidden"}}')),
         400, "duplicate key 'metadata'"),
    Case("deeply nested YAML (flow)",
         lambda c: c.post(f"{API}/profiles", content="a: " + "[" * 5000 + "]" * 5000, headers=YAML),
         400, f"more than {MAX_DEPTH} levels"),
    Case("deeply nested YAML (block)",
         lambda c: c.post(f"{API}/profiles", headers=YAML, content="".join(
             f"{'  ' * i}k{i}:\n" for i in range(200)) + "  " * 200 + "x: 1\n"),
         400, f"more than {MAX_DEPTH} levels"),
    Case("huge label set on a host (PUT)",
         lambda c: c.put(f"{API}/hosts/h1/labels", json={"labels": _many_labels(5000)}),
         422, "at most 64", field="labels"),
    Case("huge label set on a host (PATCH)",
         lambda c: c.patch(f"{API}/hosts/h1/labels", json={"labels": _many_labels(5000)}),
         422, "at most 64", field="labels"),
    Case("huge label set in a registration",
         lambda c: c.post(f"{API}/agents/register", json=registration("h9", labels=_many_labels(5000))),
         422, "at most 64", field="labels"),
    Case("huge fact set in a registration",
         lambda c: c.post(f"{API}/agents/register", json={
             **registration("h9"), "facts": {f"f{i}": i for i in range(5000)}}),
         422, "at most 64", field="facts"),
    Case("huge label set on a profile",
         lambda c: c.post(f"{API}/profiles", json=_profile_with(labels=_many_labels(5000))),
         422, "at most 64", field="metadata.labels"),
    Case("huge annotations on a profile",
         lambda c: c.post(f"{API}/profiles", json=_profile_with(annotations={"a": "x" * 200_000,
                                                                             "b": "y" * 70_000})),
         422, "at most 262144", field="metadata.annotations"),
    Case("huge selector in a profile",
         lambda c: c.post(f"{API}/profiles", json=_selector_profile({"matchLabels": _many_labels(5000)})),
         422, "at most 64", field="spec.hostSelector.matchLabels"),
    Case("huge selector values in a profile",
         lambda c: c.post(f"{API}/profiles", json=_selector_profile({"matchExpressions": [
             {"key": "role", "operator": "In", "values": [f"v{i}" for i in range(5000)]}]})),
         422, "at most 64", field="spec.hostSelector.matchExpressions[0].values"),
    Case("huge selector query",
         lambda c: c.get(f"{API}/hosts", params={"labelSelector": ",".join(f"k{i}=v" for i in range(2000))}),
         422, "at most 4096", field="query.labelSelector"),
    Case("host label value that is not label syntax",
         lambda c: c.put(f"{API}/hosts/h1/labels", json={"labels": {"tier": "gold plated"}}),
         422, "label 'tier'", field="labels"),
    Case("host label key that is not label syntax",
         lambda c: c.patch(f"{API}/hosts/h1/labels", json={"labels": {"-tier": "gold"}}),
         422, "label '-tier'", field="labels"),
    Case("registration label that is not label syntax",
         lambda c: c.post(f"{API}/agents/register", json=registration("h9", labels={"role": "a/b"})),
         422, "label 'role'", field="labels"),
    Case("profile label that is not label syntax",
         lambda c: c.post(f"{API}/profiles", json=_profile_with(labels={"team": "x" * 64})),
         422, "is not valid", field="metadata.labels"),
    Case("selector value that is not label syntax",
         lambda c: c.post(f"{API}/profiles", json=_selector_profile({"matchExpressions": [
             {"key": "role", "operator": "In", "values": ["stream er"]}]})),
         422, "'stream er' is not valid", field="spec.hostSelector.matchExpressions[0].values"),
    *(Case(f"topology upload naming a device {name!r}", _upload(name=name), 422,
           "is not a kernel block device name", field="topology.devices[1].name")
      for name in ("..", "/tmp/x", "../../x")),
    Case("registration whose topology names a device '../../x'",
         lambda c: c.post(f"{API}/agents/register", json={**registration("h9"),
                                                          "topology": _topology(name="../../x")}),
         422, "is not a kernel block device name", field="topology.devices[1].name"),
    Case("topology upload with a sysfs_path of '../../x'", _upload(sysfs_path="../../x"), 422,
         "is not a path below the sysfs root", field="topology.devices[1].sysfs_path"),
    Case("topology upload with an absolute sysfs_path", _upload(sysfs_path="/etc/shadow"), 422,
         "is not a path below the sysfs root", field="topology.devices[1].sysfs_path"),
    *(Case(f"topology upload naming {what} '../../x'", _upload(**{key: value}), 422,
           "is not a kernel block device name", field=f"topology.devices[1].{field}")
      for what, key, value, field in (
          ("a parent", "parent", "../../x", "parent"),
          ("a partition", "partitions", ["sda1", "../../x"], "partitions[1]"),
          ("a slave", "slaves", ["../../x"], "slaves[0]"),
          ("a holder", "holders", ["../../x"], "holders[0]"),
          ("a multipath path", "dm", {"paths": ["../../x"]}, "dm.paths[0]"),
          ("an md member", "md", {"members": [{"device": "../../x"}]}, "md.members[0].device"))),
    Case("topology upload naming a device with a NUL byte", _upload(name="sda\x00"), 422,
         "topology.devices[1].name: contains a NUL character"),
    Case("topology upload naming a device with 200 characters", _upload(name="s" * 200), 422,
         "at most 64 characters", field="topology.devices[1].name"),
    Case("topology upload with a 300 KiB model", _upload(model="m" * 300_000), 422,
         "at most 4096 characters", field="topology.devices[1].model"),
    Case("topology upload naming one device twice", _upload(name="loop0"), 422,
         "devices[1].name 'loop0' is also devices[0]'s", field="topology.devices"),
    Case("selector query value that is not label syntax",
         lambda c: c.get(f"{API}/hosts", params={"labelSelector": "role in (a b)"}),
         422, "", field="labelSelector"),
]


def check(case: Case, response: httpx.Response) -> None:
    assert response.status_code == case.code, (case.name, response.text[:500])
    body = response.json()
    assert body["kind"] == "Status" and body["code"] == case.code, case.name
    if case.field is None:
        assert case.message in body["message"], (case.name, body["message"])
        return
    cause = body["details"]["causes"][0]
    assert cause["field"] == case.field, (case.name, body)
    assert case.message in cause["message"], (case.name, body)


def still_serving(client: httpx.Client) -> None:
    """A normal write and read right after: the hostile request left no damage."""
    labelled = client.patch(f"{API}/hosts/h1/labels", json={"labels": {"checked": "yes"}})
    assert labelled.status_code == 200, labelled.text
    assert client.get(f"{API}/hosts/h1").json()["spec"]["labels"]["checked"] == "yes"
    assert client.post(f"{API}/agents/h1/heartbeat",
                       json={"topology_hash": "", "boot_id": "boot-1"}).status_code == 200
