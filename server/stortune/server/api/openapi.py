"""OpenAPI additions: the StorageProfile schema for bodies that are parsed by hand."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from stortune.schemas.profile import StorageProfile
from stortune.server.models.status import Status

_REF = "#/components/schemas/{model}"

#: ``openapi_extra`` of routes taking a StorageProfile document.
PROFILE_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": _REF.format(model="StorageProfile")}},
            "application/yaml": {"schema": {"$ref": _REF.format(model="StorageProfile")}},
        },
    }
}


Responses = dict[int | str, dict[str, Any]]


def _error(description: str) -> dict[str, Any]:
    return {"model": Status, "description": description}


#: Error responses, documented with the Status body they carry.
NOT_FOUND: Responses = {404: _error("No such object")}
CONFLICT: Responses = {409: _error("Already exists, stale resourceVersion or being deleted")}
INVALID: Responses = {422: _error("Invalid: details.causes name each field")}
BAD_REQUEST: Responses = {400: _error("The body is not valid JSON or YAML")}
TOO_MANY: Responses = {429: _error("Rate limited: retry after the Retry-After header's seconds")}
#: Every /api/ route: the token is missing or refused, or its role may not do this.
AUTH: Responses = {401: _error("No token, or an unknown, revoked or expired one"),
                   403: _error("The token's role may not do this")}


#: How /api/ calls authenticate ("Authorize" in /docs); api/access.py checks it.
BEARER_SCHEME = {"type": "http", "scheme": "bearer", "description": (
    "An API token: stortune token create, or the admin.token the server writes on its first start")}
_METHODS = {"get", "put", "post", "delete", "patch", "head", "options"}


def _operations(schema: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    """The operations of the paths under ``prefix``."""
    return [operation for path, operations in schema.get("paths", {}).items() if path.startswith(prefix)
            for method, operation in operations.items() if method in _METHODS]


def install(app: FastAPI, api_prefix: str) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes,
                                 description=app.description, tags=app.openapi_tags)
            components = schema.setdefault("components", {})
            components.setdefault("securitySchemes", {})["HTTPBearer"] = BEARER_SCHEME
            for operation in _operations(schema, api_prefix + "/"):
                operation["security"] = [{"HTTPBearer": []}]
            document = StorageProfile.model_json_schema(ref_template=_REF)
            schemas = components.setdefault("schemas", {})
            for name, definition in document.pop("$defs", {}).items():
                schemas.setdefault(name, definition)
            schemas["StorageProfile"] = document
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
