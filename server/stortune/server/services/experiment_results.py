"""The StorageProfile an experiment's ``applyResult`` stores: never over a profile by accident.

The result goes under a name of its own (``spec.result.name``, by default the experiment's).
A profile already under that name is replaced only when the document says so and gives the
resourceVersion it means (``spec.result: {replace: true, resourceVersion: N}``), or when this
very experiment stored it (an earlier host of a fleet, or a driver restarted mid-end). That is
checked at submission (409) and again when the result is written, hours later: a profile made
or changed meanwhile is left alone, and the experiment says why. The write is the creator's:
audited under the token that submitted the experiment, refused when that token is revoked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Final

from sqlalchemy import select
from sqlalchemy.orm import Session

from stortune.schemas.profile import StorageProfile
from stortune.server.auth import Principal
from stortune.server.db.tables import ApiToken, Experiment, Profile
from stortune.server.errors import ApiError, Cause, Conflict
from stortune.server.models.meta import parse_resource_version
from stortune.server.services import audit, events, profiles, tokens

if TYPE_CHECKING:
    from stortune.schemas.tuning.experiment import TuningExperiment

KIND: Final = "TuningExperiment"
#: On a profile an experiment stored: that experiment's id (its own result, which it may rewrite).
RESULT_OF: Final = "stortune.dev/experiment-id"
#: ``create`` writes the submitter as "NAME (token ID)".
_CREATED_BY = re.compile(r"\(token ([A-Za-z0-9_-]{1,64})\)\Z")


def result_conflict(row: Profile | None, exp: TuningExperiment, experiment_id: str | None = None
                    ) -> Cause | None:
    """Why ``applyResult`` may not write its profile where ``row`` is; None when it may."""
    if row is None:
        return None
    name, version = row.name, row.resource_version
    if row.deletion_timestamp is not None:
        return Cause("spec.result.name", f'StorageProfile "{name}" is being deleted: give the result a'
                                         " name of its own (spec.result.name)")
    if experiment_id is not None and row.annotations.get(RESULT_OF) == experiment_id:
        return None  # this experiment stored it (an earlier host): its own to rewrite
    wanted = exp.spec.result
    if wanted is None or not wanted.replace or wanted.resourceVersion is None:
        return Cause("spec.result.name", (
            f'StorageProfile "{name}" exists (resourceVersion {version}) and applyResult would replace it:'
            " give the result a name of its own (spec.result.name), or replace it knowingly"
            f' (spec.result: {{replace: true, resourceVersion: "{version}"}})'))
    if parse_resource_version(wanted.resourceVersion) != version:
        return Cause("spec.result.resourceVersion", (
            f'StorageProfile "{name}" has changed since resourceVersion {wanted.resourceVersion} (now'
            f" {version}): read it again and give its current resourceVersion, or another name"))
    return None


def check_result_name(session: Session, exp: TuningExperiment) -> None:
    """At submission: Conflict (409) when ``applyResult`` would write over a profile unasked."""
    if not exp.spec.applyResult:
        return
    cause = result_conflict(session.get(Profile, exp.result_name), exp)
    if cause is not None:
        raise Conflict(cause.message, kind=KIND, name=exp.name, causes=[cause])


def creator(session: Session, created_by: str) -> tuple[Principal | None, str]:
    """The principal that submitted an experiment, and '' or why it may not write any more."""
    found = _CREATED_BY.search(created_by)
    row = session.get(ApiToken, found.group(1)) if found else None
    if row is None:
        return None, f"the token that submitted the experiment ({created_by[:120]}) is gone"
    if row.revoked_at is not None:
        return tokens.principal_of(row), f"the token that submitted the experiment ({row.id}) was revoked"
    return tokens.principal_of(row), ""


@dataclass(frozen=True)
class Stored:
    """What became of the result: its name, and why it was not stored (empty when it was)."""

    name: str
    refused: str = ""


def store(session: Session, exp: TuningExperiment, experiment_id: str, profile: StorageProfile,
          now: datetime) -> Stored:
    """Create or replace the result as the experiment's creator, audited; checked again first."""
    created_by = session.scalar(select(Experiment.created_by).where(Experiment.id == experiment_id)) or ""
    who, gone = creator(session, created_by)
    method, code, cause = "POST", 403, Cause("", gone) if gone else None
    if cause is None:
        method, code, cause = _write(session, exp, experiment_id, profile, now)
        # Two hosts of a fleet may end at once: the one whose write finds the profile just made
        # (or rewritten) by this experiment writes once more; anything else is left as it is.
        if code == 409 and _stored_by(session, profile.name, experiment_id):
            method, code, cause = _write(session, exp, experiment_id, profile, now)
    if who is not None:
        path = f"/api/v1/profiles/{profile.name}"
        audit.record(session, audit.Call(principal=who, method=method, path=path,
                                         resource=f"profiles/{profile.name}", code=code,
                                         client=f"experiment {experiment_id}"[:64]), now)
    if cause is None:
        _event(session, experiment_id, "Normal", "ResultStored",
               f"applyResult stored StorageProfile {profile.name} for {who.name if who else '?'}", now=now)
        return Stored(profile.name)
    _event(session, experiment_id, "Warning", "ResultNotStored",
           f"the recommended StorageProfile {profile.name} was not stored: {cause.message}", now=now)
    return Stored(profile.name, cause.message)


def _stored_by(session: Session, name: str, experiment_id: str) -> bool:
    """Whether the profile ``name`` is one this experiment stored (read in a transaction of its own)."""
    row = session.get(Profile, name)
    mine = row is not None and row.annotations.get(RESULT_OF) == experiment_id
    session.rollback()
    return mine


def _write(session: Session, exp: TuningExperiment, experiment_id: str, profile: StorageProfile,
           now: datetime) -> tuple[str, int, Cause | None]:
    """One checked write of the result: (method, status code, why it was not written or None)."""
    row = session.get(Profile, profile.name)
    cause = result_conflict(row, exp, experiment_id)
    version = None if row is None else row.resource_version
    session.rollback()  # end the reads: the write below starts its own transaction
    method = "POST" if version is None else "PUT"
    if cause is not None:
        return method, 409, cause
    # The version read is the precondition: a profile changed since is not overwritten.
    meta = profile.metadata.model_copy(update={
        "annotations": {**profile.metadata.annotations, RESULT_OF: experiment_id},
        "resourceVersion": None if version is None else str(version)})
    try:
        if version is None:
            profiles.create(session, profile.model_copy(update={"metadata": meta}), now)
            return method, 201, None
        profiles.replace(session, profile.name, profile.model_copy(update={"metadata": meta}), now)
        return method, 200, None
    except ApiError as exc:  # made or changed since it was read: left as it is
        session.rollback()
        return method, exc.code, Cause("spec.result.name", exc.message)


def _event(session: Session, experiment_id: str, type: events.EventType, reason: str, message: str, *,
           now: datetime) -> None:
    events.record(session, kind=KIND, name=experiment_id, type=type, reason=reason, message=message, now=now)
    session.commit()
