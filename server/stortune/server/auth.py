"""Who may do what: roles, permissions, and the principal a bearer token stands for.

Routes declare a ``Permission`` (api/security.py); roles are fixed sets of
permissions, written down once here. A principal is what an accepted token
stands for; a ``support`` principal also carries a host selector and sees
only the hosts it matches.

Token secrets are ``stt_`` and 32 random bytes (urlsafe base64). The database
holds their SHA-256 only. A fast unsalted hash is enough for a secret with
256 bits of entropy: nobody can enumerate candidates, so the slow, salted
hashes that protect human passwords would buy nothing, and they would cost
tens of milliseconds on every request (every agent heartbeat included).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from stortune.schemas.profile import LabelSelector


class Role(StrEnum):
    ADMIN = "admin"
    OPERATOR = "operator"
    VIEWER = "viewer"
    SUPPORT = "support"
    AGENT = "agent"
    # A Prometheus server's scrape token: /metrics and nothing else.
    METRICS = "metrics"


class Permission(StrEnum):
    READ_PROFILES = "read profiles"
    WRITE_PROFILES = "write profiles"
    READ_HOSTS = "read hosts"  # hosts, their status, lease, topology
    LABEL_HOSTS = "label hosts"
    DELETE_HOSTS = "delete hosts"
    READ_EVENTS = "read events"
    READ_DIAGNOSTICS = "download diagnostics"
    # Hostnames, addresses, serials and WWNs in clear, and the token -> value mapping: the
    # customer's own admins only, never a (vendor) support token.
    READ_UNREDACTED_DIAGNOSTICS = "download unredacted diagnostics"
    READ_REDACTIONS = "read the redaction mapping"
    READ_BENCHMARKS = "read benchmarks"
    RUN_BENCHMARKS = "run benchmarks"
    READ_EXPERIMENTS = "read tuning experiments"
    # Experiments change a host's settings trial by trial (and put them back): an operator's call.
    RUN_EXPERIMENTS = "run tuning experiments"
    REPORT_AS_AGENT = "report as an agent"  # register, heartbeat, topology
    # The agent calls for an enrolled host without its host key (services/host_keys.py).
    ACT_FOR_ANY_HOST = "act for any host"
    MANAGE_TOKENS = "manage tokens"
    READ_AUDIT = "read the audit log"
    # Arithmetic over the request alone (RAID planning): reads and stores nothing.
    PLAN_STORAGE = "plan storage"
    # /metrics: fleet conditions and settings, counts of what the control plane did; no secrets.
    READ_METRICS = "read metrics"
    # Exchange the token for a dashboard session cookie (api/sessions.py): the roles people hold.
    USE_DASHBOARD = "sign in to the dashboard"


_P = Permission
_READ = frozenset({_P.READ_PROFILES, _P.READ_HOSTS, _P.READ_EVENTS, _P.READ_BENCHMARKS, _P.READ_EXPERIMENTS,
                   _P.READ_METRICS, _P.USE_DASHBOARD})

#: The one table of who may do what. Admin is everything, the agent calls
#: included (an admin may register a host by hand, for any host); the bootstrap
#: token of agents may do nothing else (but plan storage, which touches no data), and for an
#: enrolled host only with its key.
ROLE_PERMISSIONS: Mapping[Role, frozenset[Permission]] = {
    Role.ADMIN: frozenset(Permission),
    Role.OPERATOR: _READ | {_P.WRITE_PROFILES, _P.LABEL_HOSTS, _P.RUN_BENCHMARKS, _P.RUN_EXPERIMENTS,
                            _P.PLAN_STORAGE},
    Role.VIEWER: _READ | {_P.PLAN_STORAGE},
    Role.SUPPORT: frozenset({_P.READ_HOSTS, _P.READ_EVENTS, _P.READ_DIAGNOSTICS, _P.READ_BENCHMARKS,
                             _P.READ_EXPERIMENTS, _P.PLAN_STORAGE, _P.USE_DASHBOARD}),
    Role.AGENT: frozenset({_P.REPORT_AS_AGENT, _P.PLAN_STORAGE}),
    Role.METRICS: frozenset({_P.READ_METRICS}),
}

#: Roles whose tokens name the hosts they may see (and must expire).
SCOPED_ROLES = frozenset({Role.SUPPORT})


def roles_with(permission: Permission) -> list[Role]:
    return [role for role in Role if permission in ROLE_PERMISSIONS[role]]


@dataclass(frozen=True)
class Principal:
    """Whoever presented an accepted token."""

    token_id: str
    name: str
    role: Role
    #: Only these hosts exist for this principal (support tokens); None: every host.
    hosts: LabelSelector | None = None
    expires_at: datetime | None = None

    def can(self, permission: Permission) -> bool:
        return permission in ROLE_PERMISSIONS[self.role]

    @property
    def scoped(self) -> bool:
        return self.hosts is not None

    def may_see_host(self, labels: Mapping[str, str]) -> bool:
        """Whether a host with these (effective) labels is within this principal's reach."""
        return self.hosts is None or self.hosts.matches(dict(labels))

    def describe(self) -> str:
        return f"token {self.token_id} ({self.name}, role {self.role.value})"


TOKEN_PREFIX = "stt_"  # noqa: S105 - marks secrets (scanners, redaction); not one itself
_SECRET_BYTES = 32
# A secret anywhere in text we keep or log (a path, a query string) is cut out.
_SECRET = re.compile(re.escape(TOKEN_PREFIX) + r"[A-Za-z0-9_-]{8,}")


def new_secret() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(_SECRET_BYTES)


def new_token_id() -> str:
    """The public handle of a token: listed, audited, revoked by; not secret."""
    return secrets.token_hex(6)


def secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def redact(text: str) -> str:
    return _SECRET.sub(TOKEN_PREFIX + "<redacted>", text)
