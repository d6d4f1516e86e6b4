"""``Notices``: "reconcile these hosts" from the server that took an API call to the one that
owns them, over PostgreSQL's LISTEN/NOTIFY.

Every server listens on one channel; a notice is a newline-separated list of host names
(under the 8000-byte payload limit), so a profile change that selects 10,000 hosts is a
couple of hundred notices, not 10,000. A notice is a nudge, not the record: the stored
state is (reconciliation is level-triggered), and each server's periodic pass looks at
every host it owns anyway, so a notice lost while a listener reconnects costs latency,
never correctness. The receiving side queues only hosts it owns and never forwards one.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable

from sqlalchemy import Engine, text

log = logging.getLogger(__name__)

CHANNEL = "stortune_reconcile"
PAYLOAD_BYTES = 7900  # PostgreSQL's limit is 8000
_NOTIFY = text("SELECT pg_notify(:channel, :payload)")


def batches(hosts: Iterable[str], limit: int = PAYLOAD_BYTES) -> list[str]:
    """Newline-joined names, each batch under ``limit`` bytes (a host name is at most 253)."""
    out: list[str] = []
    current: list[str] = []
    size = 0
    for host in hosts:
        cost = len(host.encode("utf-8")) + 1
        if current and size + cost > limit:
            out.append("\n".join(current))
            current, size = [], 0
        current.append(host)
        size += cost
    if current:
        out.append("\n".join(current))
    return out


class Notices:
    """``publish`` from any thread; ``on_hosts`` is called from the listener's thread."""

    def __init__(self, engine: Engine, on_hosts: Callable[[list[str]], None], *,
                 reconnect_s: float = 1.0) -> None:
        self._engine = engine
        self._on_hosts = on_hosts
        self._reconnect_s = reconnect_s
        self._pending: set[str] = set()
        self._lock = threading.Lock()
        self._due = threading.Event()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self.listening = threading.Event()  # set while LISTEN is in effect (tests wait on it)

    def publish(self, hosts: Iterable[str]) -> None:
        with self._lock:
            self._pending.update(hosts)
        self._due.set()

    def start(self) -> None:
        self._stopping.clear()
        self._threads = [threading.Thread(target=self._listen, name="stortune-notices-in", daemon=True),
                         threading.Thread(target=self._send, name="stortune-notices-out", daemon=True)]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._due.set()
        if self.listening.is_set():  # wake the listener now rather than at its next poll
            with contextlib.suppress(Exception), self._engine.begin() as conn:
                conn.execute(_NOTIFY, {"channel": CHANNEL, "payload": ""})
        for thread in self._threads:
            thread.join(5)
        self._threads = []

    # -- out ----------------------------------------------------------------------------
    def _send(self) -> None:
        while not self._stopping.is_set():
            self._due.wait()
            self._due.clear()
            with self._lock:
                hosts, self._pending = sorted(self._pending), set()
            if not hosts or self._stopping.is_set():
                continue
            try:
                with self._engine.begin() as conn:
                    for payload in batches(hosts):
                        conn.execute(_NOTIFY, {"channel": CHANNEL, "payload": payload})
            except Exception:  # the owners' periodic passes still look at these hosts
                log.exception("sending reconcile notices for %d host(s) failed", len(hosts))

    # -- in -----------------------------------------------------------------------------
    def _listen(self) -> None:
        while not self._stopping.is_set():
            try:
                self._listen_once()
            except Exception as exc:
                log.warning("reconcile notices: listener lost its connection (%s); again in %gs",
                            exc, self._reconnect_s)
            self.listening.clear()
            self._stopping.wait(self._reconnect_s)

    def _listen_once(self) -> None:
        raw = self._engine.raw_connection()
        conn = raw.driver_connection
        raw.detach()  # a connection of its own for as long as it listens, not the pool's
        assert conn is not None
        try:
            conn.rollback()  # out of any transaction the pool's reset left, so autocommit may be set
            conn.autocommit = True
            conn.execute(f"LISTEN {CHANNEL}")
            self.listening.set()
            while not self._stopping.is_set():
                for note in conn.notifies(timeout=0.5):
                    if self._stopping.is_set():
                        break
                    hosts = [h for h in note.payload.split("\n") if h]
                    if hosts:
                        self._on_hosts(hosts)
        finally:
            conn.close()
