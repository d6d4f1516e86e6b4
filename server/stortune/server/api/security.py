"""Authorization of routes: each declares the permission it needs.

    HostReader = Annotated[Principal, Authorized(Permission.READ_HOSTS)]

    @router.get("/{name}/diagnostics")
    @audited
    def diagnostics(who: HostReader, name: VisibleHostName, ...) -> ...

A valid token whose role lacks the permission is 403; no or a bad token never
gets this far (401, api/access.py). Scoped principals (support tokens) see
only the hosts their selector matches: ``VisibleHostName`` answers 404 for
any other host, exactly as for a host that does not exist, so such a token
cannot learn which hosts lie outside its reach. ``check_routes`` refuses to
build an app with an /api/ route that declares no permission.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from sqlalchemy.orm import Session, sessionmaker

from stortune.server.api.access import PRINCIPAL
from stortune.server.api.deps import HostName
from stortune.server.auth import Permission, Principal, roles_with
from stortune.server.errors import Forbidden, NotFound, Unauthorized
from stortune.server.services import hosts

_PERMISSION = "__stortune_permission__"

# Each dependency costs a request noticeable CPU in FastAPI, and every route has these:
# so they read the principal the middleware left in the scope themselves, and the
# bearer scheme is declared in the OpenAPI document (api/openapi.py) instead of by
# a dependency that would parse the header a second time.


def principal_of(request: Request) -> Principal:
    principal = request.scope.get(PRINCIPAL)
    if not isinstance(principal, Principal):  # only if a route escaped the middleware's prefix
        raise Unauthorized("this call needs a token")
    return principal


async def current_principal(request: Request) -> Principal:
    return principal_of(request)


CurrentPrincipal = Annotated[Principal, Depends(current_principal)]


def _check(principal: Principal, permission: Permission) -> None:
    if not principal.can(permission):
        roles = ", ".join(r.value for r in roles_with(permission))
        raise Forbidden(f"{principal.describe()} may not {permission.value}; roles that may: {roles}")


@functools.cache  # one callable per permission: FastAPI runs it once per request
def require(permission: Permission) -> Callable[..., Awaitable[Principal]]:
    async def allowed(request: Request) -> Principal:
        principal = principal_of(request)
        _check(principal, permission)
        return principal

    setattr(allowed, _PERMISSION, permission)
    return allowed


def Authorized(permission: Permission) -> Any:
    """``Annotated[Principal, Authorized(Permission.X)]``: the caller, if its role may do X."""
    return Depends(require(permission))


def _labels_of(sessions: sessionmaker[Session], name: str) -> dict[str, str] | None:
    with sessions() as session:
        return hosts.labels_of(session, name)


async def visible_host(name: HostName, request: Request) -> str:
    # No session dependency: most callers are not scoped, and would pay a thread hop to close it.
    principal = principal_of(request)
    if principal.scoped:
        labels = await run_in_threadpool(_labels_of, request.app.state.sessions, name)
        if labels is None or not principal.may_see_host(labels):
            raise NotFound(hosts.KIND, name)
    return name


#: A host path parameter that exists for this caller (404 otherwise, see above).
VisibleHostName = Annotated[str, Depends(visible_host)]


def declared_permissions(dependant: Dependant) -> Iterator[Permission]:
    for dep in dependant.dependencies:
        permission = getattr(dep.call, _PERMISSION, None)
        if isinstance(permission, Permission):
            yield permission
        yield from declared_permissions(dep)


#: id(route) -> (route, the permissions it declares): routes live as long as the process.
_ROUTE_PERMISSIONS: dict[int, tuple[Any, frozenset[Permission]]] = {}


def authorize_route(request: Request) -> Principal:
    """The caller, if it holds every permission its route declares; 403 otherwise.

    For what runs before the route's own parameters and spends something on the caller's
    behalf (a rate limit, api/ratelimit.py): a role that may not call the route learns 403,
    not 429, and spends nothing."""
    principal = principal_of(request)
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return principal
    known = _ROUTE_PERMISSIONS.get(id(route))
    if known is None or known[0] is not route:
        known = _ROUTE_PERMISSIONS[id(route)] = (route, frozenset(declared_permissions(dependant)))
    for permission in sorted(known[1]):
        _check(principal, permission)
    return principal


def _route_contexts(routes: list[Any]) -> Iterator[Any]:
    try:  # newer FastAPI keeps included routers as they are; older ones copied their routes
        from fastapi.routing import iter_route_contexts
    except ImportError:  # pragma: no cover
        return iter(routes)
    return iter_route_contexts(routes)


def api_routes(app: FastAPI) -> Iterator[tuple[str, str, Any]]:
    """(method, path, route) of every route the app serves."""
    for route in _route_contexts(app.routes):
        for method in sorted(getattr(route, "methods", None) or ()):
            yield method, str(route.path), route


def check_routes(app: FastAPI, prefix: str) -> None:
    """Every route under ``prefix`` declares a permission; otherwise the app is not built.

    Walks what the app serves, which makes FastAPI build every route's state for this app
    (about 0.1 s): create_app checks the routers it includes instead (``check_included``)."""
    _refuse_missing((method, path, route.dependant) for method, path, route in api_routes(app)
                    if path.startswith(prefix))


#: (prefix, router) pairs as an app includes them.
Included = tuple[tuple[str, APIRouter], ...]


def _included_routes(included: Included) -> Iterator[tuple[str, APIRoute]]:
    for prefix, router in included:
        for route in router.routes:
            if isinstance(route, APIRoute):
                yield prefix + route.path, route


#: Included tuples checked already, and their templates (routers are not hashable: by identity).
_CHECKED: dict[tuple[int, tuple[str, ...]], Included] = {}
_TEMPLATES: dict[int, tuple[Included, dict[int, str]]] = {}


def check_included(included: Included, prefixes: tuple[str, ...]) -> None:
    """``check_routes`` over the routers an app includes, before it includes them: the
    routers are built once per process, so this is checked once per process."""
    if (id(included), prefixes) in _CHECKED:
        return
    _refuse_missing((method, path, route.dependant) for path, route in _included_routes(included)
                    if path.startswith(prefixes) for method in sorted(route.methods or ()))
    _CHECKED[id(included), prefixes] = included  # kept: its id stays its own


def _refuse_missing(routes: Iterable[tuple[str, str, Dependant]]) -> None:
    missing = [f"{method} {path}" for method, path, dependant in routes
               if method != "HEAD" and not any(declared_permissions(dependant))]
    if missing:
        raise RuntimeError("routes without a declared permission (use api.security.Authorized): "
                           + ", ".join(missing))


def included_templates(included: Included) -> dict[int, str]:
    """id(route in a request's scope) -> its whole path template, from the included routers
    themselves: newer FastAPI puts the router's own route in the scope, whose path lacks the
    prefix it was included under."""
    known = _TEMPLATES.get(id(included))
    if known is None:
        known = _TEMPLATES[id(included)] = (included, {id(route): path for path, route
                                                       in _included_routes(included)})
    return known[1]
