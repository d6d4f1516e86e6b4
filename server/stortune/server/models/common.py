"""Pieces shared by the wire models."""

from __future__ import annotations

from typing import Annotated, Any, Final

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from stortune.schemas.documents import field_path
from stortune.schemas.profile import NAME_PATTERN, check_labels
from stortune.server.errors import Cause

API_VERSION: Final = "stortune/v1"

Name = Annotated[str, Field(pattern=NAME_PATTERN, max_length=253)]


def _bad_text(text: str) -> str | None:
    if "\x00" in text:
        return "contains a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8 text (lone surrogate)"
    return None


def unstorable(value: Any) -> Cause | None:
    """The first string a database cannot hold: NUL (PostgreSQL text) or lone surrogates (UTF-8).

    Iterative, so a body nested as deep as the JSON parser allows cannot
    overflow the stack here.
    """
    stack: list[tuple[tuple[int | str, ...], Any]] = [((), value)]
    while stack:
        loc, item = stack.pop()
        if isinstance(item, str):
            problem = _bad_text(item)
            if problem:
                return Cause(field_path(loc), problem)
        elif isinstance(item, dict):
            for key in item:
                problem = _bad_text(str(key))
                if problem:
                    return Cause(field_path(loc), f"key {key!r} {problem}")
            stack.extend(((*loc, str(key)), child) for key, child in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend(((*loc, index), child) for index, child in reversed(list(enumerate(item))))
    return None


class RequestModel(BaseModel):
    """A request body: unknown fields and unstorable text are errors, not surprises later."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any) -> Any:
        found = unstorable(data)
        if found:
            raise ValueError(f"{found.field or 'value'}: {found.message}")
        return data


def check_label_map(labels: dict[str, str]) -> dict[str, str]:
    """check_labels, with the offending key named in the message whatever was wrong."""
    for key, value in labels.items():
        try:
            check_labels({key: value})
        except ValueError as exc:
            raise ValueError(f"label {key!r}: {exc}") from None
    return labels


# The syntax is published in the JSON schema for clients; the validator above
# gives the error message, which names the label.
LABEL_KEY_PATTERN = r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
LABEL_VALUE_PATTERN = r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$"
LABELS_SCHEMA = {
    "propertyNames": {"pattern": LABEL_KEY_PATTERN},
    "additionalProperties": {"type": "string", "pattern": LABEL_VALUE_PATTERN, "maxLength": 63},
}

Labels = Annotated[dict[str, str], Field(max_length=64, json_schema_extra=LABELS_SCHEMA),
                   AfterValidator(check_label_map)]
