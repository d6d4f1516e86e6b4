"""Host keys: how an agent proves that a call for an enrolled host comes from that host.

The agents' bootstrap token is shared by the whole fleet, so it can only say
"some agent of ours". Each agent therefore keeps a secret of its own, the host
key (made at its first start, kept in its state directory: agent/hostkey.py),
and sends it with every call in the ``X-Stortune-Host-Key`` header. The first
registration of a name pins the key's SHA-256 on the host; from then on a
registration (409), heartbeat or topology upload (403) or certificate request
(409) for that name must present the same key, unless the caller's role may
act for any host (admin). Deleting the host deletes the pin with it, so the
name can enroll again.

A host registered before keys existed has no pin: its next registration pins
the key it presents, and until then its calls are accepted as before.

The database holds the digest only, as for tokens: the key is 256 random bits,
so a fast unsalted hash is enough, and a copy of the database does not let
anyone act as the host.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass, field

from stortune.api.agent import HOST_KEY_HEADER
from stortune.server.errors import Cause, Conflict, Forbidden, Invalid

#: Where a refusal points: the header, as FastAPI names a header parameter.
FIELD = f"header.{HOST_KEY_HEADER}"
MAX_LENGTH = 256
# What may be pinned: the agent's keys are 43 characters of urlsafe base64 (256 bits).
_PINNABLE = re.compile(r"[A-Za-z0-9_-]{32,256}")
_WHAT_TO_DO = ("if this is a new machine taking over the name, an admin deletes the host "
               "(DELETE /api/v1/hosts/{name}) so that it can enroll; if it is the same machine, "
               "restore its agent's state directory, which holds the key")


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class Proof:
    """What a call shows of the host's identity: the key it presents (never logged), and whether
    the caller's role may act for any host without it."""

    key: str | None = field(repr=False)
    any_host: bool = False

    def proves(self, pinned: str | None) -> bool:
        """Whether the call may act for a host with this pin; None: not pinned (a legacy host)."""
        if self.any_host or pinned is None:
            return True
        if self.key is None or len(self.key) > MAX_LENGTH:
            return False
        return hmac.compare_digest(digest(self.key), pinned)

    def pin(self, name: str) -> str | None:
        """The digest to pin for a host this call enrolls (None: an admin without a key).

        Invalid (422) when an agent sends no key, or one too short to be a secret.
        """
        if self.key is None:
            if self.any_host:
                return None
            raise Invalid([Cause(FIELD, "required: an agent enrolls a host with its own key "
                                        "(stortune-agent sends one; upgrade the agent)")],
                          kind="Host", name=name)
        if not _PINNABLE.fullmatch(self.key):
            raise Invalid([Cause(FIELD, "a host key is 32 to 256 characters of A-Z, a-z, 0-9, '-' "
                                        "and '_'")], kind="Host", name=name)
        return digest(self.key)


def _problem(proof: Proof) -> str:
    return "missing" if proof.key is None else "does not match the key pinned when the host enrolled"


def taken(name: str, proof: Proof) -> Conflict:
    """The answer to a registration or certificate request for an enrolled host without its key."""
    return Conflict(f"host {name!r} is enrolled with another host key: only its own agent or an admin "
                    f"may register it again; {_WHAT_TO_DO.format(name=name)}",
                    kind="Host", name=name, causes=[Cause(FIELD, _problem(proof))])


def forbidden(name: str, proof: Proof, call: str) -> Forbidden:
    """The answer to a heartbeat or topology upload for an enrolled host without its key."""
    return Forbidden(f"a {call} for host {name!r} must carry the key the host enrolled with "
                     f"({HOST_KEY_HEADER}); {_WHAT_TO_DO.format(name=name)}",
                     kind="Host", name=name, causes=[Cause(FIELD, _problem(proof))])
