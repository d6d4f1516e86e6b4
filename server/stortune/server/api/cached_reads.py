"""The hottest reads, answered before routing while their encoded body is current.

Dashboards and orchestrators poll the host list and hosts' status. Once a
body is kept at the current resourceVersion (api/rendered.py), answering it
is a counter read and a send; FastAPI's routing and dependency solving around
that cost about as much again. So this middleware, inside authentication,
answers those GETs itself when it can answer exactly as the route would, and
passes everything else on:

* only ``GET /api/v1/hosts``, ``/hosts/{name}`` and ``/hosts/{name}/status``,
  without a query string;
* only for a caller whose role may read hosts and who sees every host (a
  support token, scoped to some hosts, takes the route, which checks);
* only with a body kept at the current resourceVersion, or a 304 for the
  client's copy of it. A miss goes to the route, which renders and keeps the
  body for the next caller.

The keys are the routes' own (``list_key`` and friends, used by
api/routes/hosts.py), and the answer is built by the same function.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from stortune.server.api.access import PRINCIPAL
from stortune.server.api.rendered import kept
from stortune.server.auth import Permission, Principal
from stortune.server.metrics.http import ROUTE_TEMPLATE

#: What reading a host, its status or the host list takes (the routes declare the same).
READ_HOSTS = Permission.READ_HOSTS


def list_key(selector: str | None, scope: str) -> tuple[str, str, str]:
    """The host list, for a label selector and a caller's scope (its selector, or "" for all)."""
    return ("hosts", selector or "", scope)


def host_key(name: str) -> tuple[str, str]:
    return ("host", name)


def status_key(name: str) -> tuple[str, str]:
    return ("status", name)


#: The route template each kind of key stands for (under the hosts prefix).
_TEMPLATES = {"hosts": "", "host": "/{name}", "status": "/{name}/status"}


def _key(path: str, prefix: str) -> tuple[str, ...] | None:
    if not path.startswith(prefix):
        return None
    parts = path[len(prefix):].split("/")
    if parts == [""]:
        return list_key(None, "")
    if len(parts) == 2 and parts[0] == "" and parts[1]:
        return host_key(parts[1])
    if len(parts) == 3 and parts[0] == "" and parts[1] and parts[2] == "status":
        return status_key(parts[1])
    return None


class CachedReads:
    """ASGI middleware; ``api_prefix`` is where the API lives (/api/v1)."""

    def __init__(self, app: ASGIApp, *, api_prefix: str) -> None:
        self.app = app
        self.prefix = api_prefix.rstrip("/") + "/hosts"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key: tuple[str, ...] | None = None
        if scope["type"] == "http" and scope["method"] == "GET" and not scope.get("query_string"):
            principal = scope.get(PRINCIPAL)
            if isinstance(principal, Principal) and principal.can(READ_HOSTS) and not principal.scoped:
                key = _key(scope["path"], self.prefix)
        if key is not None:
            answer = await kept(scope["app"], Headers(scope=scope), key)
            if answer is not None:
                scope[ROUTE_TEMPLATE] = self.prefix + _TEMPLATES[key[0]]  # for the request metrics
                await answer(scope, receive, send)
                return
        await self.app(scope, receive, send)
