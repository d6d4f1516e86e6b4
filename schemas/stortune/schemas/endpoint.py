"""An agent's address as the control plane dials it: a host and a port, nothing else.

An address is written into the server's log, the host's events and the dashboard, so it
must be printable and bounded: one holding ``\\x1b[2J`` cleared the operator's terminal,
one holding a newline forged a log line. The host is a DNS name, an IPv4 address or a
bracketed IPv6 literal (a zone after ``%`` allowed); the port is 1 to 65535. The agent
checks what it is about to advertise and the control plane checks what it receives.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Final

#: 253 characters of a DNS name, the brackets of an IPv6 literal, ':' and five digits.
MAX_LENGTH: Final = 261
MAX_HOST_NAME: Final = 253
#: A DNS label, with '_' accepted as resolvers do (``web_1.local``); no leading or trailing '-'.
_LABEL: Final = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_PORT: Final = re.compile(r"[0-9]{1,5}")
#: What an IPv6 zone (an interface name) may hold.
_ZONE: Final = re.compile(r"[A-Za-z0-9_.-]{1,64}")
USAGE: Final = ("HOST:PORT, the host a DNS name, an IPv4 address or an IPv6 address in brackets, "
                "the port 1 to 65535 (e.g. host1.example:7443 or [2001:db8::1]:7443)")


def split_endpoint(value: str) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port), brackets of an IPv6 literal removed; ValueError saying
    what is wrong, with the offending text escaped (never echoed raw)."""
    if len(value) > MAX_LENGTH:
        raise ValueError(f"{len(value)} characters, at most {MAX_LENGTH}: {USAGE}")
    bad = next((c for c in value if not (c.isascii() and c.isprintable()) or c.isspace()), None)
    if bad is not None:
        raise ValueError(f"holds {bad!a}, not a printable character of an address: {USAGE}")
    host, sep, port = value.rpartition(":")
    if not sep or not _PORT.fullmatch(port) or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r} has no port 1 to 65535 after its last ':': {USAGE}")
    if host.startswith("[") and host.endswith("]"):
        return _ipv6(host[1:-1], value), int(port)
    if ":" in host:
        raise ValueError(f"{value!r}: an IPv6 address goes in brackets: {USAGE}")
    labels = host.split(".")
    if not host or len(host) > MAX_HOST_NAME or not all(_LABEL.fullmatch(label) for label in labels):
        raise ValueError(f"{value!r}: {host!r} is not a host name or an IP address: {USAGE}")
    return host, int(port)


def _ipv6(literal: str, value: str) -> str:
    address, _, zone = literal.partition("%")
    try:
        ipaddress.IPv6Address(address)
    except ValueError:
        raise ValueError(f"{value!r}: {literal!r} in brackets is not an IPv6 address: {USAGE}") from None
    if "%" in literal and not _ZONE.fullmatch(zone):
        raise ValueError(f"{value!r}: {zone!r} is not an interface name: {USAGE}")
    return literal


def check_endpoint(value: str) -> str:
    """``value`` if it is an address (``split_endpoint``); for validators."""
    split_endpoint(value)
    return value
