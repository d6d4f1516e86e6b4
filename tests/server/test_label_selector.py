"""The labelSelector query syntax, parsed into the schemas' LabelSelector."""

from __future__ import annotations

import time

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


@pytest.mark.parametrize("text", [
    "a" * 20_000 + "=" + " " * 20_000 + "!",          # two runs of spaces around an empty value
    " " * 20_000 + "!" + " " * 20_000 + "a b",        # around the optional '!'
    "a" * 20_000 + " " * 20_000 + "in" + " " * 20_000,
])
def test_hostile_a_long_selector_is_refused_in_linear_time(text: str) -> None:
    """Hostile: the query syntax is also read from request bodies (a baseline's hostSelector), which
    bound it only to the body size. These 40,000-character texts took 5 and 12 s (quadratic: an
    8 MiB body, days) with the GIL held; refused at once now (the bound is generous)."""
    started = time.monotonic()
    with pytest.raises(Invalid):
        parse(text)
    assert time.monotonic() - started < 1.0


def test_selectors_keep_their_meaning_with_spaces_anywhere() -> None:
    selector = parse("  role =  web ,  !  legacy ,tier in ( a , b )  ,  zone  ")
    assert selector is not None
    assert selector.matches({"role": "web", "tier": "a", "zone": "x"})
    assert not selector.matches({"role": "web", "tier": "a", "zone": "x", "legacy": "1"})
