"""Object and list metadata, after Kubernetes ObjectMeta / ListMeta."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field


def _unset(value: object) -> bool:
    return value is None


class ObjectMeta(BaseModel):
    """Fields that do not apply to an object are left out, not sent as null."""

    name: str
    uid: str | None = Field(default=None, exclude_if=_unset)
    generation: int | None = Field(default=None, exclude_if=_unset,
                                   description="Increases when the spec changes")
    resourceVersion: str | None = Field(
        default=None, exclude_if=_unset,
        description="Opaque; changes on every write. Send it back to update safely.")
    creationTimestamp: datetime | None = Field(default=None, exclude_if=_unset)
    deletionTimestamp: datetime | None = Field(
        default=None, exclude_if=_unset, description="Set when deletion waits for finalizers")
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    finalizers: list[str] | None = Field(default=None, exclude_if=_unset)


class ListMeta(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    resourceVersion: str
    continue_: str | None = Field(
        default=None, alias="continue", exclude_if=_unset,
        description="Paged lists (?limit=): pass it as ?continue= for the next page; absent on the last")
    remainingItemCount: int | None = Field(
        default=None, exclude_if=_unset, description="Paged lists: how many items come after this page")


def format_resource_version(value: int) -> str:
    return str(value)


def parse_resource_version(value: str) -> int | None:
    """The stored integer, or None for a string this server never issued."""
    return int(value) if value.isascii() and value.isdigit() and len(value) < 19 else None
