"""The Kubernetes label selector query syntax: ``role=web,tier in (a,b),!legacy``."""

from __future__ import annotations

import re

from pydantic import ValidationError

from stortune.schemas.profile import LabelSelector, SelectorOperator, SelectorRequirement
from stortune.server.errors import Cause, Invalid

#: The longest selector text taken (the labelSelector parameter, a token's and a baseline's selector).
MAX_SELECTOR_TEXT = 4096
# Matched against a part stripped of surrounding spaces, so that no two runs of spaces meet
# around an optional piece: "a=" + 20,000 spaces + "!" backtracked quadratically. Each run of
# spaces here lies between characters it cannot match, so the expressions are linear.
_SET = re.compile(r"([^\s!=(),]+)\s+(in|notin)\s+\(([^()]*)\)")
_EQUALITY = re.compile(r"([^\s!=(),]+)\s*(==|=|!=)\s*([^\s!=(),]*)")
_EXISTS = re.compile(r"(!?)\s*([^\s!=(),]+)")


def _split(text: str) -> list[str]:
    """Split at commas outside parentheses."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return parts


#: An unparsable part is quoted up to this many characters: an error must not echo a megabyte.
_QUOTED = 80


def _quoted(part: str) -> str:
    if len(part) <= _QUOTED:
        return repr(part)
    return f"{part[:_QUOTED]!r}... ({len(part)} characters)"


def parse(text: str | None) -> LabelSelector | None:
    """None (select everything) for an empty selector; Invalid on syntax errors."""
    if text is None or not text.strip():
        return None
    try:
        return parse_text(text)
    except ValueError as exc:
        raise Invalid([Cause("labelSelector", str(exc))]) from None


def parse_text(text: str) -> LabelSelector:
    """A non-empty selector; ValueError saying what is wrong (also for an empty one)."""
    labels: dict[str, str] = {}
    expressions: list[SelectorRequirement] = []
    try:
        for part in (p.strip() for p in _split(text)):
            if m := _SET.fullmatch(part):
                values = [v.strip() for v in m.group(3).split(",") if v.strip()]
                op = SelectorOperator.IN if m.group(2) == "in" else SelectorOperator.NOT_IN
                expressions.append(SelectorRequirement(key=m.group(1), operator=op, values=values))
            elif m := _EQUALITY.fullmatch(part):
                key, op_text, value = m.groups()
                if op_text == "!=":
                    expressions.append(
                        SelectorRequirement(key=key, operator=SelectorOperator.NOT_IN, values=[value]))
                else:
                    labels[key] = value
            elif m := _EXISTS.fullmatch(part):
                op = SelectorOperator.DOES_NOT_EXIST if m.group(1) else SelectorOperator.EXISTS
                expressions.append(SelectorRequirement(key=m.group(2), operator=op))
            else:
                raise ValueError(f"cannot parse {_quoted(part.strip())}: expected key, !key, key=value, "
                                 "key!=value, key in (a,b) or key notin (a,b)")
        return LabelSelector(matchLabels=labels, matchExpressions=expressions)
    except ValidationError as exc:
        raise ValueError("; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())) from None
