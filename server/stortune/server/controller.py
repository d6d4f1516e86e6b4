"""The seam between the API and the reconciler.

Writes that can change what a host should run ask for that host to be
reconciled. The request is held on the SQLAlchemy session and handed to the
controller only after the transaction commits, so the reconciler never reads
state older than the reason it was woken for, and a rolled-back write wakes
nobody. Like a Kubernetes work queue, only host names travel: the reconciler
re-reads everything else.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from sqlalchemy import event
from sqlalchemy.orm import Session, SessionTransaction, sessionmaker

_PENDING = "stortune.reconcile.pending"
_TARGET = "stortune.reconcile.controller"


@runtime_checkable
class Controller(Protocol):
    """What the reconciler implements. Called after commit; must not block."""

    def enqueue(self, host: str, reason: str) -> None: ...


class RecordingController:
    """The default until a reconciler is plugged in: remembers the latest requests."""

    def __init__(self, limit: int = 1000) -> None:
        self.requests: deque[tuple[str, str]] = deque(maxlen=limit)

    def enqueue(self, host: str, reason: str) -> None:
        self.requests.append((host, reason))

    def hosts(self) -> set[str]:
        return {host for host, _ in self.requests}

    def clear(self) -> None:
        self.requests.clear()


def request_reconcile(session: Session, hosts: Iterable[str], reason: str) -> None:
    """Ask for ``hosts`` to be reconciled once the session's transaction commits."""
    if not session.in_transaction():
        session.begin()  # so a rollback before any SQL still ends a transaction and discards these
    pending: dict[str, str] = session.info.setdefault(_PENDING, {})
    for host in hosts:
        pending.setdefault(host, reason)  # a queue of keys: one entry per host is enough


def withdraw_reconcile(session: Session, hosts: Iterable[str]) -> None:
    """Take back this transaction's requests for ``hosts``: a later write in it showed that
    their desired state does not change (a rollout pinned them at what they hold)."""
    pending: dict[str, str] = session.info.get(_PENDING, {})
    for host in hosts:
        pending.pop(host, None)


def bind(sessions: sessionmaker[Session], controller: Controller) -> None:
    """Deliver the reconcile requests of every session made by ``sessions`` to ``controller``."""
    sessions.configure(info={_TARGET: controller})
    event.listen(sessions, "after_commit", _deliver)
    # Fires after after_commit; whatever is left then was rolled back or closed.
    event.listen(sessions, "after_transaction_end", _discard)


def _deliver(session: Session) -> None:
    pending: dict[str, str] = session.info.pop(_PENDING, {})
    target: Controller | None = session.info.get(_TARGET)
    if target is not None:
        for host, reason in pending.items():
            target.enqueue(host, reason)


def _discard(session: Session, transaction: SessionTransaction) -> None:
    if transaction.parent is None:  # a savepoint ending does not end the unit of work
        session.info.pop(_PENDING, None)
