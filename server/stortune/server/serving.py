"""Serving the app with uvicorn, as fleets of long-held agent watches need.

* Every accepted connection gets TCP keepalive (set on the listening sockets, which Linux
  passes on to the connections they accept) and a user timeout: a watch held by a host
  that lost power without closing its connection ends within about a minute, and with it
  the renewal of that host's lease (services/watches.py).
* On shutdown the held watches are ended first: uvicorn waits for open requests before it
  runs the app's shutdown, and thousands of watches held for minutes would hold it up.
* The open-files limit is raised to its hard limit: each watching agent is a connection.
"""

from __future__ import annotations

import contextlib
import logging
import resource
import socket
from typing import Any

import uvicorn
from fastapi import FastAPI

log = logging.getLogger(__name__)

#: Idle seconds before the first probe, seconds between probes, probes before giving up.
KEEPALIVE = (30, 10, 3)
#: Unacknowledged data is given up on after this long (milliseconds).
USER_TIMEOUT_MS = 60_000


def keepalive(sock: socket.socket) -> None:
    idle, interval, count = KEEPALIVE
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    with contextlib.suppress(AttributeError, OSError):  # Linux names; elsewhere the defaults
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, interval)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, count)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, USER_TIMEOUT_MS)


#: Open files wanted: a watching agent's connection and a gRPC channel to it, per host.
WANTED_OPEN_FILES = 1 << 18


def raise_open_files_limit(wanted: int = WANTED_OPEN_FILES) -> int:
    """The soft limit on open files raised to ``wanted`` (the hard limit too, where this process
    may raise it: root), else to the hard limit; -> the limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        tries = [(wanted, hard)]
    else:  # raising the hard limit needs root; else as far as it goes
        tries = [(wanted, max(hard, wanted)), (min(wanted, hard), hard)]
    for new_soft, new_hard in tries:
        if new_soft <= soft:
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new_soft, new_hard))
        except (ValueError, OSError):
            continue
        return new_soft
    return soft


class Server(uvicorn.Server):
    """uvicorn's server, with keepalive on its sockets and the app's watches drained first."""

    def __init__(self, app: FastAPI, **config: Any) -> None:
        super().__init__(uvicorn.Config(app, **config))
        self._app = app

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        for server in getattr(self, "servers", []):
            for sock in server.sockets:
                if sock.family in (socket.AF_INET, socket.AF_INET6):
                    keepalive(sock)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        watches = getattr(self._app.state, "watches", None)
        if watches is not None:
            watches.drain()
        await super().shutdown(sockets)


def serve(app: FastAPI, **config: Any) -> None:
    limit = raise_open_files_limit()
    log.debug("open files limit: %d", limit)
    Server(app, **config).run()
