"""TuneD profiles (``tuned.conf``) to and from StorageProfiles: the pure conversion.

Import keeps what stortune manages (the ``[disk]`` plugin's ``readahead`` and ``elevator``
with its ``devices=`` globs, ``[sysfs]`` lines naming a block device attribute of the
catalog, ``[sysctl]`` lines naming a host tunable of the catalog) and lists every other line
with the reason it was left out. Files are found through a ``ProfileSource`` (the reading
lives in the CLI): this module does no I/O, evaluates nothing (``${f:...}`` functions are
reported, never run) and bounds what one import may read.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Protocol

from pydantic import ValidationError

from stortune.schemas import catalog
from stortune.schemas.catalog import Tunable, TunableValueError
from stortune.schemas.patterns import PatternError, check_glob
from stortune.schemas.profile import Rule, StorageProfile
from stortune.schemas.topology import DeviceKind

#: A TuneD profile is a few KiB; anything above this is not one (and is never read whole).
MAX_FILE_BYTES: Final = 1024 * 1024
#: Files one import may read, the starting one included (TuneD's own profiles nest 3 deep).
MAX_FILES: Final = 16
MAX_INCLUDE_DEPTH: Final = 8
#: Substitution passes for ``${var}`` referring to other variables.
MAX_VARIABLE_PASSES: Final = 8
#: Characters a value may grow to by substitution: passes alone do not bound it (seven levels of
#: a variable used 60 times is 60**7 characters from a 2 KiB file).
MAX_EXPANDED_CHARS: Final = 16 * 1024
#: Where TuneD looks for profiles by name, highest priority first (TuneD 2.x and >= 2.23).
TUNED_DIRS: Final = ("/etc/tuned/profiles", "/etc/tuned", "/usr/lib/tuned/profiles", "/usr/lib/tuned")

_PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_READAHEAD = re.compile(r"(>)?\s*(\d{1,12})(\s+s)?")
_VARIABLE = re.compile(r"\$\{([^}]{0,256})\}")
_RULE_LABEL = re.compile(r"[^a-z0-9-]+")
#: Legacy single-queue elevators and their multi-queue successors (Linux >= 5.0 has only these).
_ELEVATOR_ALIASES: Final = {"deadline": "mq-deadline", "noop": "none"}
_DISK_OPTIONS: Final = ("readahead", "elevator", "devices")
#: Options of any TuneD unit that select or switch it, not settings.
_UNIT_CONDITIONS: Final = ("uname_regex", "cpuinfo_regex", "devices_udev_regex")
_PLUGIN_REASONS: Final = {
    "sysctl": "kernel parameter (sysctl) outside stortune's catalog",
    "vm": "memory management (vm plugin) is not stortune's job",
    "cpu": "CPU tuning (cpu plugin) is not stortune's job",
    "scheduler": "process scheduling (scheduler plugin) is not stortune's job",
    "irqbalance": "interrupt placement is not stortune's job",
    "bootloader": "kernel command line (bootloader plugin) is not stortune's job",
    "net": "network tuning is not stortune's job",
    "audio": "audio power saving is not stortune's job",
    "video": "video power saving is not stortune's job",
    "usb": "USB autosuspend is not stortune's job",
    "scsi_host": "SCSI host link power management is not in stortune's catalog",
    "script": "scripts are not run by stortune",
    "service": "system services are not stortune's job",
    "systemd": "systemd settings are not stortune's job",
    "selinux": "SELinux is not stortune's job",
    "modules": "kernel module options are not stortune's job",
    "mounts": "mount options are not in stortune's catalog",
}
#: The attributes a ``/sys/block/GLOB/ATTR`` line may name: per-device catalog tunables.
_SYSFS_TUNABLES: Final = {t.path: t for t in catalog.ordered() if t.scope == "device"}
_SYSCTL_TUNABLES: Final = {t.name: t for t in catalog.ordered() if t.scope == "host"}
_DISK_ONLY: Final = [DeviceKind.DISK]


class TunedFileError(Exception):
    """A profile file that cannot be read (missing, too large, not text, a symlink)."""


@dataclass(frozen=True)
class Found:
    location: str  #: shown in reports: the file's path
    directory: str  #: the directory holding the profile's own directory (for same-name includes)
    text: str


class ProfileSource(Protocol):
    def find(self, name: str, skip_directory: str | None) -> Found | None:
        """Profile ``name`` (already validated) from the search directories, the first that
        has it, skipping ``skip_directory``; None when none has it. Raises TunedFileError."""
        ...


@dataclass(frozen=True)
class Line:
    location: str
    number: int
    key: str
    value: str

    @property
    def where(self) -> str:
        return f"{self.location}:{self.number}"

    @property
    def text(self) -> str:
        return f"{self.key} = {self.value}" if self.key else self.value


@dataclass(frozen=True)
class Skipped:
    where: str  #: file:line, or the file alone for whole-file problems
    line: str
    reason: str


@dataclass
class Unit:
    """One ``[section]`` after includes merged: its options by key, in file order."""

    name: str
    options: dict[str, Line] = field(default_factory=dict)
    header: str = ""

    @property
    def plugin(self) -> str:
        given = self.options.get("type")
        return given.value.strip() if given else self.name


@dataclass
class TunedImport:
    name: str
    summary: str | None
    rules: list[Rule]
    skipped: list[Skipped]
    #: conversions that are close but not exact (``>`` "only raise" became "set")
    notes: list[str]
    files: list[str]

    def profile(self) -> StorageProfile | None:
        """The StorageProfile, or None when nothing converted (a profile holds >= 1 rule)."""
        if not self.rules:
            return None
        annotations = {"stortune.io/imported-from": f"tuned:{self.name}"[:200]}
        if self.summary:
            annotations["stortune.io/tuned-summary"] = self.summary[:1000]
        return StorageProfile.model_validate({
            "metadata": {"name": profile_name(self.name), "annotations": annotations},
            "spec": {"rules": [r.model_dump(by_alias=True, exclude_none=True) for r in self.rules]},
        })


def profile_name(tuned_name: str) -> str:
    """A StorageProfile name for a TuneD profile name (RFC 1123)."""
    label = re.sub(r"[^a-z0-9.-]+", "-", tuned_name.lower()).strip("-.")
    return f"tuned-{label}"[:253].rstrip("-.") if label else "tuned"


def valid_profile_name(name: str) -> bool:
    """A TuneD profile name that stays a directory name: no '/', no '..'."""
    return bool(_PROFILE_NAME.fullmatch(name)) and ".." not in name


# Parsing ---------------------------------------------------------------------------------


def parse(text: str, location: str) -> tuple[list[Unit], list[Skipped]]:
    """Sections and their options, in file order; a repeated section adds to the first."""
    if len(text) > MAX_FILE_BYTES:
        raise TunedFileError(f"{location}: larger than {MAX_FILE_BYTES} bytes; not a TuneD profile")
    units: dict[str, Unit] = {}
    skipped: list[Skipped] = []
    current: Unit | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not stripped or stripped.startswith(("#", ";")):
            continue
        if stripped.startswith("[") and stripped.endswith("]"):
            name = stripped[1:-1].strip()
            current = units.setdefault(name, Unit(name, header=f"{location}:{number}"))
            continue
        key, sep, value = stripped.partition("=")
        line = Line(location, number, key.strip(), value.strip())
        if not sep or not line.key:
            skipped.append(Skipped(line.where, stripped[:200], "not a 'key = value' line"))
        elif current is None:
            skipped.append(Skipped(line.where, line.text[:200], "outside any [section]"))
        else:
            current.options[line.key] = line
    return list(units.values()), skipped


# Includes --------------------------------------------------------------------------------


@dataclass
class _Loader:
    source: ProfileSource
    skipped: list[Skipped]
    files: list[str] = field(default_factory=list)

    def load(self, found: Found, chain: tuple[str, ...]) -> dict[str, Unit]:
        """The units of ``found`` with its includes merged under it (TuneD's order: included
        first, the including profile's options override theirs, ``replace=1`` drops them)."""
        self.files.append(found.location)
        units, bad = parse(found.text, found.location)
        self.skipped.extend(bad)
        merged: dict[str, Unit] = {}
        main = next((u for u in units if u.name == "main"), None)
        include = main.options.get("include") if main else None
        if include is not None:
            for name in re.split(r"[\s,;]+", include.value):
                if name:
                    self._merge(merged, self._included(name, include, found, chain))
        for unit in units:
            if "replace" in unit.options and unit.options["replace"].value.strip().lower() in (
                    "1", "true", "yes", "on"):
                merged.pop(unit.name, None)
            self._merge(merged, {unit.name: unit})
        return merged

    @staticmethod
    def _merge(into: dict[str, Unit], units: dict[str, Unit]) -> None:
        for name, unit in units.items():
            target = into.setdefault(name, Unit(name, header=unit.header))
            target.options.update(unit.options)

    def _included(self, name: str, line: Line, found: Found, chain: tuple[str, ...]) -> dict[str, Unit]:
        def skip(reason: str) -> dict[str, Unit]:
            self.skipped.append(Skipped(line.where, f"include = {name}"[:200], reason))
            return {}

        if "${" in name:
            return skip("the profile name is computed by a TuneD function or variable on the host")
        if not valid_profile_name(name):
            return skip("not a profile name (letters, digits, '.', '_', '-'; no '/' or '..')")
        if len(chain) >= MAX_INCLUDE_DEPTH:
            return skip(f"includes nest deeper than {MAX_INCLUDE_DEPTH}")
        if len(self.files) >= MAX_FILES:
            return skip(f"more than {MAX_FILES} files in one import")
        # A profile including its own name extends the one of that name further down the search.
        own = found.location.rstrip("/").split("/")[-2:-1]
        skip_dir = found.directory if own == [name] else None
        try:
            included = self.source.find(name, skip_dir)
        except TunedFileError as exc:
            return skip(str(exc))
        if included is None:
            return skip("no such profile in the TuneD profile directories")
        if included.location in chain:
            return skip(f"include cycle: {' -> '.join((*chain, included.location))}")
        return self.load(included, (*chain, included.location))


# Conversion ------------------------------------------------------------------------------


@dataclass
class _Converter:
    variables: dict[str, str]
    skipped: list[Skipped]
    notes: list[str]
    rules: list[Rule] = field(default_factory=list)

    def skip(self, line: Line, reason: str) -> None:
        self.skipped.append(Skipped(line.where, line.text[:200], reason))

    def value(self, line: Line) -> str | None:
        """The value with ``${var}`` substituted, or None (reported) when it cannot be."""
        value = line.value
        for _ in range(MAX_VARIABLE_PASSES):
            refs = dict.fromkeys(_VARIABLE.findall(value))
            if not refs:
                return value
            for ref in refs:
                if ":" in ref:
                    self.skip(line, f"${{{ref}}} is a TuneD function evaluated on the host")
                    return None
                if ref not in self.variables:
                    self.skip(line, f"${{{ref}}} is not defined in [variables]")
                    return None
                # The size is known before the string is built, so a hostile one never is.
                token, replacement = f"${{{ref}}}", self.variables[ref]
                size = len(value) + value.count(token) * (len(replacement) - len(token))
                if size > MAX_EXPANDED_CHARS:
                    self.skip(line, f"${{{ref}}} expands the value to {size} characters, more than "
                                    f"{MAX_EXPANDED_CHARS}: define the value without repeating variables")
                    return None
                value = value.replace(token, replacement)
        self.skip(line, f"variables nest deeper than {MAX_VARIABLE_PASSES}")
        return None

    def add_rule(self, base: str, match: dict[str, object], settings: dict[str, object],
                 lines: list[Line]) -> None:
        name = self._rule_name(base)
        try:
            self.rules.append(Rule.model_validate({"name": name, "match": match, "settings": settings}))
        except ValidationError as exc:
            reason = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())[:300]
            for line in lines:
                self.skip(line, f"not a valid stortune rule: {reason}")

    def _rule_name(self, base: str) -> str:
        label = _RULE_LABEL.sub("-", base.lower()).strip("-")[:50].strip("-") or "rule"
        taken = {r.name for r in self.rules}
        name, n = label, 2
        while name in taken:
            name, n = f"{label}-{n}", n + 1
        return name

    # [disk] ---------------------------------------------------------------------------

    def disk(self, unit: Unit) -> None:
        settings: dict[str, object] = {}
        used: list[Line] = []
        for key, line in unit.options.items():
            if key == "type" or key in _DISK_OPTIONS:
                continue
            if key == "dynamic":
                self.skip(line, "dynamic tuning is not stortune's job (stortune sets fixed values)")
            else:
                self.skip(line, f"the disk plugin's {key!r} has no stortune tunable")
        for key, convert, tunable in (("readahead", self._readahead, "read_ahead_kb"),
                                      ("elevator", self._elevator, "scheduler")):
            given = unit.options.get(key)
            if given is None:
                continue
            value = self.value(given)
            converted = convert(given, value) if value is not None else None
            if converted is not None:
                settings[tunable] = converted
                used.append(given)
        if not settings:
            if "devices" in unit.options:
                self.skip(unit.options["devices"], "no convertible setting in this unit")
            return
        match = self._devices(unit, used)
        if match is not None:
            self.add_rule(unit.name, match, settings, used)

    def _devices(self, unit: Unit, used: list[Line]) -> dict[str, object] | None:
        line = unit.options.get("devices")
        if line is None:
            # The disk plugin tunes whole disks only (SCSI, virtio, Xen, NVMe): stortune's "disk".
            return {"kind": _DISK_ONLY}
        value = self.value(line)
        if value is None:
            self._drop(used, "its unit's devices= cannot be resolved")
            return None
        globs = [g for g in re.split(r"[\s,;]+", value) if g]
        why = None
        if any(g.startswith("!") for g in globs):
            why = "devices= excludes devices with '!'; a stortune match has no exclusion"
        elif not globs:
            why = "devices= is empty"
        for glob in globs:
            try:
                check_glob(glob)
            except PatternError as exc:
                why = why or f"device glob {glob!r}: {exc}"
            if "/" in glob or ".." in glob or "\x00" in glob:
                why = why or f"device glob {glob!r} is not a kernel device name"
        if why:
            self.skip(line, why)
            self._drop(used, f"its unit's devices= cannot be expressed ({why})")
            return None
        used.append(line)
        return {"kind": _DISK_ONLY, "name": globs}

    def _drop(self, used: list[Line], reason: str) -> None:
        for line in used:
            self.skip(line, reason)
        used.clear()

    def _readahead(self, line: Line, value: str) -> int | None:
        # TuneD: KiB by default, "N s" for 512-byte sectors, ">N" raises only.
        found = _READAHEAD.fullmatch(value.strip())
        if not found:
            self.skip(line, "readahead is not '[>]N' (KiB) or '[>]N s' (sectors)")
            return None
        raise_only, number, sectors = found.groups()
        kib = int(number)
        if sectors:
            if kib % 2:
                self.skip(line, f"{kib} sectors is not a whole KiB")
                return None
            kib //= 2
        if not self._valid(line, "read_ahead_kb", kib):
            return None
        if raise_only:
            self.notes.append(f"{line.where}: readahead '>' (only raise) became read_ahead_kb = {kib}:"
                              " stortune sets the value, so a device already above it is lowered")
        return kib

    def _elevator(self, line: Line, value: str) -> str | None:
        name = value.strip()
        chosen = _ELEVATOR_ALIASES.get(name, name)
        if name in ("cfq", "anticipatory"):
            self.skip(line, f"{name} was removed from Linux (5.0 and earlier); bfq is the nearest,"
                            " but not the same: choose it by hand")
            return None
        if "," in name:
            self.skip(line, "a list of elevators to try has no stortune equivalent (one scheduler per rule)")
            return None
        if not self._valid(line, "scheduler", chosen):
            return None
        if chosen != name:
            self.notes.append(f"{line.where}: elevator {name} is {chosen} on multi-queue kernels")
        return chosen

    def _valid(self, line: Line, tunable: str, value: object) -> bool:
        try:
            catalog.get(tunable).validate(value)
        except TunableValueError as exc:
            self.skip(line, f"{tunable} {exc}")
            return False
        return True

    # [sysfs] and [sysctl] ---------------------------------------------------------------

    def sysfs(self, unit: Unit) -> None:
        by_glob: dict[str, tuple[dict[str, object], list[Line]]] = {}
        for key, line in unit.options.items():
            if key == "type":
                continue
            parts = key.split("/")
            if parts[:3] == ["", "sys", "block"] and len(parts) >= 5:
                glob, attribute = parts[3], "/".join(parts[4:])
            elif parts[:4] == ["", "sys", "class", "block"] and len(parts) >= 6:
                glob, attribute = parts[4], "/".join(parts[5:])
            else:
                self.skip(line, "not a block device attribute (/sys/block/NAME/...)")
                continue
            tunable = _SYSFS_TUNABLES.get(attribute)
            if tunable is None:
                self.skip(line, f"{attribute} is not a tunable in stortune's catalog")
                continue
            value = self.value(line)
            converted = self._typed(line, tunable, value) if value is not None else None
            if converted is None:
                continue
            settings, lines = by_glob.setdefault(glob, ({}, []))
            settings[tunable.name] = converted
            lines.append(line)
        for glob, (settings, lines) in by_glob.items():
            self.add_rule(f"{unit.name}-{glob}" if glob != "*" else unit.name,
                          {"name": [glob]}, settings, lines)

    def sysctl(self, unit: Unit) -> None:
        settings: dict[str, object] = {}
        lines: list[Line] = []
        for key, line in unit.options.items():
            if key == "type":
                continue
            tunable = _SYSCTL_TUNABLES.get(key.replace("/", "."))
            if tunable is None:
                self.skip(line, _PLUGIN_REASONS["sysctl"])
                continue
            value = self.value(line)
            converted = self._typed(line, tunable, value) if value is not None else None
            if converted is not None:
                settings[tunable.name] = converted
                lines.append(line)
        if settings:
            self.add_rule(unit.name, {"kind": [DeviceKind.HOST]}, settings, lines)

    def _typed(self, line: Line, tunable: Tunable, value: str) -> int | str | None:
        text = value.strip()
        if text.startswith(">"):
            self.skip(line, "'>' (only raise) on a sysfs or sysctl value has no stortune equivalent")
            return None
        typed: int | str = text
        if not isinstance(tunable, catalog.ChoiceTunable):
            if not re.fullmatch(r"-?\d{1,12}", text):
                self.skip(line, f"{tunable.name} needs an integer, got {text[:40]!r}")
                return None
            typed = int(text)
        try:
            tunable.validate(typed)
        except TunableValueError as exc:
            self.skip(line, f"{tunable.name} {exc}")
            return None
        return typed


