"""StorageProfile documents as the API serves them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from stortune.schemas.plan import Change, Plan, Rejection
from stortune.server.db.tables import Profile
from stortune.server.models.common import API_VERSION
from stortune.server.models.meta import ListMeta, ObjectMeta, format_resource_version


class ProfileDocument(BaseModel):
    """A stored StorageProfile with server-set metadata and status."""

    apiVersion: Literal["stortune/v1"] = API_VERSION
    kind: Literal["StorageProfile"] = "StorageProfile"
    metadata: ObjectMeta
    spec: dict[str, Any] = Field(description="As validated by the StorageProfile schema, defaults filled")
    status: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def from_row(cls, row: Profile, *, stored: bool = True) -> ProfileDocument:
        """``stored=False`` renders a dry-run object: no uid or resourceVersion was issued."""
        return cls(
            metadata=ObjectMeta(
                name=row.name,
                uid=row.uid if stored else None,
                generation=row.generation,
                resourceVersion=format_resource_version(row.resource_version) if stored else None,
                creationTimestamp=row.created_at,
                deletionTimestamp=row.deletion_timestamp,
                labels=row.labels,
                annotations=row.annotations,
                finalizers=row.finalizers or None,
            ),
            spec=row.spec,
            status=row.status,
        )


class ProfileList(BaseModel):
    apiVersion: Literal["stortune/v1"] = API_VERSION
    kind: Literal["StorageProfileList"] = "StorageProfileList"
    metadata: ListMeta
    items: list[ProfileDocument]


class HostPlan(BaseModel):
    """What the profile, with the other profiles selecting the host, would do there."""

    topologyReported: bool = Field(description="False: the agent has not sent its topology yet")
    changes: list[Change] = Field(default_factory=list)
    rejections: list[Rejection] = Field(default_factory=list)

    @classmethod
    def of(cls, plan: Plan | None) -> HostPlan:
        if plan is None:
            return cls(topologyReported=False)
        return cls(topologyReported=True, changes=plan.changes, rejections=plan.rejections)


class DryRunResult(BaseModel):
    dryRun: Literal[True] = True
    object: ProfileDocument
    plans: dict[str, HostPlan] = Field(description="Per matched host")
