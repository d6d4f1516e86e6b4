"""One size rule for every document: KB is 1000, KiB is 1024, a bare letter is binary (dd, fio).

Hostile cases first; then the rule as profiles and BenchmarkSpecs use it."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stortune.schemas import export, sizes
from stortune.schemas.bench import units
from stortune.schemas.bench.spec import parse_benchmark
from stortune.schemas.bench.steps import TargetFacts
from stortune.schemas.documents import DocumentError, parse_profile


# -- hostile ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("bad", "words"), [
    (-1, "negative"), ("-1k", "not a size"), ("+1k", "not a size"),               # signs
    (float("nan"), "not a size"), ("nan", "not a size"), ("NaN k", "not a size"),  # NaN
    (float("inf"), "not a size"), ("inf", "not a size"), ("infinity", "not a size"),
    ("1e999", "not a size"), ("1e3", "not a size"), ("1E3k", "not a size"),       # exponents
    ("1_000", "not a size"), ("0x10", "not a size"),                              # other literals
    ("٤k", "not a size"), ("\uff14k", "not a size"), ("\U0001d7dck", "not a size"),  # unicode digits
    ("4\u00a0k", "not a size"), ("\u20034k", "not a size"),                       # unicode spaces
    ("1" * 65, "at most 64 characters"), (" " * 10_000 + "4k", "at most 64 characters"),
    ("1.3k", "whole number"), ("0.5", "whole number"), ("0.5B", "whole number"),  # fractions
    (2**63, "more than"), ("8192PiB", "more than"), ("9" * 20, "more than"),       # over 2**63 - 1
    ("10000000000PB", "more than"),
    (4096.0, "not a size"), (True, "not a size"), (None, "not a size"), ([4096], "not a size"),
    ("", "not a size"), ("k", "not a size"), ("KiB", "not a size"), ("4i", "not a size"),
    ("4iB", "not a size"), ("4KiBB", "not a size"), ("4 k B", "not a size"), ("4EiB", "not a size"),
    ("1 MB/s", "not a size"), ("4k\x00", "not a size"),
])
def test_hostile_sizes_are_refused_with_the_reason(bad: object, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        sizes.parse_size(bad)


class _Reads:
    """Stands in for a compiled expression and records the length of every text it is given."""

    def __init__(self, real: re.Pattern[str], lengths: list[int]) -> None:
        self.real, self.lengths = real, lengths

    def fullmatch(self, text: str) -> re.Match[str] | None:
        self.lengths.append(len(text))
        return self.real.fullmatch(text)


def test_parsing_cost_is_bounded_whatever_the_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hostile: whitespace runs made the old expressions quadratic (sizes, durations) and cubic
    (I/O rates: 5,000 spaces took over 300 s). A text over the bound is refused by its length
    before any expression reads it, so the cost of an expression is bounded by 64 characters
    whatever a document holds; the 2,000,000-character text would keep the old code busy for
    years, so the test completing is part of the proof."""
    assert sizes.MAX_SIZE_TEXT == units.MAX_TEXT == 64
    read: list[int] = []
    for module, name in ((sizes, "_SIZE"), (units, "_RATE"), (units, "_COUNT"), (units, "_TIME")):
        monkeypatch.setattr(module, name, _Reads(getattr(module, name), read))
    for parse in (sizes.parse_size, units.parse_duration, units.parse_latency, units.parse_rate,
                  units.parse_count_rate):
        at_bound = "1" + " " * 62 + "x"
        with pytest.raises(ValueError):
            parse(at_bound)
        assert read == [64], (parse, read)  # at the bound: read (and refused) by the expression
        read.clear()
        for spaces in (63, 5_000, 2_000_000):  # one past the bound, and far past it
            with pytest.raises(ValueError):
                parse("1" + " " * spaces + "x")
        assert read == [], (parse, read)


def test_largest_size_is_accepted() -> None:
    assert sizes.parse_size(2**63 - 1) == 2**63 - 1
    assert sizes.parse_size("8191PiB") == 8191 * 2**50
    assert sizes.parse_size("9223372036854775807") == 2**63 - 1


# -- the rule -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "value"), [
    # A bare letter is binary, in any case (dd, fio).
    ("4k", 4096), ("4K", 4096), ("1M", 1 << 20), ("1m", 1 << 20), ("1G", 1 << 30), ("2T", 2 << 40),
    ("1P", 1 << 50), ("4Ki", 4096),
    # KB, MB, ... are decimal; KiB, MiB, ... binary; letters in any case.
    ("4KB", 4000), ("4kb", 4000), ("4kB", 4000), ("500GB", 500 * 10**9), ("1TB", 10**12),
    ("2PB", 2 * 10**15), ("4KiB", 4096), ("4kib", 4096), ("1.5TiB", 3 << 39), ("64MiB", 64 << 20),
    # B is optional; a bare number is bytes.
    ("512", 512), ("512B", 512), ("512b", 512), (8192, 8192), (0, 0),
    # Fractions that come out whole; whitespace around and between.
    ("1.5M", 3 << 19), (".5k", 512), ("0.5KB", 500), (" 2 T ", 2 << 40), ("\t64 KiB\n", 64 << 10),
])
def test_the_one_rule(text: object, value: int) -> None:
    assert sizes.parse_size(text) == value


