"""A StorageProfile is validated against the catalog; every error names its field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stortune.schemas import catalog, export
from stortune.schemas.documents import DocumentError, load_profiles

GOOD = """
apiVersion: stortune/v1
kind: StorageProfile
metadata: {name: vod-streamer, labels: {workload: streaming}}
spec:
  hostSelector: {matchLabels: {role: streamer}}
  priority: 100
  rules:
    - name: raid-volumes
      match: {kind: [disk], name: ["sd*"], rotational: true, model: "PERC.*"}
      settings: {read_ahead_kb: 4096, scheduler: mq-deadline, nr_requests: 64}
    - name: md-raid5
      match: {kind: [md], raidLevel: [raid5, raid6]}
      settings: {stripe_cache_size: 4096, sync_speed_max: 100000, sync_speed_min: system}
"""


def problems(text: str) -> list[tuple[str, str]]:
    with pytest.raises(DocumentError) as info:
        load_profiles(text, "p.yaml")
    return [(p.path, p.message) for p in info.value.problems]


def test_good_document_round_trips() -> None:
    (profile,) = load_profiles(GOOD)
    assert profile.spec.mode == "enforce"
    assert profile.spec.rules[0].values() == {
        "read_ahead_kb": 4096,
        "scheduler": "mq-deadline",
        "nr_requests": 64,
    }
    assert profile.spec.rules[1].values()["sync_speed_min"] == "system"


@pytest.mark.parametrize(
    ("old", "new", "path", "words"),
    [
        ("read_ahead_kb: 4096", "read_ahead_kb: -8", "spec.rules[0].settings.read_ahead_kb", ">= 0"),
        ("read_ahead_kb: 4096", "read_ahead_kb: lots", "spec.rules[0].settings.read_ahead_kb", "integer"),
        (
            "read_ahead_kb: 4096",
            "read_ahead_kb: 4097",
            "spec.rules[0].settings.read_ahead_kb",
            "multiple of 4",
        ),
        ("nr_requests: 64", "nr_requests: 100000", "spec.rules[0].settings.nr_requests", "<= 2048"),
        ("nr_requests: 64", "nr_requests: 64, turbo: 1", "spec.rules[0].settings.turbo", "not a tunable"),
        ("kind: [md]", "kind: [raid]", "spec.rules[1].match.kind[0]", "disk"),
        ('model: "PERC.*"', 'model: "PERC["', "spec.rules[0].match.model", "regular expression"),
        ("priority: 100", "priority: high", "spec.priority", "integer"),
        ("name: vod-streamer", "name: Vod_Streamer", "metadata.name", "not a valid name"),
        ("{matchLabels: {role: streamer}}", "{}", "spec.hostSelector", "empty selector"),
        (
            "stripe_cache_size: 4096",
            "stripe_cache_size: 8",
            "spec.rules[1].settings.stripe_cache_size",
            ">= 17",
        ),
        (
            "sync_speed_min: system",
            "sync_speed_min: fast",
            "spec.rules[1].settings.sync_speed_min",
            "integer",
        ),
    ],
)
def test_bad_values_name_the_field(old: str, new: str, path: str, words: str) -> None:
    assert old in GOOD
    found = problems(GOOD.replace(old, new))
    assert any(p == path and words in m for p, m in found), found


@pytest.mark.parametrize(
    ("old", "new", "path"),
    [
        # Hostile: numeric strings were turned into integers (catalog.Tunable.validate), and
        # pydantic's lax mode read "100" as 100 and "yes" as true. The schema says integer and
        # boolean: anything else is refused, naming the field.
        ("read_ahead_kb: 4096", 'read_ahead_kb: "4096"', "spec.rules[0].settings.read_ahead_kb"),
        ("read_ahead_kb: 4096", 'read_ahead_kb: " 4096 "', "spec.rules[0].settings.read_ahead_kb"),
        ("read_ahead_kb: 4096", "read_ahead_kb: 4096.0", "spec.rules[0].settings.read_ahead_kb"),
        ("read_ahead_kb: 4096", "read_ahead_kb: true", "spec.rules[0].settings.read_ahead_kb"),
        ("nr_requests: 64", 'nr_requests: "64"', "spec.rules[0].settings.nr_requests"),
        ("sync_speed_max: 100000", 'sync_speed_max: "100000"', "spec.rules[1].settings.sync_speed_max"),
        ("scheduler: mq-deadline", "scheduler: 1", "spec.rules[0].settings.scheduler"),
        ("priority: 100", 'priority: "100"', "spec.priority"),
        ("priority: 100", "priority: 100.0", "spec.priority"),
        ("priority: 100", "priority: false", "spec.priority"),
        ("rotational: true", 'rotational: "yes"', "spec.rules[0].match.rotational"),
        ("rotational: true", 'rotational: "true"', "spec.rules[0].match.rotational"),
        ("rotational: true", "rotational: 1", "spec.rules[0].match.rotational"),
        ("labels: {workload: streaming}", "labels: {workload: streaming}, generation: '2'",
         "metadata.generation"),
    ],
)
def test_documents_are_typed_strictly(old: str, new: str, path: str) -> None:
    assert old in GOOD
    found = problems(GOOD.replace(old, new))
    assert path in [p for p, _ in found], found


def test_yaml_scalars_keep_their_types() -> None:
    """YAML gives integers and booleans for 4096 and true (and, in YAML 1.1, yes): those work."""
    (profile,) = load_profiles(GOOD.replace("rotational: true", "rotational: yes"))
    assert profile.spec.rules[0].match.rotational is True
    assert profile.spec.rules[0].values()["read_ahead_kb"] == 4096


def test_setting_no_matched_kind_can_carry() -> None:
    found = problems(GOOD.replace("kind: [md]", "kind: [partition]"))
    assert any(p == "spec.rules[1]" and "stripe_cache_size applies to ['md']" in m for p, m in found)


def test_not_a_storage_profile() -> None:
    assert problems("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n") == [
        ("kind", "'ConfigMap' is not a StorageProfile document")
    ]
    assert problems("apiVersion: stortune/v1\nkind: TuningExperiment\nmetadata: {name: x}\n") == [
        ("kind", "'TuningExperiment' is not a StorageProfile document: run it with stortune tune run -f"
                 " (or stortune-agent tune -f on one host)")
    ]
    assert problems("- just\n- a list\n")[0][1].startswith("expected a mapping")
    assert "not valid YAML" in problems("a: [unclosed\n")[0][1]


def test_all_problems_of_all_documents_at_once() -> None:
    text = GOOD.replace("nr_requests: 64", "nr_requests: 1") + "---\n" + GOOD
    found = problems(text)
    assert ("spec.rules[0].settings.nr_requests", "must be >= 4 (requests), got 1") in found
    assert ("metadata.name", "'vod-streamer' is defined more than once") not in found  # first is invalid
    dup = problems(GOOD + "---\n" + GOOD)
    assert dup == [("metadata.name", "'vod-streamer' is defined more than once")]


def test_empty_match_and_empty_settings_are_refused() -> None:
    found = problems(GOOD.replace("{kind: [md], raidLevel: [raid5, raid6]}", "{}"))
    assert any("at least one criterion" in m for _, m in found)
    found = problems(
        GOOD.replace("{stripe_cache_size: 4096, sync_speed_max: 100000, sync_speed_min: system}", "{}")
    )
    assert any("sets nothing" in m for _, m in found)


def test_schema_settings_come_from_the_catalog() -> None:
    schema = json.loads(export.render()["storageprofile.schema.json"])
    props = schema["$defs"]["Settings"]["properties"]
    assert set(props) == set(catalog.CATALOG)
    assert props["read_ahead_kb"]["minimum"] == 0
    assert props["scheduler"]["type"] == "string"


def test_committed_json_schema_is_fresh() -> None:
    committed = Path(__file__).resolve().parents[2] / "schemas" / "jsonschema"
    for name, text in export.render().items():
        assert (committed / name).read_text() == text, (
            f"schemas/jsonschema/{name} is stale: run python -m stortune.schemas.export"
        )


@pytest.mark.parametrize(
    ("raw", "value"),
    [("1000 (system)", "system"), ("5000 (local)", 5000), ("system", "system"), ("200000", 200000),
     ("system\n", "system")],
)
def test_md_sync_speed_reads_every_form_it_is_found_in(raw: str, value: object) -> None:
    # The kernel prints "N (system|local)"; a restored fixture file holds the bare
    # word or number that was written, and restore must read it back as equal.
    tunable = catalog.CATALOG["sync_speed_max"]
    assert tunable.parse(raw) == (value, None)
    assert tunable.parse(tunable.format(value))[0] == value


def test_md_sync_speed_rejects_other_words() -> None:
    with pytest.raises(catalog.TunableValueError):
        catalog.CATALOG["sync_speed_max"].parse("fast")
