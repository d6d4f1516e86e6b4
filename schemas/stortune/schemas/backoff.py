"""Retry delays, one rule for the agent and the control plane: the delay doubles with each
failure up to a cap, and is randomised so that hosts failing together do not retry together.
Pure: the caller draws the random number, so tests choose it."""

from __future__ import annotations


def ceiling(failures: int, base: float, cap: float) -> float:
    """``base`` doubled once per earlier failure, at most ``cap`` (``failures`` >= 0)."""
    return min(cap, base * 2.0 ** min(max(failures, 0), 64))


def shortened(failures: int, base: float, cap: float, jitter: float, draw: float) -> float:
    """The ceiling shortened by up to ``jitter`` (a fraction) for ``draw`` in [0, 1)."""
    return ceiling(failures, base, cap) * (1 - jitter * draw)
