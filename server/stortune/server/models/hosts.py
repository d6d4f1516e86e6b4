"""Host documents: spec is what an operator sets, status what agents and the controller report."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, Field, ValidationError

from stortune.schemas.plan import KERNEL_REFUSED, Plan, Rejection, Source, Value
from stortune.server.db.tables import Host
from stortune.server.db.tables import HostLease as LeaseRow
from stortune.server.models.common import API_VERSION, Labels, RequestModel, check_label_map
from stortune.server.models.meta import ListMeta, ObjectMeta, format_resource_version

ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(BaseModel):
    type: str = Field(description="Ready (= Reachable and Applied and not Drifted), Reachable (lease and "
                                  "agent calls), Applied, Drifted (reconciler)")
    status: ConditionStatus
    reason: str
    message: str = ""
    lastTransitionTime: datetime


#: How a settings-table row's message starts when the value cannot be set there (an error);
#: "skipped: " when the setting does not apply to the device.
REJECTED = "rejected: "


def rejected_profiles(status: Mapping[str, Any]) -> frozenset[str]:
    """The profiles with a value the host cannot set, from a stored status's settings table."""
    return frozenset(str(d.get("profile")) for d in status.get("devices", [])
                     if isinstance(d, dict) and str(d.get("message", "")).startswith(REJECTED))


def rejected_at(status: Mapping[str, Any]) -> frozenset[tuple[str, int | None]]:
    """(profile, generation) of each value the host cannot set: a rollout judges its own
    generation's rejections, not those an earlier generation left in the table."""
    return frozenset((str(d.get("profile")), g if isinstance(g := d.get("generation"), int) else None)
                     for d in status.get("devices", [])
                     if isinstance(d, dict) and str(d.get("message", "")).startswith(REJECTED))


class DeviceSetting(BaseModel):
    """One row of a host's settings table, written by the reconciler."""

    device: str
    deviceId: str
    tunable: str
    desired: int | str | None = None
    observed: int | str | None = None
    inSync: bool | None = Field(default=None, description="None: rejected or skipped (see message)")
    profile: str | None = None
    rule: str | None = None
    mode: Literal["enforce", "audit"] | None = None
    generation: int | None = Field(default=None, description="Of the profile the desired value comes from")
    drifted: bool = Field(default=False, description="Was in sync at this generation, then changed")
    pendingReboot: bool = Field(
        default=False, description="Configured as desired in the RAID controller, which applies it only"
        " at the next boot: in sync, not drift (`effective` is what runs until then)")
    effective: int | str | None = Field(default=None, description="pendingReboot: the value in effect now")
    message: str = ""


def settings_table(raw: Sequence[Any]) -> tuple[DeviceSetting, ...]:
    """A stored settings table; one an older server wrote in another shape is none (started afresh)."""
    try:
        return tuple(DeviceSetting.model_validate(d) for d in raw)
    except ValidationError:
        return ()


def same_want(row: DeviceSetting, source: Source, desired: Value) -> bool:
    """``row`` was written for this want: the same profile, generation and value."""
    return (row.profile, row.generation, row.desired) == (source.profile, source.generation, desired)


def rebooted(checked_boot_id: str | None, boot_id: str | None) -> bool:
    """The host booted since its settings were last checked (both boot ids known, and different)."""
    return bool(checked_boot_id) and bool(boot_id) and boot_id != checked_boot_id


def holding_kernel_refusals(plan: Plan, table: Iterable[DeviceSetting], *, rebooted: bool) -> Plan:
    """``plan`` with the settings the agent last reported the kernel refusing when written (the
    planner cannot know those; ``table``: the host's stored settings) held as errors while wanted
    the same way (profile, generation, value): the agent would only report them again (it
    remembers them until the value, the device or what they are coupled to changes), so neither
    the reconciler nor a dry run counts them as changes. A reboot ends what the agent remembers."""
    if rebooted:
        return plan
    last = {(d.deviceId, d.tunable): d for d in table}
    held: list[Rejection] = []
    for want in plan.desired:
        row = last.get((want.device_id, want.tunable))
        # (a setting blocked by a refused one it depends on names that refusal too)
        if (want.in_sync or row is None or not row.message.startswith(REJECTED)
                or KERNEL_REFUSED not in row.message or not same_want(row, want.source, want.desired)):
            continue
        held.append(Rejection(device=want.device, device_id=want.device_id, tunable=want.tunable,
                              value=want.desired, reason=row.message.removeprefix(REJECTED), fatal=True,
                              source=want.source))
    return plan.holding(held)