def _conditional(unit: Unit) -> str | None:
    for key in _UNIT_CONDITIONS:
        if key in unit.options:
            return f"the unit applies only where {key} matches on the host; stortune cannot evaluate it"
    return None


def convert_units(units: dict[str, Unit], name: str, skipped: list[Skipped],
                  files: list[str]) -> TunedImport:
    variables_unit = units.pop("variables", None)
    variables: dict[str, str] = {}
    converter = _Converter(variables, skipped, [])
    if variables_unit is not None:
        for key, line in variables_unit.options.items():
            if key == "include":
                converter.skip(line, "variable files are not read; variables they define stay unresolved")
            else:
                variables[key] = line.value
    summary: str | None = None
    main = units.pop("main", None)
    for key, line in (main.options.items() if main else ()):
        if key == "summary":
            summary = line.value.replace("\n", " ")
        elif key == "include":
            continue  # resolved while loading
        elif key == "dynamic_tuning":
            converter.skip(line, "dynamic tuning is not stortune's job (stortune sets fixed values)")
        else:
            converter.skip(line, f"[main] {key} has no stortune equivalent")
    handlers: dict[str, Callable[[Unit], None]] = {
        "disk": converter.disk, "sysfs": converter.sysfs, "sysctl": converter.sysctl}
    for unit in units.values():
        handler = handlers.get(unit.plugin)
        enabled = unit.options.get("enabled")
        if enabled is not None and enabled.value.strip().lower() in ("0", "false", "no", "off"):
            for line in unit.options.values():
                converter.skip(line, f"unit [{unit.name}] is disabled")
            continue
        condition = _conditional(unit)
        if handler is None or condition:
            fallback = f"TuneD plugin {unit.plugin!r} has no stortune equivalent"
            reason = condition or _PLUGIN_REASONS.get(unit.plugin, fallback)
            for line in unit.options.values():
                converter.skip(line, reason)
            continue
        handler(unit)
    return TunedImport(name, summary, converter.rules, skipped, converter.notes, files)


