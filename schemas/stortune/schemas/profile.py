"""The StorageProfile document (apiVersion stortune/v1).

The pydantic models are the single source: the agent, the control plane and
the CLI validate with them, and the JSON Schema in ``schemas/jsonschema`` is
exported from them. ``settings`` is generated from the tunable catalog, so an
unknown tunable or an out-of-range value fails with its full field path.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    create_model,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema, WithJsonSchema
from pydantic_core import core_schema

from stortune.schemas import catalog, patterns, sizes
from stortune.schemas.catalog import Tunable, TunableValueError
from stortune.schemas.controllers import AdapterName, normalise_raid_level
from stortune.schemas.sizes import parse_size
from stortune.schemas.topology import DeviceKind, Role

API_VERSION = "stortune/v1"

# Kubernetes object names (RFC 1123 subdomain) and label syntax.
#: Object names (profiles, hosts): an RFC 1123 subdomain, as for Kubernetes.
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
_NAME = re.compile(NAME_PATTERN)
_RULE_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
_RULE_NAME = re.compile(_RULE_NAME_PATTERN)
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
MAX_ANNOTATIONS_SIZE = 256 * 1024

#: A regular expression in a document: RE2 syntax, full match, bounded (schemas/patterns.py).
Regex = Annotated[str, AfterValidator(patterns.check_regex), Field(json_schema_extra={
    "maxLength": patterns.MAX_PATTERN_LENGTH})]
#: A shell glob in a document (``*``, ``?``, ``[a-z]``, ``[!0-9]``), full match, bounded.
Glob = Annotated[str, AfterValidator(patterns.check_glob), Field(json_schema_extra={
    "maxLength": patterns.MAX_PATTERN_LENGTH})]


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


def _check_label_key(key: str) -> str:
    if not _LABEL_KEY.fullmatch(key):
        raise ValueError(f"label key {key!r} is not a valid label key ([prefix/]name, 63 chars)")
    return key


def _check_label_value(value: str) -> str:
    if len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
        raise ValueError(f"label value {value!r} is not valid (63 chars of [A-Za-z0-9-_.])")
    return value


def is_name(value: str) -> bool:
    return bool(_NAME.fullmatch(value))


def check_labels(labels: dict[str, str]) -> dict[str, str]:
    for key, value in labels.items():
        _check_label_key(key)
        _check_label_value(value)
    return labels


class Metadata(_Doc):
    name: str = Field(
        description="RFC 1123 name, unique per kind",
        json_schema_extra={"pattern": NAME_PATTERN, "maxLength": 253},
    )
    labels: dict[str, str] = Field(default_factory=dict, max_length=64)
    annotations: dict[str, str] = Field(default_factory=dict, max_length=64)
    # Set by the control plane; accepted on input so documents round-trip.
    generation: StrictInt | None = None
    resourceVersion: str | None = None
    uid: str | None = None
    creationTimestamp: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not is_name(v):
            raise ValueError(
                f"{v!r} is not a valid name: lower-case letters, digits, '-' and '.', "
                "starting and ending alphanumeric, at most 253 characters"
            )
        return v

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        return check_labels(v)

    @field_validator("annotations")
    @classmethod
    def _annotations(cls, v: dict[str, str]) -> dict[str, str]:
        # Keys follow the label key syntax and all of them fit 256 KiB, as in Kubernetes.
        for key in v:
            _check_label_key(key)
        size = sum(len(k) + len(val) for k, val in v.items())
        if size > MAX_ANNOTATIONS_SIZE:
            raise ValueError(f"annotations take {size} characters; at most {MAX_ANNOTATIONS_SIZE}")
        return v


class SelectorOperator(StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


class SelectorRequirement(_Doc):
    key: str
    operator: SelectorOperator
    values: list[str] = Field(default_factory=list, max_length=64)

    @field_validator("values")
    @classmethod
    def _label_values(cls, v: list[str]) -> list[str]:
        for value in v:
            _check_label_value(value)  # a value no label can have would select nothing, silently
        return v

    @model_validator(mode="after")
    def _values_fit_operator(self) -> SelectorRequirement:
        _check_label_key(self.key)
        needs = self.operator in (SelectorOperator.IN, SelectorOperator.NOT_IN)
        if needs and not self.values:
            raise ValueError(f"operator {self.operator.value} needs at least one value")
        if not needs and self.values:
            raise ValueError(f"operator {self.operator.value} takes no values")
        return self


class LabelSelector(_Doc):
    matchLabels: dict[str, str] = Field(default_factory=dict, max_length=64)
    matchExpressions: list[SelectorRequirement] = Field(default_factory=list, max_length=64)

    @model_validator(mode="after")
    def _not_empty(self) -> LabelSelector:
        check_labels(self.matchLabels)
        if not self.matchLabels and not self.matchExpressions:
            raise ValueError("an empty selector would match every host; name labels or expressions")
        return self

    def matches(self, labels: Mapping[str, str]) -> bool:
        if any(labels.get(k) != v for k, v in self.matchLabels.items()):
            return False
        for req in self.matchExpressions:
            present = req.key in labels
            if req.operator is SelectorOperator.IN and labels.get(req.key) not in req.values:
                return False
            if req.operator is SelectorOperator.NOT_IN and present and labels[req.key] in req.values:
                return False
            if req.operator is SelectorOperator.EXISTS and not present:
                return False
            if req.operator is SelectorOperator.DOES_NOT_EXIST and present:
                return False
        return True


def _size_as_written(value: object) -> object:
    parse_size(value)  # the one rule (stortune.schemas.sizes); the text is kept as written
    return value


#: Bytes, or a size with a unit; documents keep what was written, the planner reads the bytes.
SizeText = Annotated[int | str, BeforeValidator(_size_as_written), WithJsonSchema(sizes.json_schema(
    "Bytes, or with a unit: 500GB = 500 x 10^9, 1.5TiB = 1.5 x 2^40, 2T = 2 TiB (docs/profiles.md, Sizes)"))]


class SizeRange(_Doc):
    min: SizeText | None = None
    max: SizeText | None = None

    @model_validator(mode="after")
    def _range(self) -> SizeRange:
        lo, hi = self.bounds()
        if lo is None and hi is None:
            raise ValueError("give min, max or both")
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"min {self.min} is larger than max {self.max}")
        return self

    def bounds(self) -> tuple[int | None, int | None]:
        return (
            parse_size(self.min) if self.min is not None else None,
            parse_size(self.max) if self.max is not None else None,
        )


def _raid_levels(levels: list[str] | None) -> list[str] | None:
    # the tools' own words (RAID5, RAID 1+0) become the words the mapping gives a device
    return None if levels is None else [normalise_raid_level(level) for level in levels]


RaidLevelWord = Annotated[str, Field(min_length=1, max_length=32)]


class ControllerMatch(_Doc):
    """Facts of the hardware RAID virtual drive a disk is (all given must hold).

    Only a disk a vendor tool maps to a virtual drive has them (``Device.controller``); any
    other device fails every controller criterion."""

    adapter: list[AdapterName] | None = Field(default=None, min_length=1, max_length=4,
                                              description="The vendor tool family")
    model: Regex | None = Field(default=None, description="Controller model, RE2, full match:"
                                                          " PERC H7.*")
    driver: Regex | None = Field(default=None, description="Controller driver, RE2, full match:"
                                                           " megaraid_sas")
    raidLevel: Annotated[list[RaidLevelWord] | None, AfterValidator(_raid_levels)] = Field(
        default=None, min_length=1, max_length=32,
        description="Virtual drive RAID levels, lower case: raid5, raid10 (RAID 1+0), raid6 (ADG)")
    stripSize: SizeRange | None = Field(default=None, description="Virtual drive strip size range")

    @model_validator(mode="after")
    def _not_empty(self) -> ControllerMatch:
        if all(getattr(self, f) is None for f in type(self).model_fields):
            raise ValueError("controller must name at least one criterion (adapter, model, driver,"
                             " raidLevel, stripSize)")
        return self


class Match(_Doc):
    """Topology facts a device must all have (an AND of the criteria given).

    Lists are alternatives (an OR); globs use shell syntax; model, vendor and
    driver are RE2 regular expressions matched against the whole value. Every
    pattern is bounded and matched in linear time (schemas/patterns.py).
    """

    kind: list[DeviceKind] | None = None
    name: list[Glob] | None = Field(default=None, max_length=64,
                                    description="Kernel name globs: sd*, nvme*n1")
    id: list[Glob] | None = Field(default=None, max_length=64, description="Stable id globs: wwn:naa.6*")
    model: Regex | None = Field(default=None, description="RE2 regular expression, full match")
    vendor: Regex | None = Field(default=None, description="RE2 regular expression, full match")
    driver: Regex | None = Field(default=None, description="SCSI host driver, RE2 regular expression:"
                                                           " megaraid_sas")
    transport: list[Literal["sata", "sas", "nvme", "virtio", "fc", "iscsi", "usb", "scsi"]] | None = None
    rotational: StrictBool | None = None
    raidLevel: list[str] | None = Field(default=None, description="md levels: raid5, raid6...")
    role: list[Role] | None = None
    size: SizeRange | None = None
    controller: ControllerMatch | None = Field(
        default=None, description="Hardware RAID virtual drive facts (from the vendor tool)")

    @field_validator("name")
    @classmethod
    def _plain_names(cls, v: list[str] | None) -> list[str] | None:
        # Kernel names never hold a path: refuse anything that could be read as one.
        for glob in v or []:
            if not glob or "/" in glob or "\x00" in glob or ".." in glob:
                raise ValueError(f"{glob!r} is not a kernel device name glob (no '/', '..' or NUL)")
        return v

    @model_validator(mode="after")
    def _not_empty(self) -> Match:
        if not self.model_fields_set or all(getattr(self, f) is None for f in self.model_fields_set):
            raise ValueError("match must name at least one criterion; use kind: [...] to match broadly")
        return self


def _tunable_field(t: Tunable) -> Any:
    def check(v: object, _t: Tunable = t) -> object:
        try:
            return _t.validate(v)
        except TunableValueError as exc:
            raise ValueError(str(exc)) from None

    base: Any = (
        int | Literal["system"]
        if isinstance(t, catalog.SyncSpeedTunable)
        else (str if isinstance(t, catalog.ChoiceTunable | catalog.ControllerTunable) else int)
    )

    def schema(s: dict[str, Any], _t: Tunable = t) -> None:
        # Editors should see the catalog's own constraints, not "integer or null".
        s.clear()
        s.update(_t.json_schema())

    return (
        Annotated[
            base | None,
            BeforeValidator(check),
            Field(
                default=None,
                alias=t.name,
                json_schema_extra=schema,
            ),
        ],
        None,
    )


def _settings_model() -> type[BaseModel]:
    fields = {t.name.replace(".", "_"): _tunable_field(t) for t in catalog.ordered()}
    model: type[BaseModel] = create_model(
        "Settings",
        __config__=ConfigDict(extra="forbid", populate_by_name=False),
        __doc__="Tunable values keyed by catalog name; generated from the tunable catalog.",
        **fields,
    )
    return model


Settings = _settings_model()


def settings_dict(settings: BaseModel) -> dict[str, int | str]:
    """The settings a rule actually gives, keyed by tunable name."""
    return {k: v for k, v in settings.model_dump(by_alias=True).items() if v is not None}


class Rule(_Doc):
    name: str = Field(json_schema_extra={"pattern": _RULE_NAME_PATTERN, "maxLength": 63})
    match: Match
    settings: Settings  # type: ignore[valid-type]

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _RULE_NAME.fullmatch(v):
            raise ValueError(f"rule name {v!r} must be a DNS label (a-z, 0-9, '-')")
        return v

    @model_validator(mode="after")
    def _has_settings(self) -> Rule:
        values = settings_dict(self.settings)
        if not values:
            raise ValueError(f"rule {self.name!r} sets nothing; give at least one setting")
        if self.match.kind:
            # A setting no matched kind can carry is a mistake in the document,
            # not something to discover per device later.
            for name in values:
                kinds = catalog.get(name).applies_to
                if not kinds & set(self.match.kind):
                    raise ValueError(
                        f"settings.{name} applies to {sorted(k.value for k in kinds)},"
                        f" none of the kinds this rule matches {[k.value for k in self.match.kind]}"
                    )
        return self

    def values(self) -> dict[str, int | str]:
        return settings_dict(self.settings)


#: Patterns (globs and regular expressions) one profile may hold in all. Each is compiled
#: when the profile is read and matched against every device of every host it selects on
#: every pass, so their number bounds what one document costs the control plane and agents.
MAX_PATTERNS_PER_PROFILE = 1024
_PATTERN_FIELDS = ("name", "id", "model", "vendor", "driver")
_CONTROLLER_PATTERN_FIELDS = ("model", "driver")


def _patterns_in(match: dict[str, Any], fields: tuple[str, ...]) -> int:
    total = 0
    for field in fields:
        value = match.get(field)
        total += len(value) if isinstance(value, list) else int(value is not None)
    return total


def pattern_count(rules: object) -> int:
    """Patterns in a profile's raw ``rules`` (a document as sent, before validation): counted
    before anything compiles, so an over-long document costs a walk, not a compile per pattern."""
    total = 0
    for rule in rules if isinstance(rules, list) else ():
        match = rule.get("match") if isinstance(rule, dict) else None
        if isinstance(match, dict):
            total += _patterns_in(match, _PATTERN_FIELDS)
            controller = match.get("controller")
            if isinstance(controller, dict):
                total += _patterns_in(controller, _CONTROLLER_PATTERN_FIELDS)
    return total


class _LazyRolloutSpec:
    """``spec.rollout``'s type. The rollout models (schemas/rollout/spec.py) import the documents,
    which import this module, and the benchmark and tuning models an agent loads only on demand:
    they are imported when a profile carrying ``spec.rollout`` is validated (the control plane
    sends none to the agents) or its schema exported."""

    @staticmethod
    def _validate(value: Any) -> Any:
        from stortune.schemas.rollout.spec import RolloutSpec as _RolloutSpec

        return _RolloutSpec.model_validate(value)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(cls._validate)

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: core_schema.CoreSchema, handler: Any) -> Any:
        from stortune.schemas.rollout.spec import RolloutSpec as _RolloutSpec

        return handler(_RolloutSpec.__pydantic_core_schema__)


if TYPE_CHECKING:
    from stortune.schemas.rollout.spec import RolloutSpec
else:
    RolloutSpec = _LazyRolloutSpec


class ProfileSpec(_Doc):
    hostSelector: LabelSelector | None = Field(
        default=None, description="Hosts this profile applies to (used by the control plane)"
    )
    priority: StrictInt = Field(
        default=0,
        ge=-1000,
        le=1000,
        description="Higher wins when two profiles set one tunable on one device",
    )
    mode: Literal["enforce", "audit"] = "enforce"
    rules: list[Rule] = Field(min_length=1, max_length=256)
    rollout: RolloutSpec | None = Field(default=None, description=(
        "How a new generation reaches the hosts it changes (issue 27): waves, health gates,"
        " analysis; default: a canary host, then 10%, then every host"))

    @model_validator(mode="before")
    @classmethod
    def _pattern_budget(cls, data: Any) -> Any:
        count = pattern_count(data.get("rules")) if isinstance(data, dict) else 0
        if count > MAX_PATTERNS_PER_PROFILE:
            raise ValueError(f"the rules hold {count} patterns (globs and regular expressions) in all;"
                             f" at most {MAX_PATTERNS_PER_PROFILE} per profile")
        return data

    @model_validator(mode="after")
    def _unique_rules(self) -> ProfileSpec:
        seen: set[str] = set()
        for rule in self.rules:
            if rule.name in seen:
                raise ValueError(f"rule name {rule.name!r} is used twice")
            seen.add(rule.name)
        return self


class StorageProfile(_Doc):
    apiVersion: Literal["stortune/v1"] = "stortune/v1"
    kind: Literal["StorageProfile"] = "StorageProfile"
    metadata: Metadata
    spec: ProfileSpec
    status: SkipJsonSchema[dict[str, Any] | None] = None

    @property
    def name(self) -> str:
        return self.metadata.name

    def document(self) -> dict[str, Any]:
        """The canonical JSON form: aliases (``dev.raid.*``), unset fields left out.

        An explicit null does not validate as a setting, so this is the only
        form that round-trips through ``parse_profile``.
        """
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