class HostSpec(BaseModel):
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Set through the API; win over the agent's reported labels for the same key")
    address: str = Field(description="Agent gRPC endpoint, host:port")


class HostStatus(BaseModel):
    conditions: list[Condition] = Field(default_factory=list)
    devices: list[DeviceSetting] = Field(default_factory=list)
    appliedGenerations: dict[str, int] = Field(default_factory=dict)
    reportedLabels: dict[str, str] = Field(default_factory=dict)
    facts: dict[str, Any] = Field(default_factory=dict)
    bootId: str | None = None
    checkedBootId: str | None = Field(
        default=None, description="Boot id at the reconciler's last successful look at the agent; "
        "drift seen under another boot id is blamed on the reboot")
    appliedBootId: str | None = Field(default=None, description="Boot id at the last successful apply")
    refusedGenerations: dict[str, int] | None = Field(
        default=None, description="Profile generations the agent refused; not sent again until they change")
    topologyHash: str | None = None
    registeredAt: datetime

    @classmethod
    def from_row(cls, row: Host) -> HostStatus:
        return cls(
            conditions=row.status.get("conditions", []),
            devices=row.status.get("devices", []),
            appliedGenerations=row.applied_generations,
            reportedLabels=row.reported_labels,
            facts=row.facts,
            bootId=row.boot_id,
            checkedBootId=row.status.get("checkedBootId"),
            appliedBootId=row.status.get("appliedBootId"),
            refusedGenerations=row.status.get("refusedGenerations"),
            topologyHash=row.topology_hash,
            registeredAt=row.registered_at,
        )


class HostLease(BaseModel):
    """The agent's lease, renewed by every heartbeat.

    Kept out of the host document on purpose (as Kubernetes moved node
    heartbeats into Lease objects): a heartbeat changes only this, so the host
    documents stay unchanged, and cheap to serve, while a fleet is idle.
    """

    apiVersion: Literal["stortune/v1"] = API_VERSION
    kind: Literal["HostLease"] = "HostLease"
    name: str
    renewTime: datetime = Field(description="The last heartbeat")
    expireTime: datetime = Field(description="Unreachable after this without another heartbeat")
    expired: bool = Field(description="The lease ran out and no heartbeat has renewed it since")

    @classmethod
    def from_row(cls, row: LeaseRow, expired: bool) -> HostLease:
        return cls(name=row.name, renewTime=row.renew_time, expireTime=row.expire_time, expired=expired)


class HostDocument(BaseModel):
    apiVersion: Literal["stortune/v1"] = API_VERSION
    kind: Literal["Host"] = "Host"
    metadata: ObjectMeta = Field(description="labels: the effective labels profiles select on")
    spec: HostSpec
    status: HostStatus

    @classmethod
    def from_row(cls, row: Host) -> HostDocument:
        return cls(
            metadata=ObjectMeta(
                name=row.name,
                uid=row.uid,
                resourceVersion=format_resource_version(row.resource_version),
                creationTimestamp=row.registered_at,
                labels=row.effective_labels,
            ),
            spec=HostSpec(labels=row.labels, address=row.address),
            status=HostStatus.from_row(row),
        )


class HostList(BaseModel):
    apiVersion: Literal["stortune/v1"] = API_VERSION
    kind: Literal["HostList"] = "HostList"
    metadata: ListMeta
    items: list[HostDocument]


class LabelsReplace(RequestModel):
    labels: Labels


def _set_values_valid(labels: dict[str, str | None]) -> dict[str, str | None]:
    check_label_map({k: v for k, v in labels.items() if v is not None})
    return labels


class LabelsMerge(RequestModel):
    """JSON merge patch of the API-set labels: a null value removes the key."""

    labels: Annotated[dict[str, str | None], Field(max_length=64), AfterValidator(_set_values_valid)]
