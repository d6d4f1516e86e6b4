"""Patterns people write in documents: regular expressions and globs.

A pattern in a stored profile is matched against every device of every host on
every pass, by the control plane and by the agents, so no pattern may cost more
than a bounded multiple of the text it reads. Python's ``re`` backtracks: one
``(.*.*)*X`` takes seconds against a 16-character disk model and doubles with
each character, and 1,000 open parentheses overflow its parser's stack. So:

* regular expressions are RE2's syntax, compiled and run by RE2, which matches
  in time linear in the text (no backreferences, no lookaround, counted
  repetition up to 1000, and a program of at most ``MAX_PROGRAM_BYTES``);
* globs (``sd*``, ``nvme?n[0-9]``) are translated to RE2 as well;
* both are at most ``MAX_PATTERN_LENGTH`` characters long and always match the
  whole value.

A pattern that cannot be used is a ``PatternError`` (a ``ValueError``) saying
why; document validators turn it into an error naming the field.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Final, cast

#: Characters in one pattern (regular expression or glob); JSON Schema maxLength.
MAX_PATTERN_LENGTH: Final = 256
#: Memory RE2 may use for one compiled pattern (its program and match cache).
#: A pattern that needs more is refused; matching falls back to RE2's NFA when its
#: DFA cache fills, which stays linear. Compiling costs time (holding the GIL) and
#: memory in proportion: at 1 MiB one 20-character pattern (``\pL{55}``) took
#: ~35 ms and kept ~400 KiB, and a profile holds 768 regular expressions. 64 KiB
#: takes every realistic model, vendor or driver expression (``.{0,64}``,
#: ``(?i)[a-z0-9 ._-]{1,40}``, alternations of vendor names) at ~2 ms and ~36 KiB.
MAX_PROGRAM_BYTES: Final = 1 << 16
#: Compiled patterns kept (least recently used go first).
_CACHE_SIZE: Final = 1024

_Matcher = Callable[[str], Any]


class PatternError(ValueError):
    """A pattern that cannot be compiled, with the reason in words."""


def _re2() -> Any:
    # Imported at the first pattern, not with the documents: a serving agent whose
    # profiles match by kind, role or size never pays RE2's libraries (about 1 MiB resident).
    import re2

    return re2


def _options() -> Any:
    options = _re2().Options()
    options.max_mem = MAX_PROGRAM_BYTES
    options.log_errors = False  # RE2 would print every refused pattern on stderr
    return options


def _reason(exc: Exception) -> str:
    """RE2's message ("missing ): (((((...") with the quoted pattern shortened."""
    raw = exc.args[0] if exc.args else str(exc)
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    what, sep, fragment = text.partition(": ")
    if sep and len(fragment) > 40:
        fragment = fragment[:40] + "..."
    return f"{what}: {fragment}" if sep else what


def _compile(expression: str, what: str) -> _Matcher:
    engine = _re2()
    try:
        compiled = engine.compile(expression, _options())
    except engine.error as exc:
        raise PatternError(f"not a {what} RE2 can run: {_reason(exc)} (see Patterns in docs/profiles.md)"
                           ) from None
    return cast(_Matcher, compiled.fullmatch)


def _bounded(pattern: str, what: str) -> None:
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise PatternError(f"the {what} has {len(pattern)} characters; at most {MAX_PATTERN_LENGTH}")
    if "\x00" in pattern:
        raise PatternError(f"a {what} cannot hold a NUL character")


# Compiled once per pattern: a stored profile's patterns meet every device on every pass.
# Refusals are not cached (lru_cache keeps no exception); they cost one bounded compile.
@functools.lru_cache(maxsize=_CACHE_SIZE)
def _regex(pattern: str) -> _Matcher:
    _bounded(pattern, "regular expression")
    return _compile(pattern, "regular expression")


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _glob(glob: str) -> _Matcher:
    _bounded(glob, "glob")
    return _compile(glob_regex(glob), "glob")


def check_regex(pattern: str) -> str:
    """``pattern`` if RE2 can run it within the bounds, else PatternError."""
    _regex(pattern)
    return pattern


def regex_matches(pattern: str, text: str) -> bool:
    """Does ``pattern`` match the whole of ``text``? (PatternError if it is not a valid one.)"""
    return _regex(pattern)(text) is not None


def runs_on_re2(pattern: str, *, glob: bool = False) -> bool:
    """Is ``pattern`` (a regular expression, or a glob) matched by RE2, the guarantee of
    linear time? For tests."""
    owner = getattr((_glob if glob else _regex)(pattern), "__self__", None)
    return bool(type(owner).__module__ == _re2().__name__)


# -- globs ------------------------------------------------------------------------------
def _literal(char: str) -> str:
    """One character as RE2 reads it literally, inside or outside a class."""
    return char if char.isascii() and char.isalnum() else f"\\x{{{ord(char):x}}}"


def _bracket(glob: str, start: int) -> tuple[str, int] | None:
    """The class opened by ``glob[start] == '['`` as RE2 and the index after it, or None
    when it is not closed (then the '[' is literal, as in the shell and fnmatch).

    Shell rules: ``!`` first negates; a ``]`` right after ``[`` or ``[!`` is a member;
    ``a-z`` is a range (one with its ends reversed matches nothing); a ``-`` first or
    last is a member; everything else, backslash included, stands for itself.
    """
    i = start + 1
    negate = i < len(glob) and glob[i] == "!"
    i += negate
    first = i
    items: list[tuple[str, str]] = []
    while i < len(glob):
        char = glob[i]
        if char == "]" and i > first:
            break
        if i + 2 < len(glob) and glob[i + 1] == "-" and glob[i + 2] != "]":
            items.append((char, glob[i + 2]))
            i += 3
        else:
            items.append((char, char))
            i += 1
    else:
        return None
    members = "".join(_literal(lo) if lo == hi else f"{_literal(lo)}-{_literal(hi)}"
                      for lo, hi in items if lo <= hi)
    if not members:
        return ("(?s:.)" if negate else "[^\\x{0}-\\x{10ffff}]"), i + 1
    return f"[{'^' if negate else ''}{members}]", i + 1


def glob_regex(glob: str) -> str:
    """The RE2 expression matching exactly what ``glob`` matches (``*``, ``?``, ``[...]``)."""
    out: list[str] = []
    i = 0
    while i < len(glob):
        char = glob[i]
        if char == "*":
            if not out or out[-1] != "(?s:.*)":  # ** is *
                out.append("(?s:.*)")
            i += 1
        elif char == "?":
            out.append("(?s:.)")
            i += 1
        elif char == "[" and (found := _bracket(glob, i)) is not None:
            out.append(found[0])
            i = found[1]
        else:
            out.append(_literal(char))
            i += 1
    return "".join(out)


def check_glob(glob: str) -> str:
    """``glob`` if it is within the bounds, else PatternError."""
    _glob(glob)
    return glob


def glob_matches(glob: str, text: str) -> bool:
    """Does ``glob`` match the whole of ``text``? Case-sensitive; '/' is not special."""
    return _glob(glob)(text) is not None