def import_profile(found: Found, name: str, source: ProfileSource) -> TunedImport:
    """Convert the profile in ``found`` (named ``name``) with its includes from ``source``."""
    skipped: list[Skipped] = []
    loader = _Loader(source, skipped)
    units = loader.load(found, (found.location,))
    return convert_units(units, name, skipped, loader.files)


# Export ----------------------------------------------------------------------------------

_TUNED_UNSAFE = re.compile(r"[\s,;#!=\[\]]|^$")


@dataclass
class TunedExport:
    text: str
    #: "rule X: why" for every setting or rule the tuned.conf does not carry
    left_out: list[str]


def _one_line(text: str) -> str:
    return " ".join(text.split())[:400]


def export_profile(profile: StorageProfile) -> TunedExport:
    """A tuned.conf doing what ``profile`` does, where TuneD can express it.

    ``[disk]`` carries read-ahead (KiB) and the elevator for rules matching disks by kind and
    name; ``[sysfs]`` carries the other device attributes by name glob; ``[sysctl]`` the host
    tunables. Matches on facts TuneD cannot see (model, size, role...) are left out, with why.
    """
    left_out: list[str] = []
    summary = profile.metadata.annotations.get("stortune.io/tuned-summary") or (
        f"Exported by stortune from StorageProfile {profile.name}")
    out = ["# Written by `stortune export tuned`; the source of truth is StorageProfile "
           f"{profile.name}.", "", "[main]", f"summary={_one_line(summary)}"]
    for rule in profile.spec.rules:
        out.extend(_export_rule(rule, left_out))
    return TunedExport("\n".join(out) + "\n", left_out)


