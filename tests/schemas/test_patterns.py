"""Patterns people write (model, vendor and driver regular expressions; name, id and threshold-step
globs) run in time linear in the text, are bounded in length, and a pattern that cannot be used is
refused naming its field. Hostile cases first."""

from __future__ import annotations

import json
from fnmatch import fnmatchcase
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stortune.schemas import export, patterns
from stortune.schemas.bench.spec import parse_benchmark
from stortune.schemas.documents import DocumentError, parse_profile
from stortune.schemas.planner import plan
from stortune.schemas.topology import Device, DeviceKind, Topology, TunableState

#: Backtracks exponentially in Python's re: 31 s against 16 characters on this machine,
#: ten times longer with every two more.
CATASTROPHIC = "(.*.*)*X"
#: A 40-character model, as NVMe controllers report them (the kernel keeps no padding here).
MODEL_40 = "SAMSUNG MZQL23T8HCLS-00A07 ENTERPRISE 01"
assert len(MODEL_40) == 40


def profile_doc(match: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "stortune/v1", "kind": "StorageProfile", "metadata": {"name": "p"},
        "spec": {"rules": [{"name": "r", "match": match, "settings": {"read_ahead_kb": 4096}}]},
    }


def problems_of(doc: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(DocumentError) as info:
        parse_profile(doc)
    return [(p.path, p.message) for p in info.value.problems]


def nvme(model: str, name: str = "nvme0n1") -> Device:
    return Device(name=name, kind=DeviceKind.DISK, id=f"wwn:eui.{name}", model=model, rotational=False,
                  tunables={"read_ahead_kb": TunableState(supported=True, value=128, raw="128",
                                                          writable=True)})


# -- hostile: time -------------------------------------------------------------------------
def test_catastrophic_regex_against_a_40_character_model_is_planned_at_once() -> None:
    """Hostile: ``(.*.*)*X`` took 17 s in a dry run against a 16-character model and blocked the
    whole control plane. RE2 runs it, so planning a host with a 40-character model completes:
    Python's re would backtrack for longer than the universe has existed (ten times longer with
    every two more characters), so finishing is the proof, with no clock to flake on a busy host."""
    profile = parse_profile(profile_doc({"model": CATASTROPHIC}))
    assert patterns.runs_on_re2(CATASTROPHIC)
    topology = Topology(hostname="h", kernel="6.1", devices=[nvme(MODEL_40), nvme(MODEL_40 + "X", "nvme1n1")])
    result = plan([profile], topology)
    assert [(c.device, c.desired) for c in result.changes] == [("nvme1n1", 4096)]
    verdicts = {e.device: e.rules[0].reason for e in result.explanations}
    assert "does not match /(.*.*)*X/" in verdicts["nvme0n1"]


def test_matching_time_grows_linearly_with_the_text() -> None:
    """Hostile: the same pattern against a 2,000,000-character value, far beyond any sysfs
    attribute. The matcher is RE2's, and at this size even a quadratic matcher (4 * 10**12 steps)
    would run for hours, let alone re's exponential one: the test completing is the proof."""
    assert patterns.runs_on_re2(CATASTROPHIC)
    assert not patterns.regex_matches(CATASTROPHIC, "A" * 2_000_000)
    assert patterns.regex_matches(CATASTROPHIC, "A" * 2_000_000 + "X")


def test_globs_with_many_stars_are_linear_too() -> None:
    """Hostile: ``*a*a*a...*b`` against a long name backtracks in a naive matcher."""
    glob = "*a" * 100 + "*b"
    assert not patterns.glob_matches(glob, "a" * 50_000)
    assert patterns.glob_matches(glob, "a" * 50_000 + "b")
    assert patterns.runs_on_re2(glob, glob=True)


# -- hostile: what cannot compile is refused, naming the field ---------------------------------
def test_a_thousand_open_parentheses_is_refused_naming_the_field() -> None:
    """Hostile: RecursionError in re.compile, a 500 from the API and a traceback in the CLIs."""
    found = problems_of(profile_doc({"model": "(" * 1000}))
    assert found == [("spec.rules[0].match.model",
                      f"the regular expression has 1000 characters; at most {patterns.MAX_PATTERN_LENGTH}")]


@pytest.mark.parametrize(("pattern", "reason"), [
    ("(" * 100, "missing )"),                        # unbalanced, within the length bound
    ("(" * 200 + "a" + ")" * 55, "missing )"),
    (r"(a)\1", "invalid escape sequence"),           # backreference
    ("(?=PERC)P.*", "invalid perl operator"),         # lookahead
    ("(?<!x)y", "invalid perl operator"),            # lookbehind
    (r"PERC\Z", "invalid escape sequence"),          # Python's end anchor (RE2 writes \z)
    ("a*+", "bad repetition operator"),              # possessive
    ("(?>a)", "invalid perl operator"),              # atomic group
    ("a{1001}", "invalid repetition size"),          # counted repetition over 1000
    ("((((((((((a{2}){2}){2}){2}){2}){2}){2}){2}){2}){2})", "invalid repetition size"),  # 2**10 nested
    (r"\pL{1000}", "pattern too large"),             # a program over MAX_PROGRAM_BYTES
    ("PERC[", "missing ]"),
])
def test_patterns_re2_refuses_are_named(pattern: str, reason: str) -> None:
    """Hostile: syntax re accepts (and may backtrack on) but RE2 does not, and what no engine
    should compile; every one names the field and the reason."""
    assert len(pattern) <= patterns.MAX_PATTERN_LENGTH
    for field in ("model", "vendor", "driver"):
        ((path, message),) = problems_of(profile_doc({field: pattern}))
        assert path == f"spec.rules[0].match.{field}"
        assert message.startswith("not a regular expression RE2 can run:") and reason in message, message
        assert len(message) < 200  # the pattern is quoted shortened, not whole


def _rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096 / 2**20


def test_hostile_a_profile_of_the_costliest_patterns_allowed_compiles_fast_and_small() -> None:
    """Hostile: each pattern is bounded, but a profile holds 768 of them (256 rules, three regular
    expressions each). At the largest program allowed, ``\\pL{n}`` of 20 characters, each took
    ~35 ms to compile (holding the GIL: the control plane, and every agent it is sent to, stood
    still 27 s for one document) and kept ~400 KiB in the cache (300 MiB). Compiling costs in
    proportion to the program, and so does what the cache keeps: the memory one document holds
    measures both, without a clock (at the old bound it would be ~300 MiB, not under 64)."""
    costliest = next(n for n in range(1, 1001) if not _allowed(f"\\pL{{{n + 1}}}"))
    rules = [{"name": f"r{i}", "settings": {"read_ahead_kb": 4096},
              "match": {field: f"(?:{field[0]}{i}|\\pL{{{costliest}}})"
                        for field in ("model", "vendor", "driver")}}
             for i in range(256)]
    doc = {**profile_doc({}), "spec": {"rules": rules}}
    before = _rss_mib()
    parse_profile(doc)
    grown = _rss_mib() - before
    assert grown < 64, f"{grown:.0f} MiB held by one document's patterns"


def _allowed(pattern: str) -> bool:
    try:
        patterns.check_regex(pattern)
    except patterns.PatternError:
        return False
    return True


def test_length_bound_is_exact() -> None:
    """Hostile: one character over the bound is refused; at the bound it is accepted."""
    at_bound = "a" * patterns.MAX_PATTERN_LENGTH
    parse_profile(profile_doc({"model": at_bound, "name": [at_bound], "id": [at_bound]}))
    over = at_bound + "a"
    found = problems_of(profile_doc({"vendor": over, "name": ["sd*", over], "id": [over]}))
    assert {path for path, _ in found} == {"spec.rules[0].match.vendor", "spec.rules[0].match.name[1]",
                                           "spec.rules[0].match.id[0]"}
    assert all("at most 256" in message for _, message in found)


def test_nul_in_a_pattern_is_refused() -> None:
    """Hostile: a NUL would end the pattern early in C; refused instead."""
    found = problems_of(profile_doc({"model": "PERC\x00.*", "id": ["wwn:\x00*"]}))
    assert {path for path, _ in found} == {"spec.rules[0].match.model", "spec.rules[0].match.id[0]"}


def test_more_than_64_globs_are_refused() -> None:
    """Hostile: a list of globs is bounded like every other list in a document."""
    found = problems_of(profile_doc({"name": [f"sd{i}" for i in range(65)]}))
    assert [path for path, _ in found] == ["spec.rules[0].match.name"]


def test_benchmark_targets_and_threshold_steps_follow_the_same_rules() -> None:
    """Hostile: a BenchmarkSpec reuses Match for its target and globs its threshold steps."""
    doc: dict[str, Any] = {
        "apiVersion": "stortune/v1", "kind": "BenchmarkSpec", "metadata": {"name": "b"},
        "spec": {"target": {"device": {"model": "(" * 1000}},
                 "workloads": [{"preset": "seq-1m"}],
                 "thresholds": [{"metric": "read_bandwidth", "step": "*" * 300, "min": "1MB/s"}]},
    }
    with pytest.raises(DocumentError) as info:
        parse_benchmark(doc)
    paths = {p.path for p in info.value.problems}
    assert paths == {"spec.target.device.model", "spec.thresholds[0].step"}, info.value.problems


# -- what keeps working ------------------------------------------------------------------------
@pytest.mark.parametrize(("pattern", "value", "matches"), [
    ("PERC.*", "PERC H730P Mini", True),
    ("PERC.*", "XPERC H730P", False),                   # full match, as before
    ("perc.*", "PERC H730P", False),                    # case-sensitive, as before
    ("(?i)perc.*", "PERC H730P", True),                 # unless asked otherwise
    (r"ST\d{4}NM\w+", "ST4000NM0033", True),
    ("[[:alpha:]]+ [0-9]+", "Micron 7450", True),
    ("(?P<series>MZ[0-9A-Z]+)-.*", "MZQL23T8HCLS-00A07", True),
    ("megaraid_sas|mpt3sas", "mpt3sas", True),
    (CATASTROPHIC, MODEL_40 + "X", True),
])
def test_re2_syntax_matches_the_whole_value(pattern: str, value: str, matches: bool) -> None:
    assert patterns.regex_matches(pattern, value) is matches


@given(st.text(st.sampled_from("ab-]![*?\\^/. é0"), max_size=10),
       st.text(st.sampled_from("ab-]![\\^/. é0c"), max_size=6))
def test_globs_match_exactly_what_fnmatch_matched(glob: str, name: str) -> None:
    """Shell glob semantics are kept: the translation to RE2 agrees with fnmatchcase."""
    assert patterns.glob_matches(glob, name) is fnmatchcase(name, glob)


@pytest.mark.parametrize(("glob", "name", "matches"), [
    ("sd*", "sda", True), ("nvme*n1", "nvme12n1", True), ("nvme?n1", "nvme12n1", False),
    ("sd[a-c]", "sdb", True), ("sd[!a-c]", "sdb", False), ("sd[!a-c]", "sdz", True),
    ("wwn:naa.6*", "wwn:naa.600605b0", True), ("loop:*demo.img", "loop:/srv/demo.img", True),
    ("sd[", "sd[", True), ("[]x]", "]", True), ("[z-a]", "z", False), ("[!z-a]", "z", True),
])
def test_glob_examples(glob: str, name: str, matches: bool) -> None:
    assert patterns.glob_matches(glob, name) is matches


def test_json_schema_states_the_bounds() -> None:
    schemas = export.render()
    match = json.loads(schemas["storageprofile.schema.json"])["$defs"]["Match"]["properties"]
    for field in ("model", "vendor", "driver"):
        assert match[field]["anyOf"][0]["maxLength"] == patterns.MAX_PATTERN_LENGTH
    for field in ("name", "id"):
        assert match[field]["anyOf"][0]["items"]["maxLength"] == patterns.MAX_PATTERN_LENGTH
        assert match[field]["anyOf"][0]["maxItems"] == 64
    threshold = json.loads(schemas["benchmarkspec.schema.json"])["$defs"]["Threshold"]["properties"]
    assert threshold["step"]["maxLength"] == patterns.MAX_PATTERN_LENGTH


def test_hostile_a_profile_of_more_patterns_than_its_budget_is_refused_before_any_compiles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Hostile: 256 rules of 64 distinct globs each is 16,384 patterns, each bounded but each
    compiled and then matched against every device of every host the profile selects. The
    document is refused by counting, before a single pattern compiles."""
    compiled: list[str] = []
    real = patterns._compile
    monkeypatch.setattr(patterns, "_compile", lambda e, w: compiled.append(e) or real(e, w))
    rules = [{"name": f"r{i}", "settings": {"read_ahead_kb": 4096},
              "match": {"name": [f"sd{i}x{j}*" for j in range(64)]}} for i in range(256)]
    with pytest.raises(DocumentError) as refused:
        parse_profile({**profile_doc({}), "spec": {"rules": rules}})
    ((where, message),) = [(p.path, p.message) for p in refused.value.problems]
    assert where == "spec" and "16384 patterns" in message and "at most 1024" in message
    assert compiled == []
    # At the budget a profile is fine: 16 rules of 64 globs.
    parse_profile({**profile_doc({}), "spec": {"rules": rules[:16]}})
