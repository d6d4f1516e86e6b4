"""/api/v1/tokens: issue, list and revoke API tokens (admin)."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request, status

from stortune.server.api.access import Authenticator
from stortune.server.api.audit import note_resource
from stortune.server.api.bodies import OffLoopBodyRoute
from stortune.server.api.deps import NowDep, SessionDep
from stortune.server.api.openapi import NOT_FOUND
from stortune.server.api.security import Authorized
from stortune.server.auth import Permission, Principal
from stortune.server.errors import NotFound
from stortune.server.models.tokens import TokenCreate, TokenCreated, TokenList, TokenView
from stortune.server.services import tokens

router = APIRouter(route_class=OffLoopBodyRoute, prefix="/tokens", tags=["tokens"])

Admin = Annotated[Principal, Authorized(Permission.MANAGE_TOKENS)]
_ID = re.compile(r"[0-9a-f]{12}")


async def _token_id(
    token_id: Annotated[str, Path(description="The token's public id (12 hex digits)")],
) -> str:
    if not _ID.fullmatch(token_id):  # as for names: what cannot exist is not found
        raise NotFound(tokens.KIND, token_id)
    return token_id


TokenId = Annotated[str, Depends(_token_id)]


@router.post("", status_code=status.HTTP_201_CREATED)
def create_token(body: TokenCreate, who: Admin, session: SessionDep, now: NowDep,
                 request: Request) -> TokenCreated:
    """Issue a token. The secret is in this answer only; the server keeps its hash."""
    row, secret = tokens.issue(session, body, created_by=who.describe(), now=now)
    note_resource(request, f"tokens/{row.id}")
    return TokenCreated(**TokenView.from_row(row).model_dump(), token=secret)


@router.get("")
def list_tokens(who: Admin, session: SessionDep) -> TokenList:
    """Every token, newest first, revoked and expired ones included; never a secret."""
    return TokenList(items=[TokenView.from_row(r) for r in tokens.list_tokens(session)])


@router.get("/{token_id}", responses=NOT_FOUND)
def get_token(token_id: TokenId, who: Admin, session: SessionDep) -> TokenView:
    return TokenView.from_row(tokens.get(session, token_id))


@router.delete("/{token_id}", responses=NOT_FOUND)
def revoke_token(token_id: TokenId, who: Admin, session: SessionDep, now: NowDep,
                 request: Request) -> TokenView:
    """Revoke: refused from the next call on (at once on this server)."""
    row = tokens.revoke(session, token_id, by=who.describe(), now=now)
    authenticator: Authenticator = request.app.state.authenticator
    authenticator.forget(row.id)
    return TokenView.from_row(row)