def _export_rule(rule: Rule, left_out: list[str]) -> list[str]:
    match = rule.match
    values = rule.values()
    others = sorted(f for f in match.model_fields_set
                    if f not in ("kind", "name") and getattr(match, f) is not None)
    if others:
        left_out.append(f"rule {rule.name}: matches on {', '.join(others)}, which TuneD units cannot"
                        f" select by; left out: {', '.join(values)}")
        return []
    globs = match.name
    if globs is not None:
        bad = [g for g in globs if _TUNED_UNSAFE.search(g)]
        if bad:
            left_out.append(f"rule {rule.name}: name globs {bad} cannot be written in a TuneD"
                            f" device list; left out: {', '.join(values)}")
            return []
    kinds = set(match.kind) if match.kind is not None else None
    disk: dict[str, str] = {}
    sysfs: list[str] = []
    sysctl: list[str] = []
    for name, value in values.items():
        tunable = catalog.get(name)
        if tunable.scope == "host":
            sysctl.append(f"{name} = {value}")
        elif tunable.scope == "controller":
            left_out.append(f"rule {rule.name}: {name} = {value} lives in the RAID controller, which"
                            " TuneD cannot reach; left to stortune (or the vendor tool)")
        elif kinds == {DeviceKind.DISK} and name == "read_ahead_kb":
            disk["readahead"] = str(value)
        elif kinds == {DeviceKind.DISK} and name == "scheduler":
            disk["elevator"] = str(value)
        elif not isinstance(value, int) and not isinstance(tunable, catalog.ChoiceTunable):
            left_out.append(f"rule {rule.name}: {name} = {value} is not a fixed value TuneD can write")
        elif globs is None and kinds is not None:
            left_out.append(f"rule {rule.name}: {name} matches by kind "
                            f"{sorted(k.value for k in kinds)} only; [sysfs] globs cannot select by kind")
        else:
            for glob in globs or ["*"]:
                sysfs.append(f"/sys/block/{glob}/{tunable.path} = {value}")
    lines: list[str] = []
    if disk:
        lines += ["", f"[{rule.name}-disk]", "type=disk"]
        if globs is not None:
            lines.append(f"devices={','.join(globs)}")
        lines += [f"{k}={v}" for k, v in disk.items()]
    if sysfs:
        lines += ["", f"[{rule.name}-sysfs]", "type=sysfs", *sysfs]
    if sysctl:
        lines += ["", f"[{rule.name}-sysctl]", "type=sysctl", *sysctl]
    return lines
