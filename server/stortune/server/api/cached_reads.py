"""The hottest reads, answered before routing while their encoded body is current.

Dashboards and orchestrators poll the host list and hosts' status. Once a
body is kept at the current resourceVersion (api/rendered.py), answering it
is a counter read and a send; FastAPI's routing and dependency solving around
that cost about as much again. So this middleware, inside authentication,
answers those GETs itself when it can answer exactly as the route would, and
passes everything else on:

* only ``GET /api/v1/hosts`` (its pages and filters too: a query the route would
  read the same way, ``list_query_key``), ``/hosts/{name}`` and
  ``/hosts/{name}/status`` without a query string;
* only for a caller whose role may read hosts and who sees every host (a
  support token, scoped to some hosts, takes the route, which checks);
* only with a body kept at the current resourceVersion, or a 304 for the
  client's copy of it. A miss goes to the route, which renders and keeps the
  body for the next caller.

The keys are the routes' own (``list_key`` and friends, used by
api/routes/hosts.py), and the answer is built by the same function.
"""

from __future__ import annotations

import urllib.parse

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from stortune.server.api import label_selector
from stortune.server.api.access import PRINCIPAL
from stortune.server.api.rendered import kept
from stortune.server.auth import Permission, Principal
from stortune.server.errors import ApiError
from stortune.server.metrics.http import ROUTE_TEMPLATE
from stortune.server.services import host_pages
from stortune.server.services.host_pages import ConditionFilter

#: What reading a host, its status or the host list takes (the routes declare the same).
READ_HOSTS = Permission.READ_HOSTS
#: Longer queries go to the route (a selector's bound, a few conditions and a token).
MAX_QUERY = 8192


def list_key(selector: str | None, scope: str) -> tuple[str, str, str]:
    """The host list, for a label selector and a caller's scope (its selector, or "" for all)."""
    return ("hosts", selector or "", scope)


def page_key(selector: str | None, scope: str, conditions: ConditionFilter, limit: int | None,
             after: str | None) -> tuple[object, ...]:
    """A page of the host list (or the whole list when nothing pages or filters it)."""
    if not conditions and limit is None and after is None:
        return list_key(selector, scope)
    return ("hosts-page", selector or "", scope, conditions, limit, after)


def list_query_key(query: bytes) -> tuple[object, ...] | None:
    """The key of the host list a query asks for, for a caller who sees every host, when the
    route would read the query the same way; None otherwise (the route answers, or refuses)."""
    try:
        pairs = urllib.parse.parse_qsl(query.decode("ascii"), keep_blank_values=True, strict_parsing=True)
    except (UnicodeDecodeError, ValueError):
        return None
    single: dict[str, str] = {}
    conditions: list[str] = []
    for name, value in pairs:
        if name == "condition":
            conditions.append(value)
        elif name in ("labelSelector", "limit", "continue") and name not in single:
            single[name] = value
        else:
            return None
    limit_text, token = single.get("limit"), single.get("continue")
    if limit_text is not None and not (limit_text.isascii() and limit_text.isdigit() and len(limit_text) < 6
                                       and 1 <= int(limit_text) <= host_pages.MAX_LIMIT):
        return None
    selector = single.get("labelSelector")
    try:
        label_selector.parse(selector)
        wanted = host_pages.parse_conditions(conditions)
        after = host_pages.decode_continue(token) if token is not None else None
    except ApiError:
        return None
    if selector is not None and len(selector) > label_selector.MAX_SELECTOR_TEXT:
        return None
    if after is not None and limit_text is None:
        return None
    return page_key(selector, "", wanted, int(limit_text) if limit_text is not None else None, after)


def host_key(name: str) -> tuple[str, str]:
    return ("host", name)


def status_key(name: str) -> tuple[str, str]:
    return ("status", name)


#: The route template each kind of key stands for (under the hosts prefix).
_TEMPLATES = {"hosts": "", "hosts-page": "", "host": "/{name}", "status": "/{name}/status"}


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
        key: tuple[object, ...] | None = None
        if scope["type"] == "http" and scope["method"] == "GET":
            principal = scope.get(PRINCIPAL)
            if isinstance(principal, Principal) and principal.can(READ_HOSTS) and not principal.scoped:
                query = scope.get("query_string") or b""
                if not query:
                    key = _key(scope["path"], self.prefix)
                elif scope["path"] == self.prefix and len(query) <= MAX_QUERY:
                    key = list_query_key(query)
        if key is not None:
            answer = await kept(scope["app"], Headers(scope=scope), key)
            if answer is not None:
                scope[ROUTE_TEMPLATE] = self.prefix + _TEMPLATES[str(key[0])]  # for the request metrics
                await answer(scope, receive, send)
                return
        await self.app(scope, receive, send)
