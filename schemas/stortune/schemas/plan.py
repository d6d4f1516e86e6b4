"""What the planner decides: plain data shared by agent, server and CLI."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from stortune.schemas.topology import DeviceKind

Value = int | str


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Source(_Model):
    """Where a desired value comes from."""

    profile: str
    rule: str
    priority: int = 0
    generation: int | None = None
    mode: Literal["enforce", "audit"] = "enforce"


class Change(_Model):
    """Set ``tunable`` on ``device`` from ``current`` to ``desired``."""

    device: str = Field(description="Kernel name, or 'host' for host-wide tunables")
    device_id: str
    kind: DeviceKind
    tunable: str
    current: Value | None
    desired: Value
    source: Source


class Restoration(_Model):
    """Put back a value stortune changed that no profile wants any more.

    ``to="original"``: the value before stortune first changed it, which is then
    forgotten. ``to="cause"``: a setting was removed while a change that resets
    it (``cause``, e.g. the scheduler for nr_requests) is still wanted; it goes
    back to what that change left, and its original is kept for when the cause goes.
    """

    device: str = Field(description="Kernel name, or 'host' for host-wide tunables")
    device_id: str
    tunable: str
    current: Value | None
    desired: Value = Field(description="The value put back")
    to: Literal["original", "cause"] = "original"
    cause: str | None = Field(default=None, description="to=cause: the tunable whose write left `desired`")


#: How the reason of a value the kernel refused when written starts (found by the agent's write,
#: not by the planner): the agent then plans it as an error until the value, the device or what
#: the value is coupled to changes, and the control plane does not ask for it again meanwhile.
KERNEL_REFUSED = "the kernel refused it: "


class Rejection(_Model):
    device: str
    device_id: str
    tunable: str
    value: Value
    reason: str
    fatal: bool = Field(description="True: an error, the setting (and those depending on it) cannot"
                                    " be set here and the others are applied; False: does not apply"
                                    " here, skipped")
    source: Source


class Desired(_Model):
    """The winning value for one (device, tunable), whether or not it is in sync."""

    device: str
    device_id: str
    tunable: str
    desired: Value
    observed: Value | None
    in_sync: bool
    source: Source
    overridden: list[str] = Field(default_factory=list, description="Losing rules and why")
    note: str | None = Field(default=None, description="What the value costs, e.g. a stripe cache's RAM")
    pending_reboot: bool = Field(
        default=False, exclude_if=lambda v: not v,
        description="Configured as desired, in effect only after the next reboot (a controller"
                    " setting): in sync, not drift")
    effective: Value | None = Field(default=None, exclude_if=lambda v: v is None,
                                    description="pending_reboot: the value in effect until then")


class RuleVerdict(_Model):
    """Did a rule match a device, and if not, why not."""

    profile: str
    rule: str
    matched: bool
    reason: str


class DeviceExplanation(_Model):
    device: str
    device_id: str
    kind: DeviceKind
    rules: list[RuleVerdict] = Field(default_factory=list)


class Plan(_Model):
    changes: list[Change] = Field(default_factory=list, description="In application order")
    restorations: list[Restoration] = Field(
        default_factory=list,
        description="Values put back because no profile wants them any more; made before the changes",
    )
    rejections: list[Rejection] = Field(default_factory=list)
    desired: list[Desired] = Field(default_factory=list)
    explanations: list[DeviceExplanation] = Field(default_factory=list)

    @property
    def fatal(self) -> list[Rejection]:
        """The errors: settings that cannot be set (each blocks itself and its dependants only)."""
        return [r for r in self.rejections if r.fatal]

    @property
    def empty(self) -> bool:
        """Nothing would change: no setting to make (audit ones included) and none to put back."""
        return not self.changes and not self.restorations

    def holding(self, errors: Iterable[Rejection]) -> Plan:
        """This plan with ``errors``' settings held as errors: no longer wanted or changed here."""
        held = {(r.device_id, r.tunable): r for r in errors}
        if not held:
            return self
        return self.model_copy(update={
            "desired": [d for d in self.desired if (d.device_id, d.tunable) not in held],
            "changes": [c for c in self.changes if (c.device_id, c.tunable) not in held],
            "rejections": [*self.rejections, *held.values()],
        })

    def enforced(self) -> Plan:
        """The same plan without the changes that audit-mode profiles only report
        (restorations are made whatever the mode: no profile wants those values)."""
        return self.model_copy(
            update={"changes": [c for c in self.changes if c.source.mode == "enforce"]}
        )
