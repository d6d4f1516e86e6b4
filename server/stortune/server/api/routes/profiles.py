"""/api/v1/profiles: StorageProfile documents."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request, Response, status

from stortune.server.api import label_selector
from stortune.server.api.audit import note_resource
from stortune.server.api.deps import DocumentDep, NowDep, ProfileName, SessionDep, SettingsDep
from stortune.server.api.openapi import BAD_REQUEST, CONFLICT, NOT_FOUND, PROFILE_BODY, TOO_MANY
from stortune.server.api.ratelimit import Quota, QuotaOf
from stortune.server.api.security import Authorized
from stortune.server.auth import Permission, Principal
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
Reader = Annotated[Principal, Authorized(Permission.READ_PROFILES)]
Writer = Annotated[Principal, Authorized(Permission.WRITE_PROFILES)]
# A dry run plans for every host the profile selects: the expensive call of this API.
DryRunQuota = Annotated[Quota, QuotaOf("dry-run", per_minute=120, burst=60)]


def _dry_run(row: Profile, plans: HostPlans, *, stored: bool) -> DryRunResult:
    return DryRunResult(
        object=ProfileDocument.from_row(row, stored=stored),
        plans={host: HostPlan.of(plan) for host, plan in plans.items()},
    )


@router.get("")
def list_profiles(who: Reader, session: SessionDep, selector: Selector = None) -> ProfileList:
    rows, version = profiles.list_profiles(session, label_selector.parse(selector))
    return ProfileList(metadata=ListMeta(resourceVersion=format_resource_version(version)),
                       items=[ProfileDocument.from_row(r) for r in rows])


@router.post("", status_code=status.HTTP_201_CREATED, openapi_extra=PROFILE_BODY,
             responses={**BAD_REQUEST, **CONFLICT, **TOO_MANY,
                        200: {"model": DryRunResult, "description": "Dry run"}})
def create_profile(
    *, who: Writer, quota: DryRunQuota, body: DocumentDep, session: SessionDep, now: NowDep,
    request: Request, response: Response, settings: SettingsDep, dry_run: DryRun = None,
) -> ProfileDocument | DryRunResult:
    profile = profiles.validate(body)
    note_resource(request, f"profiles/{profile.name}")
    if dry_run:
        quota.spend()
        response.status_code = status.HTTP_200_OK
        row, plans = profiles.preview_create(session, profile, now,
                                             ram_share=settings.stripe_cache_ram_share)
        return _dry_run(row, plans, stored=False)
    return ProfileDocument.from_row(profiles.create(session, profile, now))


@router.get("/{name}", responses=NOT_FOUND)
def get_profile(who: Reader, name: ProfileName, session: SessionDep) -> ProfileDocument:
    return ProfileDocument.from_row(profiles.get(session, name))


@router.put("/{name}", openapi_extra=PROFILE_BODY,
            responses={**BAD_REQUEST, **NOT_FOUND, **CONFLICT, **TOO_MANY})
def replace_profile(
    *, who: Writer, quota: DryRunQuota, name: ProfileName, body: DocumentDep, session: SessionDep,
    now: NowDep, settings: SettingsDep, dry_run: DryRun = None,
) -> ProfileDocument | DryRunResult:
    """Replace the document. metadata.resourceVersion, when given, must be the stored one (else 409);
    without it the update is unconditional."""
    profile = profiles.validate(body)
    if dry_run:
        quota.spend()
        row, plans = profiles.preview_replace(session, name, profile,
                                              ram_share=settings.stripe_cache_ram_share)
        return _dry_run(row, plans, stored=True)
    return ProfileDocument.from_row(profiles.replace(session, name, profile, now))


@router.delete("/{name}", responses={**NOT_FOUND, **TOO_MANY, 202: {
    "model": ProfileDocument, "description": "Deletion pending: hosts still hold its settings"}})
def delete_profile(
    *, who: Writer, quota: DryRunQuota, name: ProfileName, session: SessionDep, now: NowDep,
    response: Response, settings: SettingsDep, dry_run: DryRun = None,
) -> ProfileDocument | DryRunResult:
    """Delete; hosts put its settings back before it goes (a finalizer). With dryRun=All: the
    per-host plans without it (its settings as restorations), deleting nothing."""
    if dry_run:
        quota.spend()
        row, plans = profiles.preview_delete(session, name, now,
                                             ram_share=settings.stripe_cache_ram_share)
        return _dry_run(row, plans, stored=True)
    row, pending = profiles.delete(session, name, now)
    if pending:
        response.status_code = status.HTTP_202_ACCEPTED
    return ProfileDocument.from_row(row)
