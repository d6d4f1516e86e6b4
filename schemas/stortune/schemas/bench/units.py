"""Human-friendly quantities in benchmark documents: sizes, durations, rates, latencies.

Canonical units (what the models hold and results carry): bytes, seconds for
durations, bytes/s for bandwidth, I/O per second, microseconds for latency.

* Sizes follow the one rule of every document (``stortune.schemas.sizes``): ``4k`` =
  ``4KiB`` = 4096 bytes, ``4KB`` = 4000, ``1M`` = 1 MiB. A bare number is bytes.
* Rates follow the datasheet convention: ``MB/s`` is 10^6 bytes/s, ``MiB/s``
  2^20 bytes/s. A lower-case ``b`` means bits and is refused rather than guessed.
* Durations: ``500ms``, ``30s``, ``2m``, ``1h``; a bare number is seconds (fio's unit).
* Latencies: ``20ms``, ``500us``; a bare number is microseconds (the unit results use).
* I/O rates: ``25000``, ``25k``, ``1.2M`` (decimal: these are counts).

Texts are at most ``MAX_TEXT`` characters, trimmed, and read with ASCII digits
only, by expressions with no two ways to match one input: parsing costs a
bounded number of steps whatever a document holds.
"""

from __future__ import annotations

import math
import re

from stortune.schemas.sizes import format_size, parse_size

__all__ = ["format_size", "parse_count_rate", "parse_duration", "parse_latency", "parse_rate",
           "parse_size"]

#: The longest quantity text read.
MAX_TEXT = 64
_TRIM = " \t\r\n"
_NUM = r"([0-9]+(?:\.[0-9]+)?|\.[0-9]+)"
_FLAGS = re.IGNORECASE | re.ASCII
_RATE = re.compile(rf"{_NUM}[ \t]*([kmgt]?)(i?)([bB])[ \t]*/[ \t]*s(?:ec)?", _FLAGS)
_COUNT = re.compile(rf"{_NUM}[ \t]*(?:([km])[ \t]*)?(?:iops|/s)?", _FLAGS)
_TIME = re.compile(rf"{_NUM}[ \t]*(ns|us|µs|ms|s|sec|m|min|h)?", re.IGNORECASE)

_BINARY = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_DECIMAL = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0,
            "m": 60.0, "min": 60.0, "h": 3600.0}


def _number(value: object, what: str, example: str) -> float | None:
    """The value itself when it is already a number (bool is not)."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not {what} like {example}")
    if isinstance(value, int | float):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{value!r} is not {what} like {example}")
        return float(value)
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise ValueError(f"{value!r:.80} is not {what} like {example}")
    return None


def parse_rate(value: object) -> float:
    """'386MB/s', '1.2GiB/s', 5e8 -> bytes per second."""
    number = _number(value, "a bandwidth", "386MB/s")
    if number is not None:
        return number
    m = _RATE.fullmatch(str(value).strip(_TRIM))
    if not m:
        raise ValueError(f"{value!r} is not a bandwidth like 386MB/s, 1.2GiB/s or 500000000 (bytes/s)")
    if m.group(4) == "b":
        raise ValueError(f"{value!r}: a lower-case b means bits; write bytes as B (386MB/s)")
    prefix = m.group(2).upper()
    scale = _BINARY[prefix] if m.group(3) else _DECIMAL[prefix]
    return float(m.group(1)) * scale


def parse_count_rate(value: object) -> float:
    """'25k', '1.2M', 25000 -> I/O per second (decimal multiples)."""
    number = _number(value, "an I/O rate", "25000 or 25k")
    if number is not None:
        return number
    m = _COUNT.fullmatch(str(value).strip(_TRIM))
    if not m:
        raise ValueError(f"{value!r} is not an I/O rate like 25000, 25k or 1.2M")
    return float(m.group(1)) * _DECIMAL[(m.group(2) or "").upper()]


def _time(value: object, default_unit: str, what: str, example: str) -> float:
    number = _number(value, what, example)
    if number is not None:
        return number * _SECONDS[default_unit]
    m = _TIME.fullmatch(str(value).strip(_TRIM))
    if not m:
        raise ValueError(f"{value!r} is not {what} like {example}")
    unit = (m.group(2) or default_unit).lower()
    return float(m.group(1)) * _SECONDS[unit]


def parse_duration(value: object) -> float:
    """'30s', '500ms', '2m', 30 -> seconds."""
    return _time(value, "s", "a duration", "30s, 500ms, 2m or 30 (seconds)")


def format_duration(seconds: float) -> str:
    """Seconds -> '30s' or '1500ms' (exact to the millisecond)."""
    ms = round(seconds * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def parse_latency(value: object) -> float:
    """'20ms', '500us', 800 -> microseconds."""
    return _time(value, "us", "a latency", "20ms, 500us or 800 (microseconds)") * 1e6


# -- display only (results tables): not meant to be parsed back exactly ---------------
def human_bytes_per_s(value: float) -> str:
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B/s"


def human_count(value: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.1f}{unit}"
    return f"{value:.0f}"


def human_latency_us(value: float) -> str:
    if abs(value) >= 1e6:
        return f"{value / 1e6:.2f} s"
    if abs(value) >= 1e3:
        return f"{value / 1e3:.2f} ms"
    return f"{value:.0f} µs"
