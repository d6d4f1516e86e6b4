"""A correction: a setting stortune had applied, found changed and set back, with its cause.

The control plane's reconciler records the drift it finds and corrects as events and counts
(``stortune_drift_events_total``, ``stortune_correction_events_total``). The agent also sets
settings back on its own: it re-applies its stored desired state when it starts and when the
device graph changes, and by the control plane's next look the value is back, so that drift
was never seen. The agent keeps each such correction and reports it with its heartbeats; the
control plane records it as it records its own. This is the shape both sides agree on; the
words of the events are here too, so an agent's correction reads like the reconciler's.
"""

from __future__ import annotations

import re
from itertools import pairwise
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from stortune.schemas import catalog
from stortune.schemas.profile import NAME_PATTERN
from stortune.schemas.topology import HOST_TARGET, is_device_name

#: Why the value had changed, as far as the agent can tell (a closed set: a metric label).
Cause = Literal["reboot", "runtime"]
#: When the agent set it back: the re-apply at its start, or after a device change.
Trigger = Literal["start", "rescan"]
#: Corrections sent in one heartbeat; more wait for the next.
MAX_BATCH = 64

CAUSES: dict[Cause, str] = {
    "reboot": "reset by a reboot since the agent last ran",
    "runtime": "changed outside stortune",
}
TRIGGERS: dict[Trigger, str] = {
    "start": "at its start",
    "rescan": "after a device change",
}

_WORD = re.compile(r"[\x21-\x7e]{1,64}")


def _reading(value: int | str) -> int | str:
    if isinstance(value, str) and not _WORD.fullmatch(value):
        raise ValueError("a value is a number or a word of 1 to 64 printable characters")
    if isinstance(value, int) and not -(2**63) <= value < 2**64:
        raise ValueError("a number out of the kernel's 64-bit range")
    return value


#: A value as the agent read or wrote it: a number, or a word such as a scheduler name.
Reading = Annotated[int | str, AfterValidator(_reading)]


class Correction(BaseModel):
    """One setting the agent set back on its own."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seq: int = Field(ge=1, le=2**62, description="The agent's own count of its corrections")
    device: str = Field(max_length=128, description="Kernel name, or 'host' for a host-wide tunable")
    device_id: str = Field(min_length=1, max_length=512)
    tunable: str = Field(max_length=64)
    found: Reading | None = Field(description="The value the agent found (None: unreadable)")
    set_to: Reading = Field(description="The value it wrote back: the profile's")
    profile: str = Field(max_length=253, pattern=NAME_PATTERN)
    rule: str = Field(max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    cause: Cause
    trigger: Trigger

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if v != HOST_TARGET and not is_device_name(v):
            raise ValueError(f"{v[:64]!r} is not a kernel block device name")
        return v

    @field_validator("tunable")
    @classmethod
    def _tunable(cls, v: str) -> str:
        if v not in catalog.CATALOG:  # a metric label: only names the catalog holds
            raise ValueError(f"{v[:64]!r} is not a tunable of the catalog")
        return v

    def _where(self) -> str:
        return f"{self.device} {self.tunable}"

    def _source(self, attributed: bool) -> str:
        # Unattributed: the control plane does not apply that rule there; the claim is shown, not believed.
        source = f"{self.profile}/{self.rule}"
        return source if attributed else f"{source}, which this host does not apply"

    def drift_message(self, attributed: bool = True) -> str:
        found = "(unreadable)" if self.found is None else self.found
        return (f"{self._where()} observed {found}, desired {self.set_to} ({self._source(attributed)}):"
                f" {CAUSES[self.cause]}; the agent set it back {TRIGGERS[self.trigger]}")

    def corrected_message(self, attributed: bool = True) -> str:
        return (f"{self._where()} set back to {self.set_to} ({self._source(attributed)})"
                f" by the agent {TRIGGERS[self.trigger]}")


class CorrectionBatch(BaseModel):
    """The corrections an agent has not yet seen recorded, oldest first."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    epoch: str = Field(pattern=r"^[0-9a-f]{16}$",
                       description="Names the agent's sequence: a new one (a new state directory)"
                                   " starts counting again")
    items: list[Correction] = Field(max_length=MAX_BATCH)

    @model_validator(mode="after")
    def _in_order(self) -> CorrectionBatch:
        seqs = [c.seq for c in self.items]
        if any(b <= a for a, b in pairwise(seqs)):
            raise ValueError("items must be in increasing seq order, each seq once")
        return self
