"""The tables of the control plane (SQLAlchemy typed ORM).

These classes are storage only; the API speaks through the pydantic models in
``stortune.server.models``. Every table change needs a migration in
``migrations/versions`` (a test compares the two).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, ForeignKey, Index, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from stortune.server.db.types import BigId, JSONDoc, UTCDateTime

NAME_LENGTH = 253  # RFC 1123 subdomain, as for Kubernetes object names


class Base(DeclarativeBase):
    type_annotation_map = {
        datetime: UTCDateTime(),
        dict[str, Any]: JSONDoc,
        dict[str, str]: JSONDoc,
        dict[str, int]: JSONDoc,
        list[str]: JSONDoc,
    }


class Counter(Base):
    """Named monotonic counters; ``resourceVersion`` orders every write of every object."""

    __tablename__ = "counters"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger)


RESOURCE_VERSION = "resourceVersion"


class Profile(Base):
    __tablename__ = "profiles"

    name: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    uid: Mapped[str] = mapped_column(String(36), unique=True)
    generation: Mapped[int]
    resource_version: Mapped[int] = mapped_column(BigInteger)
    spec: Mapped[dict[str, Any]]
    labels: Mapped[dict[str, str]]
    annotations: Mapped[dict[str, str]]
    status: Mapped[dict[str, Any]]
    finalizers: Mapped[list[str]]
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    deletion_timestamp: Mapped[datetime | None]

    # The ORM adds "WHERE resource_version = <read value>" to every UPDATE and
    # DELETE, so a write based on a stale read fails instead of winning.
    __mapper_args__ = {"version_id_col": resource_version, "version_id_generator": False}


class Host(Base):
    __tablename__ = "hosts"

    name: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    uid: Mapped[str] = mapped_column(String(36), unique=True)
    # Set through the API; they win over reported_labels for the same key.
    labels: Mapped[dict[str, str]]
    reported_labels: Mapped[dict[str, str]]
    address: Mapped[str] = mapped_column(Text)
    facts: Mapped[dict[str, Any]]
    topology: Mapped[dict[str, Any] | None]
    topology_hash: Mapped[str | None] = mapped_column(Text)
    boot_id: Mapped[str | None] = mapped_column(Text)
    registered_at: Mapped[datetime]
    last_heartbeat: Mapped[datetime]
    lease_expires: Mapped[datetime]
    # Mirrors the Ready condition so a heartbeat can learn it without reading status.
    ready: Mapped[bool]
    resource_version: Mapped[int] = mapped_column(BigInteger)
    # conditions and the per-device settings table
    status: Mapped[dict[str, Any]]
    # profile name -> generation the agent last applied; what profile finalizers wait on
    applied_generations: Mapped[dict[str, int]]

    __mapper_args__ = {"version_id_col": resource_version, "version_id_generator": False}

    @property
    def effective_labels(self) -> dict[str, str]:
        """What host selectors see: reported labels overlaid by the ones set through the API."""
        return {**self.reported_labels, **self.labels}


class Event(Base):
    __tablename__ = "events"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    host: Mapped[str | None] = mapped_column(String(NAME_LENGTH))
    profile: Mapped[str | None] = mapped_column(String(NAME_LENGTH))
    type: Mapped[str] = mapped_column(String(16))  # Normal | Warning
    reason: Mapped[str] = mapped_column(String(128))
    message: Mapped[str] = mapped_column(Text)
    involved_kind: Mapped[str] = mapped_column(String(64))
    involved_name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    first_timestamp: Mapped[datetime]
    last_timestamp: Mapped[datetime]
    count: Mapped[int]

    __table_args__ = (
        Index("ix_events_last_timestamp", "last_timestamp"),
        Index("ix_events_host", "host", "last_timestamp"),
        Index("ix_events_profile", "profile", "last_timestamp"),
        Index("ix_events_involved", "involved_kind", "involved_name", "id"),
    )


class HostConditionChange(Base):
    """One transition of one host condition, kept for diagnostics."""

    __tablename__ = "host_conditions_history"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    host: Mapped[str] = mapped_column(
        String(NAME_LENGTH), ForeignKey("hosts.name", ondelete="CASCADE"))
    type: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))  # True | False | Unknown
    reason: Mapped[str] = mapped_column(String(128))
    message: Mapped[str] = mapped_column(Text)
    at: Mapped[datetime]

    __table_args__ = (Index("ix_host_conditions_history_host", "host", "at"),)
