"""The labelSelector query syntax, parsed into the schemas' LabelSelector."""

from __future__ import annotations

import pytest

from stortune.server.api.label_selector import parse
from stortune.server.errors import Invalid


@pytest.mark.parametrize(("text", "labels", "expected"), [
    ("role=web", {"role": "web"}, True),
    ("role==web", {"role": "db"}, False),
    ("role=web,zone=a", {"role": "web", "zone": "b"}, False),  # two labels, only one holds
    ("role=web,zone=a", {"role": "db", "zone": "a"}, False),
    ("role=web,zone=a", {"role": "web", "zone": "a"}, True),
    ("role!=web", {}, True),
    ("role in (web, db),zone", {"role": "db", "zone": "a"}, True),
    ("role notin (web,db)", {"role": "db"}, False),
    ("!legacy", {"legacy": "1"}, False),
    ("stortune.io/tier=gold", {"stortune.io/tier": "gold"}, True),
    (" role = web , !legacy ", {"role": "web"}, True),
])
def test_matches(text: str, labels: dict[str, str], expected: bool) -> None:
    selector = parse(text)
    assert selector is not None and selector.matches(labels) is expected


def test_empty_selects_everything() -> None:
    assert parse(None) is None and parse("  ") is None


@pytest.mark.parametrize("text", ["role in web", "role in ()", "a=b=c", "role=bad value", "=x", "a,(b)"])
def test_syntax_errors(text: str) -> None:
    with pytest.raises(Invalid) as err:
        parse(text)
    assert err.value.causes[0].field == "labelSelector"


#: Each run is 50 times the 20,000 characters that took the old quadratic expressions 5 and 12 s:
#: 2,500 times as long for them (hours), a fraction of a second for linear ones.
RUN = 1_000_000


@pytest.mark.parametrize("text", [
    "a" * RUN + "=" + " " * RUN + "!",                # two runs of spaces around an empty value
    " " * RUN + "!" + " " * RUN + "a b",              # around the optional '!'
    "a" * RUN + " " * RUN + "in" + " " * RUN,
], ids=["empty-value", "optional-bang", "set"])
def test_hostile_a_long_selector_is_refused_in_linear_time(text: str) -> None:
    """Hostile: the query syntax is also read from request bodies (a baseline's hostSelector), which
    bound it only to the body size. 40,000-character texts like these took 5 and 12 s (quadratic)
    with the GIL held. parse() itself takes any length (the callers bound it: see
    test_benchmark_results), so these are scaled until only linear parsing can finish: the test
    completing is the proof, with no clock to flake on a busy host."""
    with pytest.raises(Invalid) as refused:
        parse(text)
    assert [c.field for c in refused.value.causes] == ["labelSelector"]
    assert len(refused.value.causes[0].message) < 400  # quotes a bounded prefix, not the megabyte


@pytest.mark.parametrize(("part", "quoted"), [
    ("x" * 79 + " y", "(81 characters)"), ("x" * 78 + " y", "x y'"), ("a b", "'a b'")])
def test_an_unparsable_part_is_quoted_whole_up_to_80_characters(part: str, quoted: str) -> None:
    with pytest.raises(Invalid) as refused:
        parse(part)
    assert quoted in refused.value.causes[0].message


def test_selectors_keep_their_meaning_with_spaces_anywhere() -> None:
    selector = parse("  role =  web ,  !  legacy ,tier in ( a , b )  ,  zone  ")
    assert selector is not None
    assert selector.matches({"role": "web", "tier": "a", "zone": "x"})
    assert not selector.matches({"role": "web", "tier": "a", "zone": "x", "legacy": "1"})
