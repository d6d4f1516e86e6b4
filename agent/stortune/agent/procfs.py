"""Parsers for the procfs tables discovery needs: text in, data out, no I/O.

Each parser takes the file's text exactly as the kernel prints it and returns
plain data plus the lines it could not make sense of, so that one odd line
(a newer kernel, a truncated read) costs that line and never the whole table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# The kernel's seq_file escaping (fs/proc_namespace.c mangle()): space, tab,
# newline and backslash become a backslash and three octal digits.
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


def unescape_octal(text: str) -> str:
    r"""``/srv/my\040disk`` -> ``/srv/my disk``."""
    if "\\" not in text:
        return text
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), text)


# -- /proc/<pid>/mountinfo --------------------------------------------------


@dataclass(frozen=True)
class MountInfo:
    """One line of mountinfo (proc_pid_mountinfo(5))."""

    mount_id: int
    parent_id: int
    major: int
    minor: int
    root: str
    mountpoint: str
    options: tuple[str, ...]
    optional: tuple[str, ...]  # shared:N, master:N, propagate_from:N, unbindable
    fstype: str
    source: str
    super_options: tuple[str, ...]

    @property
    def devno(self) -> str:
        return f"{self.major}:{self.minor}"


def _options(text: str) -> tuple[str, ...]:
    return tuple(unescape_octal(o) for o in text.split(",") if o)


def parse_mountinfo_line(line: str) -> MountInfo:
    """One mountinfo line; raises ValueError when it does not have mountinfo's shape."""
    fields = line.split(" ")
    try:
        sep = fields.index("-", 6)
    except ValueError:
        raise ValueError("no ' - ' separator after the mount options") from None
    if len(fields) < sep + 3:
        raise ValueError("fewer than 3 fields after the ' - ' separator")
    major, _, minor = fields[2].partition(":")
    # Everything after the separator is fstype, source, super options; a source
    # can never contain a raw space (it is escaped), so the split is exact.
    return MountInfo(
        mount_id=int(fields[0]),
        parent_id=int(fields[1]),
        major=int(major),
        minor=int(minor),
        root=unescape_octal(fields[3]),
        mountpoint=unescape_octal(fields[4]),
        options=_options(fields[5]),
        optional=tuple(fields[6:sep]),
        fstype=unescape_octal(fields[sep + 1]),
        source=unescape_octal(fields[sep + 2]),
        super_options=_options(" ".join(fields[sep + 3 :])),
    )


def parse_mountinfo(text: str) -> tuple[list[MountInfo], list[str]]:
    """All mounts, in the kernel's order, and a description of each line skipped."""
    mounts: list[MountInfo] = []
    problems: list[str] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            mounts.append(parse_mountinfo_line(line))
        except (ValueError, IndexError) as exc:
            problems.append(f"mountinfo line {lineno} skipped ({exc}): {line[:120]!r}")
    return mounts, problems


# -- /proc/mdstat -----------------------------------------------------------


@dataclass(frozen=True)
class MdStatMember:
    name: str  # sdb1
    index: int  # the [N] role number
    flags: tuple[str, ...] = ()  # F faulty, S spare, W write-mostly, R replacement, J journal


@dataclass
class MdStatArray:
    name: str
    active: bool
    read_only: str | None = None  # "read-only" / "auto-read-only"
    level: str | None = None  # raid5 ... (None for an inactive array)
    members: list[MdStatMember] = field(default_factory=list)
    blocks: int | None = None  # 1 KiB blocks
    metadata: str | None = None  # "1.2"; None means 0.90
    chunk_kib: int | None = None
    raid_disks: int | None = None
    active_disks: int | None = None
    status: str | None = None  # "UU_UU": one letter per slot, _ = missing
    action: str | None = None  # resync, recovery, check, reshape, repair
    progress_percent: float | None = None


_MD_HEADER = re.compile(r"^(md[\w]+)\s*:\s*(\S+)\s*(.*)$")
_MD_MEMBER = re.compile(r"^(\S+)\[(\d+)\]((?:\([A-Z]\))*)$")
_MD_STATUS = re.compile(r"\[(\d+)/(\d+)\]\s+\[([U_]+)\]")
_MD_PROGRESS = re.compile(r"\b(resync|recovery|check|reshape|repair)\s*=\s*([\d.]+)%")


def _md_header(name: str, state: str, rest: str) -> MdStatArray:
    array = MdStatArray(name=name, active=state == "active")
    words = rest.split()
    if words and words[0].startswith("(") and words[0].endswith(")"):
        array.read_only = words.pop(0)[1:-1]
    if array.active and words and "[" not in words[0]:
        array.level = words.pop(0)
    for word in words:
        m = _MD_MEMBER.match(word)
        if m is None:
            continue
        flags = tuple(f for f in m.group(3).replace("(", " ").replace(")", " ").split())
        array.members.append(MdStatMember(m.group(1), int(m.group(2)), flags))
    return array


def _md_detail(array: MdStatArray, line: str) -> None:
    if array.blocks is None and (m := re.match(r"\s*(\d+)\s+blocks", line)):
        array.blocks = int(m.group(1))
        if sm := re.search(r"\bsuper\s+(\S+)", line):
            array.metadata = sm.group(1)
        if cm := re.search(r"(\d+)[kK]\s+(?:chunks?|rounding)", line):
            array.chunk_kib = int(cm.group(1))
    if m := _MD_STATUS.search(line):
        array.raid_disks, array.active_disks = int(m.group(1)), int(m.group(2))
        array.status = m.group(3)
    if m := _MD_PROGRESS.search(line):
        array.action, array.progress_percent = m.group(1), float(m.group(2))
    elif re.search(r"\b(resync|recovery|check|reshape|repair)\s*=\s*(DELAYED|PENDING)", line):
        array.action = line.split("=", maxsplit=1)[0].rsplit(maxsplit=1)[-1]


