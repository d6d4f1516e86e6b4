"""Sizes in documents: one rule for profiles and BenchmarkSpecs alike.

The rule (docs/profiles.md, "Sizes"), the one of coreutils dd and fio:

* ``KB``, ``MB``, ``GB``, ``TB``, ``PB`` are decimal: powers of 1000;
* ``KiB``, ``MiB``, ``GiB``, ``TiB``, ``PiB`` are binary: powers of 1024;
* a bare letter ``k``, ``M``, ``G``, ``T``, ``P`` is binary: ``4k`` = 4096, ``1G`` = 1 GiB;
* letters in any case, ``B`` optional (``512``, ``512B`` and ``512b`` are 512 bytes);
* a fraction is fine when the bytes come out whole (``1.5GiB``), else refused (``1.3k``).

A size is an integer (bytes) or such a string; nothing else (no float, no bool,
no sign, no exponent, ASCII digits only), at most ``MAX_SIZE`` bytes and
``MAX_SIZE_TEXT`` characters.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any, Final

#: The largest size (bytes) a document may give: what a signed 64-bit integer holds.
MAX_SIZE: Final = 2**63 - 1
#: The longest size text; nothing sensible is longer, and parsing stays cheap.
MAX_SIZE_TEXT: Final = 64
#: Whitespace trimmed around the text (ASCII only: a no-break space is not a separator).
_TRIM: Final = " \t\r\n"

_NUMBER = r"([0-9]+(?:\.[0-9]+)?|\.[0-9]+)"
_SIZE = re.compile(rf"{_NUMBER}[ \t]*(?:([kmgtp])(i?))?(b?)", re.IGNORECASE | re.ASCII)
#: The same syntax for the JSON Schema (editors; the parser above is the judge).
SIZE_PATTERN: Final = (r"^[ \t\r\n]*([0-9]+(\.[0-9]+)?|\.[0-9]+)[ \t]*"
                       r"([kKmMgGtTpP][iI]?)?[bB]?[ \t\r\n]*$")
_EXAMPLE: Final = "4k, 64KiB, 500GB, 1.5TiB or 4096 (bytes)"

_SCALE: Final = {"": 1, "K": 1, "M": 2, "G": 3, "T": 4, "P": 5}


def _bounded(value: int, original: object) -> int:
    if value < 0:
        raise ValueError(f"{original!r} is negative; a size is a number of bytes")
    if value > MAX_SIZE:
        raise ValueError(f"{original!r} is more than {MAX_SIZE} bytes (2**63 - 1)")
    return value


def parse_size(value: object) -> int:
    """An integer number of bytes or a size text ('4k', '1.5GiB', '500GB') -> bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        return _bounded(value, value)
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a size: give bytes as an integer, or text like {_EXAMPLE}")
    if len(value) > MAX_SIZE_TEXT:
        raise ValueError(f"a size is at most {MAX_SIZE_TEXT} characters, got {len(value)}")
    m = _SIZE.fullmatch(value.strip(_TRIM))
    if m is None:
        raise ValueError(f"{value!r} is not a size like {_EXAMPLE}")
    number, letter, binary, _ = m.groups()
    if letter is None:
        base = 1
    else:
        # A bare letter is binary (dd, fio); KB is decimal, KiB binary.
        decimal = bool(m.group(4)) and not binary
        base = (1000 if decimal else 1024) ** _SCALE[letter.upper()]
    exact = Fraction(number) * base  # exact: no float rounding
    if exact.denominator != 1:
        raise ValueError(f"{value!r} is not a whole number of bytes ({float(exact):.1f})")
    return _bounded(int(exact), value)


def format_size(n: int) -> str:
    """Bytes -> the largest exact binary unit: 4096 -> '4KiB', 1536 -> '1536'."""
    for letter in ("P", "T", "G", "M", "K"):
        scale = 1024 ** _SCALE[letter]
        if n and n % scale == 0:
            return f"{n // scale}{letter}iB"
    return str(n)


def json_schema(description: str) -> dict[str, Any]:
    """The JSON Schema of a size field: bytes, or text in the rule's syntax."""
    return {"anyOf": [{"type": "integer", "minimum": 0, "maximum": MAX_SIZE},
                      {"type": "string", "pattern": SIZE_PATTERN, "maxLength": MAX_SIZE_TEXT}],
            "description": description}
