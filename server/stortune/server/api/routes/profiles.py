"""/api/v1/profiles: StorageProfile documents."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Response, status

from stortune.server.api import label_selector
from stortune.server.api.deps import DocumentDep, NowDep, ProfileName, SessionDep
from stortune.server.api.openapi import BAD_REQUEST, CONFLICT, NOT_FOUND, PROFILE_BODY
from stortune.server.db.tables import Profile
from stortune.server.models.meta import ListMeta, format_resource_version
from stortune.server.models.profiles import DryRunResult, HostPlan, ProfileDocument, ProfileList
from stortune.server.services import profiles
from stortune.server.services.profiles import HostPlans

router = APIRouter(prefix="/profiles", tags=["profiles"])

DryRun = Annotated[Literal["All"] | None, Query(
    alias="dryRun", description="All: validate and return the per-host plan; store nothing")]
Selector = Annotated[str | None, Query(
    alias="labelSelector", max_length=4096, description="e.g. team=storage,tier in (a,b),!legacy")]


def _dry_run(row: Profile, plans: HostPlans, *, stored: bool) -> DryRunResult:
    return DryRunResult(
        object=ProfileDocument.from_row(row, stored=stored),
        plans={host: HostPlan.of(plan) for host, plan in plans.items()},
    )


@router.get("")
def list_profiles(session: SessionDep, selector: Selector = None) -> ProfileList:
    rows, version = profiles.list_profiles(session, label_selector.parse(selector))
    return ProfileList(metadata=ListMeta(resourceVersion=format_resource_version(version)),
                       items=[ProfileDocument.from_row(r) for r in rows])


@router.post("", status_code=status.HTTP_201_CREATED, openapi_extra=PROFILE_BODY,
             responses={**BAD_REQUEST, **CONFLICT, 200: {"model": DryRunResult, "description": "Dry run"}})
def create_profile(
    body: DocumentDep, session: SessionDep, now: NowDep, response: Response, dry_run: DryRun = None,
) -> ProfileDocument | DryRunResult:
    profile = profiles.validate(body)
    if dry_run:
        response.status_code = status.HTTP_200_OK
        row, plans = profiles.preview_create(session, profile, now)
        return _dry_run(row, plans, stored=False)
    return ProfileDocument.from_row(profiles.create(session, profile, now))


@router.get("/{name}", responses=NOT_FOUND)
def get_profile(name: ProfileName, session: SessionDep) -> ProfileDocument:
    return ProfileDocument.from_row(profiles.get(session, name))


@router.put("/{name}", openapi_extra=PROFILE_BODY, responses={**BAD_REQUEST, **NOT_FOUND, **CONFLICT})
def replace_profile(
    name: ProfileName, body: DocumentDep, session: SessionDep, now: NowDep, dry_run: DryRun = None,
) -> ProfileDocument | DryRunResult:
    """Replace the document. metadata.resourceVersion, when given, must be the stored one (else 409);
    without it the update is unconditional."""
    profile = profiles.validate(body)
    if dry_run:
        row, plans = profiles.preview_replace(session, name, profile)
        return _dry_run(row, plans, stored=True)
    return ProfileDocument.from_row(profiles.replace(session, name, profile, now))


@router.delete("/{name}", responses={**NOT_FOUND, 202: {
    "model": ProfileDocument, "description": "Deletion pending: hosts still hold its settings"}})
def delete_profile(
    name: ProfileName, session: SessionDep, now: NowDep, response: Response
) -> ProfileDocument:
    row, pending = profiles.delete(session, name, now)
    if pending:
        response.status_code = status.HTTP_202_ACCEPTED
    return ProfileDocument.from_row(row)
