"""The one catalog of tunables.

Every tunable stortune knows is declared here, once: where it lives, what its
values look like, which device kinds it applies to and in which order it is
applied. The profile schema, the planner, the agent's reader/writer and the
udev exporter all derive from these declarations, so adding a tunable means
adding one entry to ``CATALOG`` below.

Paths are relative: to the device's sysfs directory (``scope="device"``) or to
the procfs root (``scope="host"``). Controller tunables (``scope="controller"``)
have no path: they are policies of a hardware RAID virtual drive, read and
written through the controller's vendor tool by the agent's controller seam.
Nothing here touches the filesystem.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from stortune.schemas.controllers import ControllerSetting
from stortune.schemas.topology import DeviceKind

Value = int | str

_QUEUE_KINDS = frozenset(
    {DeviceKind.DISK, DeviceKind.MD, DeviceKind.DM, DeviceKind.LOOP, DeviceKind.ZRAM}
)
_REQUEST_KINDS = frozenset({DeviceKind.DISK, DeviceKind.DM, DeviceKind.LOOP})
_MD = frozenset({DeviceKind.MD})
_HOST = frozenset({DeviceKind.HOST})
_VOLUME = frozenset({DeviceKind.DISK})  # a RAID controller's virtual drive is a whole disk to Linux
_SCHED_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")


class TunableValueError(ValueError):
    """A value that can never be valid for this tunable, whatever the device."""


@dataclass(frozen=True)
class Tunable:
    """Declaration of one tunable. Subclasses differ only in their value syntax."""

    name: str
    path: str
    description: str
    order: int
    applies_to: frozenset[DeviceKind]
    scope: Literal["device", "host", "controller"] = "device"
    unit: str = ""
    minimum: int | None = None
    maximum: int | None = None
    #: sysfs attribute (relative to the device dir) whose integer value caps this one
    bound_by: str | None = None
    #: values that cannot be written back verbatim (the kernel rounds them)
    multiple_of: int | None = None
    #: tunables of the same device the kernel may change when this one is written
    #: (measured by bench/couplings.py); the executor saves them before the write,
    #: keeps what the write really changed, and puts them back together with it.
    #: Each comes later in ``order``, so a plan writes it after its cause.
    resets: tuple[str, ...] = ()
    #: tunables of the same device this one means nothing without (a scheduler's own
    #: parameters need that scheduler): when one of them cannot be set there, neither is
    #: this one. Each comes earlier in ``order``. A coupling through ``resets`` is no
    #: dependency: nr_requests can be set whatever the scheduler switch did.
    depends_on: tuple[str, ...] = ()
    notes: str = ""

    # -- value syntax -----------------------------------------------------
    def parse(self, raw: str) -> tuple[Value, list[str] | None]:
        """Kernel text -> (value, offered choices or None)."""
        text = raw.strip()
        try:
            return int(text.split()[0]), None
        except (ValueError, IndexError) as exc:
            raise TunableValueError(f"{self.name}: cannot parse kernel value {raw!r}") from exc

    def format(self, value: Value) -> str:
        """Value -> the text written into the attribute."""
        return str(value)

    def validate(self, value: object) -> Value:
        """Static validation (no device needed); returns the value.

        Strict: a document that says ``"4096"`` where the schema says integer is
        refused, not converted (values read from the kernel go through ``parse``).
        """
        if isinstance(value, bool) or not isinstance(value, int):
            raise TunableValueError(f"must be an integer{self._unit_hint()}, got {value!r:.80}")
        if self.minimum is not None and value < self.minimum:
            raise TunableValueError(f"must be >= {self.minimum}{self._unit_hint()}, got {value}")
        if self.maximum is not None and value > self.maximum:
            raise TunableValueError(f"must be <= {self.maximum}{self._unit_hint()}, got {value}")
        if self.multiple_of and value % self.multiple_of:
            raise TunableValueError(
                f"must be a multiple of {self.multiple_of}{self._unit_hint()}"
                f" (the kernel would round {value} down), got {value}"
            )
        return value

    def same(self, observed: Value | None, desired: Value) -> bool:
        return observed == desired

    def json_schema(self) -> dict[str, object]:
        schema: dict[str, object] = {"type": "integer", "description": self._doc()}
        if self.minimum is not None:
            schema["minimum"] = self.minimum
        if self.maximum is not None:
            schema["maximum"] = self.maximum
        if self.multiple_of:
            schema["multipleOf"] = self.multiple_of
        return schema

    def _unit_hint(self) -> str:
        return f" ({self.unit})" if self.unit else ""

    def _doc(self) -> str:
        kinds = ", ".join(sorted(k.value for k in self.applies_to))
        where = f"/proc/{self.path}" if self.scope == "host" else f"<device>/{self.path}"
        unit = f" Unit: {self.unit}." if self.unit else ""
        return f"{self.description}{unit} Applies to: {kinds}. Written to {where}."


@dataclass(frozen=True)
class ChoiceTunable(Tunable):
    """An attribute listing its options with the current one in brackets."""

    known: tuple[str, ...] = ()

    def parse(self, raw: str) -> tuple[Value, list[str] | None]:
        words = raw.split()
        choices = [w.strip("[]") for w in words]
        current = next((w.strip("[]") for w in words if w.startswith("[")), None)
        if current is None:
            # a single-valued attribute (bio-based queue shows just "none")
            if len(words) == 1:
                return words[0], [words[0]]
            raise TunableValueError(f"{self.name}: no current choice in {raw!r}")
        return current, choices

    def validate(self, value: object) -> Value:
        if not isinstance(value, str) or not _SCHED_NAME.fullmatch(value):
            raise TunableValueError(
                f"must be a scheduler name such as {', '.join(self.known)}, got {value!r:.80}"
            )
        return value

    def json_schema(self) -> dict[str, object]:
        return {
            "type": "string",
            "pattern": _SCHED_NAME.pattern,
            "examples": list(self.known),
            "description": self._doc(),
        }


@dataclass(frozen=True)
class SyncSpeedTunable(Tunable):
    """md sync_speed_min/max: a number in KiB/s, or "system" for the host-wide limit.

    The kernel shows "1000 (system)" or "5000 (local)".
    """

    def parse(self, raw: str) -> tuple[Value, list[str] | None]:
        text = raw.strip()
        m = re.fullmatch(r"(\d+)\s*\((system|local)\)", text)
        if m:
            return (int(m.group(1)) if m.group(2) == "local" else "system"), None
        # A bare "system" is what restoring a "system" original leaves in a
        # plain file (fixture trees); the kernel itself always adds the number.
        if text == "system":
            return "system", None
        return super().parse(raw)

    def validate(self, value: object) -> Value:
        if value == "system":
            return "system"
        return super().validate(value)

    def json_schema(self) -> dict[str, object]:
        return {
            "oneOf": [
                {"const": "system"},
                {"type": "integer", "minimum": self.minimum or 0, "maximum": self.maximum},
            ],
            "description": self._doc(),
        }


@dataclass(frozen=True)
class ControllerTunable(Tunable):
    """A policy of a hardware RAID virtual drive, set through the controller's vendor tool.

    Values are the words stortune uses for every vendor (``read-ahead``, not storcli's ``RA``
    or arcconf's ``RON``); each adapter translates them through a fixed table."""

    setting: ControllerSetting = "read_policy"
    known: tuple[str, ...] = ()

    def parse(self, raw: str) -> tuple[Value, list[str] | None]:
        word = raw.strip()
        if word not in self.known:
            raise TunableValueError(f"{self.name}: unknown controller policy {raw!r:.80}")
        return word, list(self.known)

    def validate(self, value: object) -> Value:
        if not isinstance(value, str) or value not in self.known:
            raise TunableValueError(f"must be one of {', '.join(self.known)}, got {value!r:.80}")
        return value

    def json_schema(self) -> dict[str, object]:
        return {"type": "string", "enum": list(self.known), "description": self._doc()}

    def _doc(self) -> str:
        return (f"{self.description} Applies to: hardware RAID virtual drives (disks a managed"
                " controller presents). Written through the controller's vendor tool (storcli64,"
                " perccli64, ssacli, arcconf).")


def _declare(*tunables: Tunable) -> Mapping[str, Tunable]:
    table: dict[str, Tunable] = {}
    for t in tunables:
        if t.name in table:
            raise RuntimeError(f"tunable {t.name} declared twice")
        table[t.name] = t
    for t in tunables:
        for name in t.depends_on:
            if name not in table or table[name].order >= t.order:
                raise RuntimeError(f"tunable {t.name} depends on {name}, which must be declared"
                                   " and come earlier in order")
    return table


#: All tunables, in no particular order; use ``ordered()`` for application order.
CATALOG: Mapping[str, Tunable] = _declare(
    # The scheduler comes first: switching it resets nr_requests to the new
    # elevator's default (writing "none" over "none" does too), and a switch to
    # or from bfq turns writeback throttling off or on again (wbt_lat_usec 0 /
    # its default) unless wbt_lat_usec was ever written on the device. Both are
    # written after it.
    ChoiceTunable(
        name="scheduler",
        path="queue/scheduler",
        description="I/O scheduler (elevator) of the request queue.",
        order=10,
        applies_to=_QUEUE_KINDS,
        known=("none", "mq-deadline", "kyber", "bfq"),
        resets=("nr_requests", "wbt_lat_usec"),
        notes="Only schedulers the kernel lists in the attribute can be chosen.",
    ),
    Tunable(
        name="nr_requests",
        path="queue/nr_requests",
        description="Requests the scheduler may hold per queue.",
        order=20,
        applies_to=_REQUEST_KINDS,
        unit="requests",
        minimum=4,
        maximum=2048,
    ),
    Tunable(
        name="max_sectors_kb",
        path="queue/max_sectors_kb",
        description="Largest I/O the block layer issues to the device.",
        order=30,
        applies_to=_QUEUE_KINDS,
        unit="KiB",
        minimum=4,
        maximum=1_048_576,
        bound_by="queue/max_hw_sectors_kb",
        resets=("read_ahead_kb",),
    ),
    Tunable(
        name="read_ahead_kb",
        path="queue/read_ahead_kb",
        description="Read-ahead window; the main lever for sequential reads.",
        # Last of the queue attributes: since Linux 6.11 a queue-limits update
        # (max_sectors_kb, add_random, iostats) raises read-ahead to at least
        # 2 x max_sectors_kb and 128 KiB (never lowers it), so anything written
        # after it could undo it.
        order=59,
        applies_to=_QUEUE_KINDS,
        unit="KiB",
        minimum=0,
        maximum=1_048_576,
        multiple_of=4,
        notes="blockdev --setra counts 512-byte sectors: --setra 8192 is 4096 KiB.",
    ),
    Tunable(
        name="rq_affinity",
        path="queue/rq_affinity",
        description="Complete requests on the submitting CPU (1) or its exact core (2).",
        order=50,
        applies_to=_REQUEST_KINDS,
        minimum=0,
        maximum=2,
    ),
    Tunable(
        name="nomerges",
        path="queue/nomerges",
        description="Disable request merging: 0 all, 1 simple only, 2 none.",
        order=51,
        applies_to=_REQUEST_KINDS,
        minimum=0,
        maximum=2,
    ),
    Tunable(
        name="add_random",
        path="queue/add_random",
        description="Feed I/O timings to the entropy pool.",
        order=52,
        applies_to=_REQUEST_KINDS,
        minimum=0,
        maximum=1,
        resets=("read_ahead_kb",),
    ),
    Tunable(
        name="iostats",
        path="queue/iostats",
        description="Account I/O statistics for the device.",
        order=53,
        applies_to=_QUEUE_KINDS,
        minimum=0,
        maximum=1,
        resets=("read_ahead_kb",),
    ),
    Tunable(
        name="wbt_lat_usec",
        path="queue/wbt_lat_usec",
        description="Writeback throttling target latency; 0 disables it.",
        order=54,
        applies_to=_REQUEST_KINDS,
        unit="us",
        # The kernel's -1 ("back to default") cannot be verified by reading
        # back; removing the setting restores the recorded original instead.
        minimum=0,
        maximum=100_000_000,
    ),
    Tunable(
        name="queue_depth",
        path="device/queue_depth",
        description="SCSI device queue depth (outstanding commands to the LUN).",
        order=60,
        applies_to=frozenset({DeviceKind.DISK}),
        unit="commands",
        minimum=1,
        maximum=65_535,
        notes="The driver may clamp it to its can_queue; the read-back catches that.",
    ),
    Tunable(
        name="group_thread_cnt",
        path="md/group_thread_cnt",
        description="md RAID4/5/6 worker threads per group (0 = the md thread alone).",
        order=70,
        applies_to=_MD,
        unit="threads",
        minimum=0,
        maximum=8192,
    ),
    Tunable(
        name="stripe_cache_size",
        path="md/stripe_cache_size",
        description="md RAID4/5/6 stripe cache entries; costs entries x 4 KiB x member disks of RAM.",
        order=71,
        applies_to=_MD,
        unit="pages per device",
        minimum=17,
        maximum=32_768,
    ),
    SyncSpeedTunable(
        name="sync_speed_min",
        path="md/sync_speed_min",
        description="md resync/rebuild minimum speed, or 'system' for dev.raid.speed_limit_min.",
        order=72,
        applies_to=_MD,
        unit="KiB/s",
        minimum=0,
        maximum=2_000_000_000,
    ),
    SyncSpeedTunable(
        name="sync_speed_max",
        path="md/sync_speed_max",
        description="md resync/rebuild maximum speed, or 'system' for dev.raid.speed_limit_max.",
        order=73,
        applies_to=_MD,
        unit="KiB/s",
        minimum=0,
        maximum=2_000_000_000,
    ),
    # Controller policies come last: they live in the controller, not the kernel, so no kernel
    # write resets them, and putting them back last keeps the OS side restored first.
    ControllerTunable(
        name="controller_read_ahead",
        path="controller:read_policy",
        description="Read-ahead of the RAID controller for this volume (storcli rdcache, arcconf"
                    " read cache); adaptive starts it once it sees sequential reads.",
        order=90,
        applies_to=_VOLUME,
        scope="controller",
        setting="read_policy",
        known=("read-ahead", "no-read-ahead", "adaptive"),
        notes="Some controllers (ServeRAID 8 through arcconf) apply it only after a reboot:"
              " status shows pendingReboot until then, not drift.",
    ),
    ControllerTunable(
        name="controller_write_cache",
        path="controller:write_policy",
        description="Write cache policy of the RAID controller for this volume.",
        order=91,
        applies_to=_VOLUME,
        scope="controller",
        setting="write_policy",
        known=("write-through", "write-back", "always-write-back"),
        notes="write-back is refused while the controller's battery or CacheVault is absent or"
              " failed; always-write-back is the explicit choice to cache writes without one.",
    ),
    ControllerTunable(
        name="drive_write_cache",
        path="controller:drive_cache",
        description="Write cache of the physical drives behind this volume; 'default' leaves it"
                    " to the drive.",
        order=92,
        applies_to=_VOLUME,
        scope="controller",
        setting="drive_cache",
        known=("enabled", "disabled", "default"),
    ),
    Tunable(
        name="dev.raid.speed_limit_min",
        path="sys/dev/raid/speed_limit_min",
        description="Host-wide md resync minimum speed.",
        order=80,
        applies_to=_HOST,
        scope="host",
        unit="KiB/s",
        minimum=1,
        maximum=2_000_000_000,
    ),
    Tunable(
        name="dev.raid.speed_limit_max",
        path="sys/dev/raid/speed_limit_max",
        description="Host-wide md resync maximum speed.",
        order=81,
        applies_to=_HOST,
        scope="host",
        unit="KiB/s",
        minimum=1,
        maximum=2_000_000_000,
    ),
)


def get(name: str) -> Tunable:
    try:
        return CATALOG[name]
    except KeyError:
        raise KeyError(
            f"unknown tunable {name!r}; known: {', '.join(sorted(CATALOG))}"
        ) from None


_ORDERED = tuple(sorted(CATALOG.values(), key=lambda t: (t.order, t.name)))
_BY_KIND = {k: tuple(t for t in _ORDERED if k in t.applies_to) for k in DeviceKind}
#: What sysfs/procfs hold, per kind: what the kernel reader reads
_KERNEL_BY_KIND = {k: tuple(t for t in v if t.scope != "controller") for k, v in _BY_KIND.items()}
_RESET_BY = {t.name: tuple(c.name for c in _ORDERED if t.name in c.resets) for t in _ORDERED}


def ordered() -> list[Tunable]:
    """Tunables in application order (also the order of restore and rollback)."""
    return list(_ORDERED)


def for_kind(kind: DeviceKind) -> list[Tunable]:
    return list(_BY_KIND[kind])


def kernel_for_kind(kind: DeviceKind) -> list[Tunable]:
    """The tunables of this kind that live in sysfs/procfs (not in a RAID controller)."""
    return list(_KERNEL_BY_KIND[kind])


def reset_by(name: str) -> tuple[str, ...]:
    """The tunables whose write may reset ``name`` (the reverse of ``resets``)."""
    return _RESET_BY.get(name, ())


def depends_on(name: str) -> tuple[str, ...]:
    """The tunables of the same device ``name`` cannot be set without (``Tunable.depends_on``)."""
    return CATALOG[name].depends_on


@dataclass(frozen=True)
class Rejection:
    reason: str
    fatal: bool = True  # False: not applicable here, skipped with a note


@dataclass(frozen=True)
class DeviceFacts:
    """What a device-dependent check needs, independent of the topology model."""

    kind: DeviceKind
    supported: bool
    writable: bool
    choices: list[str] | None = None
    maximum: int | None = None
    unsupported_reason: str | None = None


def check_on_device(tunable: Tunable, value: Value, facts: DeviceFacts) -> Rejection | None:
    """Can ``value`` be set on this device as the kernel presents it now?"""
    if facts.kind not in tunable.applies_to:
        kinds = ", ".join(sorted(k.value for k in tunable.applies_to))
        hint = " (set it on the parent disk)" if facts.kind is DeviceKind.PARTITION else ""
        return Rejection(
            f"{tunable.name} does not apply to {facts.kind.value} devices, only to {kinds}{hint}",
            fatal=False,
        )
    if not facts.supported:
        why = facts.unsupported_reason or f"{tunable.path} is absent"
        return Rejection(f"{tunable.name} is not supported on this device: {why}", fatal=False)
    if not facts.writable:
        return Rejection(f"{tunable.name} is read-only on this device ({tunable.path})")
    if isinstance(tunable, ChoiceTunable) and facts.choices is not None and value not in facts.choices:
        return Rejection(
            f"{tunable.name} {value!r} is not offered by this kernel for this device;"
            f" offered: {', '.join(facts.choices)}"
        )
    if (
        tunable.bound_by
        and facts.maximum is not None
        and isinstance(value, int)
        and value > facts.maximum
    ):
        return Rejection(
            f"{tunable.name} {value} exceeds {tunable.bound_by.rsplit('/', 1)[-1]}"
            f" = {facts.maximum} for this device"
        )
    return None
