"""A host's current values as the agent sends them, and their digest.

GetObserved carries the encoded values; the agent also reports their digest on its own
(the heartbeat's ``observed_digest``) whenever it changes, so the control plane learns of
drift without asking every host. Both sides hash the same encoding, here, so an equal
digest means the values the control plane last looked at are still the host's. No gRPC
here: the agent's registration loop imports it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from stortune.schemas.topology import TunableState

#: The digest's length in hex characters (blake2b, 16 bytes).
DIGEST_LENGTH = 32


def encode(observed: Mapping[str, Mapping[str, TunableState]]) -> str:
    """{device: {tunable: state}} as JSON, in the agent's discovery order."""
    return json.dumps({dev: {name: state.model_dump(mode="json") for name, state in tunables.items()}
                       for dev, tunables in observed.items()})


def digest(encoded: str) -> str:
    return hashlib.blake2b(encoded.encode(), digest_size=DIGEST_LENGTH // 2).hexdigest()
