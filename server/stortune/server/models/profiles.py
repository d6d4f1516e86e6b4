"""StorageProfile documents as the API serves them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from stortune.schemas.plan import Change, Plan, Rejection, Restoration
from stortune.server.db.tables import Profile
from stortune.server.models.common import API_VERSION, Name, RequestModel
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
    """What the host would do with the profiles selecting it once the request took effect."""

    topologyReported: bool = Field(description="False: the agent has not sent its topology yet")
    changes: list[Change] = Field(default_factory=list)
    restorations: list[Restoration] = Field(
        default_factory=list,
        description="Values put back because no profile wants them any more (known from the originals "
                    "the agent reports)")
    rejections: list[Rejection] = Field(default_factory=list)

    @classmethod
    def of(cls, plan: Plan | None) -> HostPlan:
        if plan is None:
            return cls(topologyReported=False)
        return cls(topologyReported=True, changes=plan.changes, restorations=plan.restorations,
                   rejections=plan.rejections)


class DryRunResult(BaseModel):
    dryRun: Literal[True] = True
    object: ProfileDocument
    plans: dict[str, HostPlan] = Field(
        description="Per host the profile selects, selected before, or last applied there")


class PlanRequest(RequestModel):
    """Profiles as they would be stored (created or replaced) and names as they would be deleted,
    all at once: what ``stortune diff`` and ``apply --dry-run`` ask for a set of files."""

    apiVersion: Literal["stortune/v1"] = API_VERSION
    kind: Literal["PlanRequest"] = "PlanRequest"
    profiles: list[dict[str, Any]] = Field(
        default_factory=list, max_length=1000,
        description="StorageProfile documents, validated as a create or replace would")
    delete: list[Name] = Field(default_factory=list, max_length=1000,
                              description="Names of stored profiles, planned as deleted")


class PlanResult(BaseModel):
    dryRun: Literal[True] = True
    plans: dict[str, HostPlan] = Field(
        description="Per host any of the profiles selects (new or stored version) or last applied there")
