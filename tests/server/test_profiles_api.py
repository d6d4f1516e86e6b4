"""StorageProfile resources: CRUD, versions, validation and dry runs (SQLite and PostgreSQL)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from stortune.schemas import patterns
from stortune.schemas.topology import Device, DeviceKind, RecordedOriginal, Topology, TunableState
from stortune.server import RecordingController
from stortune.server.db.tables import Host
from tests.server.builders import API, loop_topology, profile_doc, registration, with_changes
from tests.server.support import TestClient, bearer, issue_token

PROFILES = f"{API}/profiles"


def create(client: TestClient, doc: dict[str, Any]) -> dict[str, Any]:
    response = client.post(PROFILES, json=doc)
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def causes(response: Any) -> list[tuple[str, str]]:
    body = response.json()
    assert body["kind"] == "Status" and body["status"] == "Failure"
    return [(c["field"], c["message"]) for c in body["details"]["causes"]]


def test_create_get_list(client: TestClient) -> None:
    created = create(client, profile_doc(labels={"team": "video"}))
    meta = created["metadata"]
    assert meta["name"] == "streaming" and meta["generation"] == 1 and meta["uid"]
    assert isinstance(meta["resourceVersion"], str) and meta["creationTimestamp"].endswith("Z")
    assert meta["finalizers"] == ["stortune.io/restore-settings"]
    assert "deletionTimestamp" not in meta
    # Defaults are filled, unset fields are absent.
    assert created["spec"]["mode"] == "enforce"
    assert created["spec"]["rules"][0]["settings"] == {"read_ahead_kb": 4096}

    got = client.get(f"{PROFILES}/streaming")
    assert got.status_code == 200 and got.json() == created

    listed = client.get(PROFILES).json()
    assert listed["kind"] == "StorageProfileList" and listed["apiVersion"] == "stortune/v1"
    assert [i["metadata"]["name"] for i in listed["items"]] == ["streaming"]
    assert int(listed["metadata"]["resourceVersion"]) >= int(meta["resourceVersion"])


def test_create_existing_is_409(client: TestClient) -> None:
    create(client, profile_doc())
    response = client.post(PROFILES, json=profile_doc())
    assert response.status_code == 409
    assert response.json()["reason"] == "AlreadyExists"


def test_unknown_profile_is_404(client: TestClient) -> None:
    for method in ("get", "delete"):
        response = client.request(method, f"{PROFILES}/nope")
        assert response.status_code == 404
        assert response.json()["reason"] == "NotFound"
        assert response.json()["details"] == {"name": "nope", "kind": "StorageProfile", "causes": []}
    assert client.put(f"{PROFILES}/nope", json=profile_doc("nope")).status_code == 404


def test_generation_moves_only_with_the_spec(client: TestClient) -> None:
    first = create(client, profile_doc())
    rv1 = first["metadata"]["resourceVersion"]

    relabelled = copy.deepcopy(first)
    relabelled["metadata"]["labels"] = {"team": "video"}
    second = client.put(f"{PROFILES}/streaming", json=relabelled).json()
    assert second["metadata"]["generation"] == 1
    assert second["metadata"]["resourceVersion"] != rv1
    assert second["metadata"]["labels"] == {"team": "video"}

    retuned = copy.deepcopy(second)
    retuned["spec"]["rules"][0]["settings"]["read_ahead_kb"] = 8192
    third = client.put(f"{PROFILES}/streaming", json=retuned).json()
    assert third["metadata"]["generation"] == 2
    assert third["spec"]["rules"][0]["settings"] == {"read_ahead_kb": 8192}

    # The same document again writes nothing.
    fourth = client.put(f"{PROFILES}/streaming", json=third).json()
    assert fourth["metadata"]["resourceVersion"] == third["metadata"]["resourceVersion"]


def test_spelling_a_default_out_is_not_a_spec_change(client: TestClient) -> None:
    first = create(client, profile_doc())
    explicit = copy.deepcopy(first)
    explicit["spec"]["mode"] = "enforce"
    explicit["spec"]["priority"] = 0
    explicit["metadata"]["annotations"] = {"note": "x"}
    assert client.put(f"{PROFILES}/streaming", json=explicit).json()["metadata"]["generation"] == 1


def test_stale_resource_version_is_409(client: TestClient) -> None:
    first = create(client, profile_doc())
    winner = with_changes(first, priority=5)
    assert client.put(f"{PROFILES}/streaming", json=winner).status_code == 200

    loser = with_changes(first, priority=7)  # still carries the first resourceVersion
    response = client.put(f"{PROFILES}/streaming", json=loser)
    assert response.status_code == 409
    assert response.json()["reason"] == "Conflict"
    assert client.get(f"{PROFILES}/streaming").json()["spec"]["priority"] == 5

    garbage = with_changes(first, priority=7)
    garbage["metadata"]["resourceVersion"] = "not-a-version"
    assert client.put(f"{PROFILES}/streaming", json=garbage).status_code == 409


def test_update_without_resource_version_is_unconditional(client: TestClient) -> None:
    create(client, profile_doc())
    response = client.put(f"{PROFILES}/streaming", json=profile_doc(settings={"read_ahead_kb": 512}))
    assert response.status_code == 200
    assert response.json()["metadata"]["generation"] == 2


def test_uid_precondition(client: TestClient) -> None:
    first = create(client, profile_doc())
    other = copy.deepcopy(first)
    other["metadata"]["uid"] = "00000000-0000-0000-0000-000000000000"
    del other["metadata"]["resourceVersion"]
    assert client.put(f"{PROFILES}/streaming", json=other).status_code == 409


def test_name_in_body_must_match_url(client: TestClient) -> None:
    create(client, profile_doc())
    response = client.put(f"{PROFILES}/streaming", json=profile_doc("other"))
    assert response.status_code == 422
    assert causes(response)[0][0] == "metadata.name"


@pytest.mark.parametrize(("mutate", "field", "fragment"), [
    (lambda d: d["spec"]["rules"][0]["settings"].update(read_ahead_kb=-5),
     "spec.rules[0].settings.read_ahead_kb", "must be >= 0"),
    (lambda d: d["spec"]["rules"][0]["settings"].update(warp_speed=9),
     "spec.rules[0].settings.warp_speed", "not a tunable in the catalog"),
    (lambda d: d["spec"].pop("hostSelector"), "spec.hostSelector", "required by the control plane"),
    (lambda d: d["metadata"].update(labels={"team": "bad value!"}), "metadata.labels", "bad value!"),
    (lambda d: d["spec"].update(hostSelector={"matchLabels": {}}), "spec.hostSelector",
     "empty selector"),
    (lambda d: d.update(kind="Pod"), "kind", "not a StorageProfile"),
    (lambda d: d["metadata"].update(annotations={"a": "x\x00y"}), "metadata.annotations.a", "NUL"),
])
def test_invalid_documents_are_422_with_the_field_path(
    client: TestClient, mutate: Any, field: str, fragment: str
) -> None:
    doc = profile_doc()
    mutate(doc)
    for response in (client.post(PROFILES, json=doc), client.post(f"{PROFILES}?dryRun=All", json=doc)):
        assert response.status_code == 422, response.text
        body = response.json()
        assert body["reason"] == "Invalid" and body["code"] == 422
        found = causes(response)
        assert any(f == field and fragment in m for f, m in found), found
    assert client.get(PROFILES).json()["items"] == []


def test_body_that_is_not_a_document(client: TestClient) -> None:
    response = client.post(PROFILES, content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 400 and response.json()["reason"] == "BadRequest"
    response = client.post(PROFILES, json=[1, 2])
    assert response.status_code == 422 and "expected a mapping" in response.json()["message"]


def test_hostile_bodies_are_400(client: TestClient) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    response = client.post(PROFILES, content=f'{{"metadata": {deep}}}',
                           headers={"content-type": "application/json"})
    assert response.status_code == 400 and "nests too deeply" in response.json()["message"]
    laughs = "a: &a [x, x, x]\nb: &b [*a, *a, *a]\nc: [*b, *b, *b]\n"
    response = client.post(PROFILES, content=laughs, headers={"content-type": "application/yaml"})
    assert response.status_code == 400 and "aliases" in response.json()["message"]


def test_yaml_bodies_are_accepted(client: TestClient) -> None:
    text = (
        "apiVersion: stortune/v1\nkind: StorageProfile\nmetadata: {name: from-yaml}\n"
        "spec:\n  hostSelector: {matchLabels: {role: streamer}}\n  rules:\n"
        "    - {name: r, match: {kind: [loop]}, settings: {read_ahead_kb: 1024}}\n"
    )
    response = client.post(PROFILES, content=text, headers={"content-type": "application/yaml"})
    assert response.status_code == 201, response.text


def test_fetched_documents_round_trip(client: TestClient) -> None:
    """A document as GET returns it (server metadata, status) can be sent back."""
    create(client, profile_doc())
    client.post(f"{API}/agents/register", json=registration())
    doc = client.get(f"{PROFILES}/streaming").json()
    assert client.put(f"{PROFILES}/streaming", json=doc).status_code == 200


def test_fastapi_validation_errors_use_the_status_shape(client: TestClient) -> None:
    response = client.get(f"{API}/events?limit=0")
    assert response.status_code == 422
    assert response.json()["reason"] == "Invalid"
    assert causes(response)[0][0] == "query.limit"
    response = client.post(f"{PROFILES}?dryRun=Some", json=profile_doc())
    assert response.status_code == 422 and causes(response)[0][0] == "query.dryRun"


def test_delete_without_holders_removes_at_once(client: TestClient, controller: RecordingController) -> None:
    client.post(f"{API}/agents/register", json=registration())
    create(client, with_changes(profile_doc(), rollout={"strategy": "all-at-once"}))
    controller.clear()
    response = client.delete(f"{PROFILES}/streaming")
    assert response.status_code == 200
    assert response.json()["metadata"]["deletionTimestamp"]
    assert client.get(f"{PROFILES}/streaming").status_code == 404
    assert controller.hosts() == {"h1"}


def test_delete_waits_for_hosts_that_applied_it(app: Any, client: TestClient) -> None:
    from stortune.server.services import hosts

    client.post(f"{API}/agents/register", json=registration("h1"))
    client.post(f"{API}/agents/register", json=registration("h2"))
    create(client, profile_doc())
    with app.state.sessions() as session:
        for name in ("h1", "h2"):
            hosts.write_status(session, name, applied_generations={"streaming": 1}, now=app.state.clock())

    response = client.delete(f"{PROFILES}/streaming")
    assert response.status_code == 202
    pending = response.json()["metadata"]
    assert pending["deletionTimestamp"] and pending["finalizers"] == ["stortune.io/restore-settings"]
    assert client.delete(f"{PROFILES}/streaming").status_code == 202  # idempotent
    # Being deleted: neither replaced nor created again.
    assert client.put(f"{PROFILES}/streaming", json=profile_doc()).status_code == 409
    assert client.post(PROFILES, json=profile_doc()).status_code == 409

    with app.state.sessions() as session:  # the reconciler restored h1
        hosts.write_status(session, "h1", applied_generations={}, now=app.state.clock())
    assert client.get(f"{PROFILES}/streaming").status_code == 200
    assert client.delete(f"{API}/hosts/h2").status_code == 200  # h2 declared gone
    assert client.get(f"{PROFILES}/streaming").status_code == 404
    reasons = [e["reason"] for e in client.get(f"{API}/events?profile=streaming").json()["items"]]
    # The deletion's rollout (RolloutStarted, issue 27) writes its own events in between.
    assert reasons[0] == "Deleted" and "Deleting" in reasons


def test_status_write_moves_resource_version_not_generation(app: Any, client: TestClient) -> None:
    from stortune.server.services import profiles

    first = create(client, profile_doc())["metadata"]
    with app.state.sessions() as session:
        profiles.write_status(session, "streaming", {"hostsApplied": 3}, app.state.clock())
    got = client.get(f"{PROFILES}/streaming").json()
    assert got["status"] == {"hostsApplied": 3}
    assert got["metadata"]["generation"] == first["generation"]
    assert got["metadata"]["resourceVersion"] != first["resourceVersion"]


def test_list_label_selector(client: TestClient) -> None:
    create(client, profile_doc("a", labels={"tier": "gold", "team": "video"}))
    create(client, profile_doc("b", labels={"tier": "silver"}))
    create(client, profile_doc("c"))

    def names(selector: str) -> list[str]:
        response = client.get(PROFILES, params={"labelSelector": selector})
        assert response.status_code == 200, response.text
        return [i["metadata"]["name"] for i in response.json()["items"]]

    assert names("tier=gold") == ["a"]
    assert names("tier in (gold, silver)") == ["a", "b"]
    assert names("tier notin (gold)") == ["b", "c"]
    assert names("tier!=gold") == ["b", "c"]
    assert names("!tier") == ["c"]
    assert names("tier,team") == ["a"]
    assert names("") == ["a", "b", "c"]
    response = client.get(PROFILES, params={"labelSelector": "tier in gold"})
    assert response.status_code == 422 and causes(response)[0][0] == "labelSelector"


def test_dry_run_stores_nothing_and_plans_each_matched_host(
    client: TestClient, controller: RecordingController,
) -> None:
    topology = loop_topology("h1", read_ahead_kb=128)
    client.post(f"{API}/agents/register", json=registration("h1", topology=topology))
    client.post(f"{API}/agents/register", json=registration("h2"))  # no topology yet
    client.post(f"{API}/agents/register", json=registration("other", labels={"role": "db"}))
    version = client.get(PROFILES).json()["metadata"]["resourceVersion"]
    controller.clear()

    doc = profile_doc(settings={"read_ahead_kb": 4096, "scheduler": "bfq"})
    response = client.post(f"{PROFILES}?dryRun=All", json=doc)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["dryRun"] is True
    assert body["object"]["metadata"]["name"] == "streaming"
    assert "resourceVersion" not in body["object"]["metadata"]
    assert set(body["plans"]) == {"h1", "h2"}
    assert body["plans"]["h2"] == {"topologyReported": False, "changes": [], "restorations": [],
                                   "rejections": []}
    h1 = body["plans"]["h1"]
    assert h1["topologyReported"] is True
    assert [(c["device"], c["tunable"], c["current"], c["desired"]) for c in h1["changes"]] == [
        ("loop0", "read_ahead_kb", 128, 4096)]
    # bfq is not offered on loop0: the dry run shows the fatal rejection.
    (rejection,) = h1["rejections"]
    assert rejection["tunable"] == "scheduler" and rejection["fatal"] is True
    assert rejection["source"]["profile"] == "streaming"

    assert client.get(PROFILES).json() == {"apiVersion": "stortune/v1", "kind": "StorageProfileList",
                                           "metadata": {"resourceVersion": version}, "items": []}
    assert not controller.requests
    # Storable anyway: the host will report Applied=False with the reason.
    assert client.post(PROFILES, json=doc).status_code == 201


def test_dry_run_replace_plans_with_the_other_profiles(client: TestClient) -> None:
    client.post(f"{API}/agents/register", json=registration("h1", topology=loop_topology()))
    strong = create(client, profile_doc("strong", priority=10, settings={"read_ahead_kb": 1024}))
    weak = create(client, profile_doc("weak", settings={"read_ahead_kb": 2048}))

    changed = copy.deepcopy(weak)
    changed["spec"]["rules"][0]["settings"]["read_ahead_kb"] = 512
    response = client.put(f"{PROFILES}/weak?dryRun=All", json=changed)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"]["metadata"]["generation"] == 2
    assert body["object"]["metadata"]["resourceVersion"] == weak["metadata"]["resourceVersion"]
    # The stronger profile still wins on h1.
    (change,) = body["plans"]["h1"]["changes"]
    assert change["desired"] == 1024 and change["source"]["profile"] == "strong"
    assert client.get(f"{PROFILES}/weak").json() == weak
    assert strong["metadata"]["generation"] == 1

    stale = copy.deepcopy(changed)
    client.put(f"{PROFILES}/weak", json=changed)
    assert client.put(f"{PROFILES}/weak?dryRun=All", json=stale).status_code == 409


def test_writes_enqueue_old_and_new_selected_hosts(
    client: TestClient, controller: RecordingController,
) -> None:
    client.post(f"{API}/agents/register", json=registration("s1", labels={"role": "streamer"}))
    client.post(f"{API}/agents/register", json=registration("d1", labels={"role": "db"}))
    client.post(f"{API}/agents/register", json=registration("x1", labels={"role": "other"}))
    controller.clear()

    # All at once: in waves (issue 27) a host stays at what it holds until its wave, and only the
    # canary is asked to look (test_rollout_storage covers that).
    first = create(client, with_changes(profile_doc(), rollout={"strategy": "all-at-once"}))
    assert controller.hosts() == {"s1"}
    controller.clear()
    moved = copy.deepcopy(first)
    moved["spec"]["hostSelector"] = {
        "matchExpressions": [{"key": "role", "operator": "In", "values": ["db"]}]}
    assert client.put(f"{PROFILES}/streaming", json=moved).status_code == 200
    assert controller.hosts() == {"s1", "d1"}  # s1 must drop it, d1 must take it
    controller.clear()
    relabel = client.get(f"{PROFILES}/streaming").json()
    relabel["metadata"]["labels"] = {"x": "y"}
    client.put(f"{PROFILES}/streaming", json=relabel)
    assert controller.hosts() == set()  # metadata only: nothing for hosts to do


# -- restorations in dry runs: what a host would put back -------------------------------------
def restored(topology_ra: int = 4096, original: int = 2560) -> dict[str, Any]:
    """h1's registration: read_ahead_kb at ``topology_ra``, changed by stortune from ``original``
    (as its agent reports it from its journal)."""
    topology = loop_topology("h1", read_ahead_kb=topology_ra)
    state = topology.devices[0].tunables["read_ahead_kb"]
    state.original = RecordedOriginal(value=original)
    return registration("h1", topology=topology)


def host_rows(body: dict[str, Any], host: str = "h1") -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    plan = body["plans"][host]
    return ([(c["device"], c["tunable"], c["current"], c["desired"]) for c in plan["changes"]],
            [(r["device"], r["tunable"], r["current"], r["desired"], r["to"]) for r in plan["restorations"]])


def test_dry_run_of_a_removed_setting_shows_it_put_back(client: TestClient) -> None:
    client.post(f"{API}/agents/register", json=restored())
    stored = create(client, profile_doc(settings={"read_ahead_kb": 4096}))
    changed = copy.deepcopy(stored)
    changed["spec"]["rules"][0]["settings"] = {"scheduler": "none"}
    response = client.put(f"{PROFILES}/streaming?dryRun=All", json=changed)
    assert response.status_code == 200, response.text
    assert host_rows(response.json()) == ([], [("loop0", "read_ahead_kb", 4096, 2560, "original")])


def test_dry_run_of_a_delete_shows_the_settings_put_back_and_deletes_nothing(
    client: TestClient, controller: RecordingController,
) -> None:
    client.post(f"{API}/agents/register", json=restored())
    stored = create(client, profile_doc())
    controller.clear()
    response = client.delete(f"{PROFILES}/streaming?dryRun=All")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["dryRun"] is True and body["object"]["metadata"]["deletionTimestamp"]
    assert host_rows(body) == ([], [("loop0", "read_ahead_kb", 4096, 2560, "original")])
    assert client.get(f"{PROFILES}/streaming").json() == stored
    assert not controller.requests
    assert client.delete(f"{PROFILES}/nope?dryRun=All").status_code == 404


def test_dry_run_of_a_replace_plans_the_hosts_it_stops_selecting(client: TestClient) -> None:
    client.post(f"{API}/agents/register", json=restored())
    stored = create(client, profile_doc())
    moved = with_changes(stored, hostSelector={"matchLabels": {"role": "database"}})
    body = client.put(f"{PROFILES}/streaming?dryRun=All", json=moved).json()
    assert host_rows(body) == ([], [("loop0", "read_ahead_kb", 4096, 2560, "original")])


def test_plans_of_a_set_see_each_others_new_versions(client: TestClient) -> None:
    """One file removes read_ahead_kb from a (stronger) profile, another adds it to a weaker one:
    no restoration, but the weaker one's value. Per-document dry runs each see the other's stored
    version and get it wrong both ways."""
    client.post(f"{API}/agents/register", json=restored())
    strong = create(client, profile_doc("strong", priority=10, settings={"read_ahead_kb": 4096}))
    weak = create(client, profile_doc("weak", settings={"scheduler": "none"}))
    strong_new = copy.deepcopy(strong)
    strong_new["spec"]["rules"][0]["settings"] = {"scheduler": "none"}
    weak_new = copy.deepcopy(weak)
    weak_new["spec"]["rules"][0]["settings"] = {"read_ahead_kb": 1024}

    response = client.post(f"{API}/plans", json={"profiles": [strong_new, weak_new]})
    assert response.status_code == 200, response.text
    (change,), restorations = host_rows(response.json())
    assert change == ("loop0", "read_ahead_kb", 4096, 1024) and restorations == []
    assert response.json()["plans"]["h1"]["changes"][0]["source"]["profile"] == "weak"
    # Deleting the stronger one instead: the same.
    response = client.post(f"{API}/plans", json={"profiles": [weak_new], "delete": ["strong"]})
    assert host_rows(response.json()) == ([("loop0", "read_ahead_kb", 4096, 1024)], [])
    # Deleting both: it goes back to its original.
    response = client.post(f"{API}/plans", json={"delete": ["strong", "weak"]})
    assert host_rows(response.json()) == ([], [("loop0", "read_ahead_kb", 4096, 2560, "original")])
    assert client.get(f"{PROFILES}/strong").json() == strong  # nothing stored


@pytest.mark.parametrize(("body", "expected"), [
    ({"profiles": [profile_doc("a"), profile_doc("b", settings={"read_ahead_kb": -4})]},
     ("profiles[1].spec.rules[0].settings.read_ahead_kb", "must be >= 0")),
    ({"profiles": [profile_doc("a"), profile_doc("a")]},
     ("profiles[0].metadata.name", "'a' is given more than once")),
    ({"delete": ["nope"]}, ("delete[0]", 'StorageProfile "nope" does not exist')),
    ({"profiles": [profile_doc("a")], "delete": ["a"]}, ("delete[0]", "'a' is also in profiles")),
    ({"delete": ["../x"]}, ("delete[0]", "String should match pattern")),
    ({"delete": ["a\u0000b"]}, ("", "")),
    ({"profiles": [{"kind": "StorageProfile"}]}, ("profiles[0]", "")),
    ({"profiles": ["not a document"]}, ("profiles[0]", "")),
    ({"profile": []}, ("profile", "unknown field")),
    ({"kind": "StorageProfile"}, ("kind", "")),
])
def test_hostile_plan_requests_are_422_naming_the_field(
    client: TestClient, body: dict[str, Any], expected: tuple[str, str],
) -> None:
    response = client.post(f"{API}/plans", json=body)
    assert response.status_code == 422, response.text
    field, words = expected
    found = causes(response)
    assert any(f.startswith(field) and words in m for f, m in found), found


def test_hostile_a_plan_request_of_more_patterns_than_its_budget_is_refused_by_counting(
    client: TestClient,
) -> None:
    """Hostile: a thousand documents each just under the per-profile pattern budget would hold
    the server for minutes compiling them. The request is refused by counting first."""
    rules = [{"name": f"r{i}", "settings": {"read_ahead_kb": 4096},
              "match": {"name": [f"sd{i}x{j}*" for j in range(64)]}} for i in range(16)]
    docs = [{**profile_doc(f"p{n}"), "spec": {**profile_doc(f"p{n}")["spec"], "rules": rules}}
            for n in range(9)]
    response = client.post(f"{API}/plans", json={"profiles": docs})
    assert response.status_code == 422, response.text
    assert causes(response) == [("profiles", "the documents hold 9216 patterns (globs and regular "
                                 "expressions) in all; at most 8192 per request: plan them in parts")]


def test_plans_of_a_profile_being_deleted_are_refused_and_need_the_right_to_write(
    app: Any, client: TestClient,
) -> None:
    client.post(f"{API}/agents/register", json=restored())
    create(client, profile_doc())
    with app.state.sessions() as session:  # as the reconciler records it once h1 applied it
        session.get(Host, "h1").applied_generations = {"streaming": 1}
        session.commit()
    assert client.delete(f"{PROFILES}/streaming").status_code == 202  # waits for h1
    # Its deletion dry run still shows what h1, holding it, puts back.
    body = client.delete(f"{PROFILES}/streaming?dryRun=All").json()
    assert host_rows(body) == ([], [("loop0", "read_ahead_kb", 4096, 2560, "original")])
    refused = client.post(f"{API}/plans", json={"profiles": [profile_doc()]})
    assert refused.status_code == 422
    assert causes(refused) == [("profiles[0].metadata.name",
                                'StorageProfile "streaming" is being deleted; it cannot be changed')]
    viewer = TestClient(app, headers=bearer(issue_token(app, "viewer")))
    assert viewer.post(f"{API}/plans", json={"delete": ["streaming"]}).status_code == 403
    assert viewer.delete(f"{PROFILES}/streaming?dryRun=All").status_code == 403


# -- patterns and strict types (issue 14) ------------------------------------------------------
def _with_match(doc: dict[str, Any], **match: Any) -> dict[str, Any]:
    doc["spec"]["rules"][0]["match"] = {"kind": ["disk"], **match}
    return doc


@pytest.mark.parametrize(("pattern", "words"), [
    ("(" * 1000, "at most 256"),                  # RecursionError in re.compile: was a 500
    ("(" * 100, "missing )"),                     # within the length bound: RE2 says why
    (r"(\w)\1", "invalid escape sequence"),       # a backreference
    ("(?!x).*", "invalid perl operator"),         # lookahead
    ("x{1001}", "invalid repetition size"),
])
def test_patterns_that_cannot_run_are_422_naming_the_field(
    client: TestClient, pattern: str, words: str,
) -> None:
    """Hostile: create, dry run and replace (and its dry run) all refuse the pattern with the field."""
    create(client, profile_doc("held"))
    calls = [("post", PROFILES, "bad"), ("post", f"{PROFILES}?dryRun=All", "bad"),
             ("put", f"{PROFILES}/held", "held"), ("put", f"{PROFILES}/held?dryRun=All", "held")]
    for method, url, name in calls:
        response = client.request(method, url, json=_with_match(profile_doc(name), model=pattern))
        assert response.status_code == 422, (method, url, response.text)
        assert any(f == "spec.rules[0].match.model" and words in m for f, m in causes(response)), \
            causes(response)
    assert [p["metadata"]["name"] for p in client.get(PROFILES).json()["items"]] == ["held"]
    assert client.get(f"{PROFILES}/held").json()["spec"]["rules"][0]["match"] == {"kind": ["loop"]}


def test_catastrophic_pattern_dry_run_answers_at_once(client: TestClient) -> None:
    """Hostile: ``(.*.*)*X`` froze the whole process for 17 s against a 16-character model (the
    dry run plans in the request). The pattern runs on RE2 now; against a 40-character model
    Python's re would backtrack for millennia (ten times longer with every two more characters),
    so the dry run answering at all, and /healthz after it, is the proof, with no clock."""
    model = "SAMSUNG MZQL23T8HCLS-00A07 ENTERPRISE 01"
    assert len(model) == 40
    disk = Device(name="nvme0n1", kind=DeviceKind.DISK, id="wwn:eui.0025", model=model, rotational=False,
                  tunables={"read_ahead_kb": TunableState(supported=True, value=128, raw="128",
                                                          writable=True)})
    topology = Topology(hostname="h1", kernel="6.1.0", devices=[disk])
    registered = client.post(f"{API}/agents/register", json=registration("h1", topology=topology))
    assert registered.status_code == 200
    assert patterns.runs_on_re2("(.*.*)*X")
    response = client.post(f"{PROFILES}?dryRun=All",
                           json=_with_match(profile_doc(), model="(.*.*)*X"))
    assert response.status_code == 200, response.text
    assert client.get("/healthz").status_code == 200
    assert response.json()["plans"]["h1"]["changes"] == []  # the model does not end in X
    matching = _with_match(profile_doc("other"), model="(.*.*)*01")
    (change,) = client.post(f"{PROFILES}?dryRun=All", json=matching).json()["plans"]["h1"]["changes"]
    assert (change["device"], change["desired"]) == ("nvme0n1", 4096)


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda d: d["spec"]["rules"][0].update(settings={"read_ahead_kb": "4096"}),
     "spec.rules[0].settings.read_ahead_kb"),
    (lambda d: d["spec"]["rules"][0].update(settings={"read_ahead_kb": 4096.0}),
     "spec.rules[0].settings.read_ahead_kb"),
    (lambda d: d["spec"].update(priority="100"), "spec.priority"),
    (lambda d: d["spec"]["rules"][0]["match"].update(rotational="yes"), "spec.rules[0].match.rotational"),
    (lambda d: d["spec"]["rules"][0]["match"].update(size={"min": True}), "spec.rules[0].match.size.min"),
])
def test_documents_are_typed_strictly(client: TestClient, mutate: Any, field: str) -> None:
    """Hostile: a string where the schema says integer was accepted and converted."""
    doc = profile_doc()
    mutate(doc)
    for response in (client.post(PROFILES, json=doc), client.post(f"{PROFILES}?dryRun=All", json=doc)):
        assert response.status_code == 422, response.text
        assert field in [f for f, _ in causes(response)], causes(response)
    assert client.get(PROFILES).json()["items"] == []
