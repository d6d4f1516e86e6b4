"""The one retry rule the agent and the control plane share."""

from __future__ import annotations

from stortune.schemas import backoff


def test_the_delay_doubles_per_failure_up_to_the_cap() -> None:
    assert [backoff.ceiling(n, 0.5, 4.0) for n in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert backoff.ceiling(10**9, 1.0, 60.0) == 60.0  # no overflow however long it failed
    assert backoff.ceiling(-3, 1.0, 60.0) == 1.0


def test_jitter_only_shortens() -> None:
    assert backoff.shortened(3, 1.0, 60.0, 0.2, 0.0) == 8.0
    assert backoff.shortened(3, 1.0, 60.0, 0.2, 0.5) == 8.0 * 0.9
