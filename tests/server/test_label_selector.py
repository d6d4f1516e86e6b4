"""The labelSelector query syntax, parsed into the schemas' LabelSelector."""

from __future__ import annotations

import pytest

from stortune.server.api.label_selector import parse
from stortune.server.errors import Invalid


@pytest.mark.parametrize(("text", "labels", "expected"), [
    ("role=web", {"role": "web"}, True),
    ("role==web", {"role": "db"}, False),
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
