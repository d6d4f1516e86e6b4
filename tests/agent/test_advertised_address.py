"""The address the agent advertises is a host and a port it could be dialled at, or it does not start.

An address with control characters went into the control plane's log and events raw; the
control plane refuses it now (tests/server/test_hosts_api.py), and the agent refuses to send it.
"""

from __future__ import annotations

import pytest

from stortune.agent.serve import ServeError, advertised_address


@pytest.mark.parametrize("advertise", [
    "evil\u001b[2J\u001b[H:6", "h1\n2026-01-01 INFO forged:7443", "h1 .example:7443", "h\u00e9.example:0",
    "::1:7443", "h1.example:99999", "h1.example", "x" * 300 + ":1"])
def test_hostile_advertised_addresses_stop_the_agent_saying_what_to_give(advertise: str) -> None:
    with pytest.raises(ServeError) as refused:
        advertised_address("127.0.0.1:7443", advertise)
    message = str(refused.value)
    assert "--advertise" in message and "HOST:PORT" in message
    assert "\u001b" not in message and "\n" not in message  # the refusal is printable too


def test_hostile_a_listen_host_that_is_no_address_is_not_advertised() -> None:
    with pytest.raises(ServeError):
        advertised_address("bad\u0007host:7443", None)


@pytest.mark.parametrize(("bound", "advertise", "expected"), [
    ("127.0.0.1:7443", "agent1.example:7443", "agent1.example:7443"),
    ("127.0.0.1:40001", "agent1.example:0", "agent1.example:40001"),
    ("[::1]:7443", None, "[::1]:7443"),
    ("10.1.2.3:7443", "[2001:db8::7]:7443", "[2001:db8::7]:7443")])
def test_addresses_a_host_has_are_advertised(bound: str, advertise: str | None, expected: str) -> None:
    assert advertised_address(bound, advertise) == expected
