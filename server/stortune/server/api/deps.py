"""Dependencies of the routes, as typed aliases."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Annotated, Any

import yaml
from fastapi import Depends, Path, Request
from sqlalchemy.orm import Session, sessionmaker

from stortune.server.errors import BadRequest, NotFound
from stortune.server.models.common import NAME_PATTERN, is_name
from stortune.server.settings import Settings

Clock = Callable[[], datetime]


def get_session(request: Request) -> Iterator[Session]:
    sessions: sessionmaker[Session] = request.app.state.sessions
    with sessions() as session:
        yield session


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_now(request: Request) -> datetime:
    clock: Clock = request.app.state.clock
    return clock()


def _load_yaml(body: bytes) -> Any:
    # An alias repeats a node by reference; a few lines of them expand into
    # billions of nodes for whoever walks the result ("billion laughs").
    if any(isinstance(event, yaml.AliasEvent) for event in yaml.parse(body, Loader=yaml.SafeLoader)):
        raise BadRequest("YAML aliases (*name) are not accepted in documents; write the values out")
    return yaml.safe_load(body)


async def read_document(request: Request) -> Any:
    """The raw body, JSON or YAML: documents are validated by the schemas package, not FastAPI,
    so error paths are the document's own (spec.rules[0]...)."""
    body = await request.body()
    content_type = request.headers.get("content-type", "application/json")
    syntax = "YAML" if "yaml" in content_type else "JSON"
    try:
        return _load_yaml(body) if syntax == "YAML" else json.loads(body)
    except (ValueError, yaml.YAMLError) as exc:
        raise BadRequest(f"the body is not valid {syntax}: {exc}") from None
    except RecursionError:
        raise BadRequest(f"the body nests too deeply to be a {syntax} document") from None


# The pattern is documented, not enforced as 422: a name that cannot exist is simply not found.
NamePath = Annotated[str, Path(description="Object name (RFC 1123)",
                               json_schema_extra={"pattern": NAME_PATTERN, "maxLength": 253})]


def _known_name(kind: str, name: str) -> str:
    # A string that is not a valid name names nothing; answering 404 here also
    # keeps text no database column accepts (NUL) away from the queries.
    if not is_name(name):
        raise NotFound(kind, name)
    return name


def profile_name(name: NamePath) -> str:
    return _known_name("StorageProfile", name)


def host_name(name: NamePath) -> str:
    return _known_name("Host", name)


SessionDep = Annotated[Session, Depends(get_session)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
NowDep = Annotated[datetime, Depends(get_now)]
DocumentDep = Annotated[Any, Depends(read_document)]
ProfileName = Annotated[str, Depends(profile_name)]
HostName = Annotated[str, Depends(host_name)]