def parse_mdstat(text: str) -> tuple[dict[str, MdStatArray], list[str]]:
    """Arrays by name and lines skipped. Detail lines belong to the last header seen."""
    arrays: dict[str, MdStatArray] = {}
    problems: list[str] = []
    current: MdStatArray | None = None
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            current = None
            continue
        if line.startswith(("Personalities", "unused devices")):
            current = None
            continue
        if not line[0].isspace():
            m = _MD_HEADER.match(line)
            if m is None:
                problems.append(f"mdstat line {lineno} skipped: {line[:120]!r}")
                current = None
                continue
            current = _md_header(m.group(1), m.group(2), m.group(3))
            arrays[current.name] = current
        elif current is not None:
            _md_detail(current, line)
    return arrays, problems


# -- /proc/partitions -------------------------------------------------------


@dataclass(frozen=True)
class PartitionEntry:
    major: int
    minor: int
    blocks: int  # 1 KiB blocks
    name: str

    @property
    def devno(self) -> str:
        return f"{self.major}:{self.minor}"


def parse_partitions(text: str) -> tuple[dict[str, PartitionEntry], list[str]]:
    """Block devices by kernel name (the header and blank lines are not problems)."""
    entries: dict[str, PartitionEntry] = {}
    problems: list[str] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        words = line.split()
        if not words or words[0] == "major":
            continue
        if len(words) != 4 or not (words[0].isdigit() and words[1].isdigit() and words[2].isdigit()):
            problems.append(f"partitions line {lineno} skipped: {line[:120]!r}")
            continue
        entry = PartitionEntry(int(words[0]), int(words[1]), int(words[2]), words[3])
        entries[entry.name] = entry
    return entries, problems


# -- /proc/diskstats ----------------------------------------------------------


@dataclass(frozen=True)
class DiskStat:
    """One line of /proc/diskstats (Documentation/admin-guide/iostats.rst).

    Times are milliseconds. Kernels before 4.18 print no discard fields and
    before 5.5 no flush fields: those are None, not 0.
    """

    major: int
    minor: int
    name: str
    reads: int
    reads_merged: int
    sectors_read: int  # 512-byte units, whatever the device's block size
    read_ms: int
    writes: int
    writes_merged: int
    sectors_written: int
    write_ms: int
    in_flight: int
    io_ms: int  # time with at least one I/O in flight (utilisation)
    weighted_ms: int  # in-flight count x time (average queue size)
    discards: int | None = None
    discard_ms: int | None = None
    flushes: int | None = None
    flush_ms: int | None = None

    @property
    def devno(self) -> str:
        return f"{self.major}:{self.minor}"


def parse_diskstats(text: str) -> tuple[dict[str, DiskStat], list[str]]:
    """Counters by kernel name, and the lines that could not be read."""
    stats: dict[str, DiskStat] = {}
    problems: list[str] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        words = line.split()
        if not words:
            continue
        try:
            if len(words) < 14:
                raise ValueError(f"{len(words)} fields, at least 14 expected")
            major, minor = int(words[0]), int(words[1])
            n = [int(w) for w in words[3:]]
        except ValueError as exc:
            problems.append(f"diskstats line {lineno} skipped ({exc}): {line[:120]!r}")
            continue
        discard = (n[11], n[14]) if len(n) >= 15 else (None, None)
        flush = (n[15], n[16]) if len(n) >= 17 else (None, None)
        stats[words[2]] = DiskStat(
            major=major, minor=minor, name=words[2], reads=n[0], reads_merged=n[1],
            sectors_read=n[2], read_ms=n[3], writes=n[4], writes_merged=n[5],
            sectors_written=n[6], write_ms=n[7], in_flight=n[8], io_ms=n[9], weighted_ms=n[10],
            discards=discard[0], discard_ms=discard[1], flushes=flush[0], flush_ms=flush[1],
        )
    return stats, problems


#: Far above any machine's RAM (1 EiB), far below what a corrupt line could claim.
_MEMINFO_MAX_KIB = 1 << 50


def parse_meminfo_total(text: str) -> int | None:
    """MemTotal of /proc/meminfo in bytes (the kernel prints kB meaning KiB); None when absent
    or not a sane number."""
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key.strip() != "MemTotal":
            continue
        words = rest.split()
        number = words[0] if words else ""
        # isascii: str.isdigit takes "²", which int() refuses
        if not (number.isascii() and number.isdigit()) or (len(words) > 1 and words[1] != "kB"):
            return None
        kib = int(words[0]) if len(words[0]) <= 20 else _MEMINFO_MAX_KIB + 1
        return kib * 1024 if 0 < kib <= _MEMINFO_MAX_KIB else None
    return None


# -- /proc/swaps ------------------------------------------------------------


def parse_swaps(text: str) -> list[str]:
    """What backs swap (a device node or a file), in the kernel's order: the first column
    of every line after the header, unescaped as mountinfo's paths are."""
    out: list[str] = []
    for line in text.splitlines()[1:]:
        words = line.split()
        if words and words[0].startswith("/"):
            out.append(unescape_octal(words[0]))
    return out