def test_benchmark_units_use_the_same_parser() -> None:
    assert units.parse_size is sizes.parse_size


@given(st.integers(min_value=0, max_value=2**63 - 1))
def test_sizes_round_trip(n: int) -> None:
    assert sizes.parse_size(sizes.format_size(n)) == n


@given(st.integers(min_value=0, max_value=8191), st.sampled_from(["K", "M", "G", "T", "P"]))
def test_decimal_and_binary_units_differ_by_their_base(n: int, letter: str) -> None:
    power = "KMGTP".index(letter) + 1
    assert sizes.parse_size(f"{n}{letter}B") == n * 1000**power
    assert sizes.parse_size(f"{n}{letter}iB") == n * 1024**power
    assert sizes.parse_size(f"{n}{letter.lower()}") == n * 1024**power


# -- in documents ------------------------------------------------------------------------------
def _profile(size: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "stortune/v1", "kind": "StorageProfile", "metadata": {"name": "p"},
            "spec": {"rules": [{"name": "r", "match": {"kind": ["disk"], "size": size},
                                "settings": {"read_ahead_kb": 4096}}]}}


def test_profile_sizes_follow_the_rule() -> None:
    """A profile's ``1T`` was 10^12 bytes and a BenchmarkSpec's 2^40: both are 2^40 now."""
    profile = parse_profile(_profile({"min": "1T", "max": "2TB"}))
    assert profile.spec.rules[0].match.size is not None
    assert profile.spec.rules[0].match.size.bounds() == (1 << 40, 2 * 10**12)
    # The text is kept as written (documents round-trip), and read by the one parser.
    assert profile.document()["spec"]["rules"][0]["match"]["size"] == {"min": "1T", "max": "2TB"}


@pytest.mark.parametrize(("size", "path", "words"), [
    ({"min": True}, "spec.rules[0].match.size.min", "not a size"),
    ({"min": 1.5}, "spec.rules[0].match.size.min", "not a size"),
    ({"max": 2**63}, "spec.rules[0].match.size.max", "more than"),
    ({"max": "-1G"}, "spec.rules[0].match.size.max", "not a size"),
    ({"min": "1e999"}, "spec.rules[0].match.size.min", "not a size"),
    ({"min": "2TiB", "max": "2TB"}, "spec.rules[0].match.size", "larger than max"),
])
def test_bad_profile_sizes_name_the_field(size: dict[str, Any], path: str, words: str) -> None:
    with pytest.raises(DocumentError) as info:
        parse_profile(_profile(size))
    assert any(p.path == path and words in p.message for p in info.value.problems), info.value.problems


def test_benchmark_sizes_follow_the_rule() -> None:
    doc: dict[str, Any] = {
        "apiVersion": "stortune/v1", "kind": "BenchmarkSpec", "metadata": {"name": "b"},
        "spec": {"target": {"file": {"path": "/srv/bench.dat", "size": "1GB"}},
                 "workloads": [{"name": "w", "pattern": "read", "blockSize": "4k", "size": "512MB"}]},
    }
    spec = parse_benchmark(doc)
    assert spec.spec.target.file is not None and spec.spec.target.file.size == 10**9
    (step,) = spec.steps(TargetFacts())
    assert (step.block_size, step.size) == (4096, 512 * 10**6)
    doc["spec"]["target"]["file"]["size"] = 4096.0
    with pytest.raises(DocumentError) as info:
        parse_benchmark(doc)
    assert [p.path for p in info.value.problems] == ["spec.target.file.size"]


def _branches(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """The alternatives of a (possibly nested) anyOf."""
    return [leaf for sub in schema.get("anyOf", []) for leaf in _branches(sub)] or [schema]


def test_json_schemas_state_one_syntax() -> None:
    schemas = {name: json.loads(text) for name, text in export.render().items()}
    size_range = schemas["storageprofile.schema.json"]["$defs"]["SizeRange"]["properties"]
    bench_file = schemas["benchmarkspec.schema.json"]["$defs"]["FileTarget"]["properties"]
    for prop in (size_range["min"], size_range["max"], bench_file["size"]):
        text = next(s for s in _branches(prop) if s.get("type") == "string")
        assert text["pattern"] == sizes.SIZE_PATTERN and text["maxLength"] == sizes.MAX_SIZE_TEXT
