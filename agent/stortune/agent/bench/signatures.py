"""What a block device already holds, as util-linux's libblkid sees it.

A raw-device write benchmark destroys whatever is there, so before one the
agent lists every signature libblkid finds on the device with ``wipefs
--no-act --json`` (its listing mode: nothing is written): filesystems, RAID
and volume-manager members, encrypted volumes and partition tables, from the
same probes blkid and udev use (ZFS, Ceph BlueStore, VMFS, f2fs, ISO9660 and
DDF RAID included). wipefs is chosen over ``blkid -p`` because it lists every
signature with its offset, and because blkid's exit status 2 means both
"nothing found" and "could not open the device": a safety check cannot tell
those apart.

The probe fails closed: a missing tool, a timeout, an exit status other than
0, or output that is not wipefs' listing raises ``ProbeError``, and the write
is refused with that reason. Runs go through the agent's one ``ToolRunner``
(search path, timeout, process-group kill, bounded output).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stortune.agent.tools import ToolResult, ToolRunner

PROBE_TOOL = "wipefs"
#: Seconds: a healthy device answers in milliseconds; the control plane's StartBenchmark waits 10 s.
PROBE_TIMEOUT = 5.0
#: wipefs' listing of even a crowded device is a few KiB; more is not wipefs talking.
PROBE_MAX_OUTPUT = 1 << 20
_COLUMNS = "TYPE,OFFSET,USAGE"
#: Signatures named in a refusal; the rest are counted.
_NAMED = 8
_UNPRINTABLE = re.compile(r"[^A-Za-z0-9 _.,:+/()=-]")


class ProbeError(Exception):
    """The signature probe could not say what the device holds (the message says why)."""


@dataclass(frozen=True)
class Signature:
    kind: str  # libblkid's name: ext4, zfs_member, ceph_bluestore, linux_raid_member, gpt ...
    usage: str  # filesystem, raid, crypto, partition table, other ...
    offset: int  # byte offset of the magic on the device

    def __str__(self) -> str:
        usage = f" ({self.usage})" if self.usage else ""
        return f"{self.kind}{usage}, signature at byte {self.offset}"


def probe_tools(search_path: str | None = None) -> ToolRunner:
    """A runner for the probe: the agent's tool path, the probe's timeout and output bound."""
    return ToolRunner(search_path, timeout=PROBE_TIMEOUT, max_output=PROBE_MAX_OUTPUT)


def probe(node: Path, tools: ToolRunner) -> list[Signature]:
    """Every signature libblkid sees on ``node``, in offset order; ProbeError when it cannot tell."""
    exe = tools.which(PROBE_TOOL)
    if exe is None:
        raise ProbeError(f"{PROBE_TOOL} (util-linux) is not installed on the agent's tool path;"
                         " install util-linux, or give serve --tool-path")
    result = tools.run([exe, "--no-act", "--json", "--output", _COLUMNS, "--", str(node)])
    _check_ran(result, tools.timeout)
    return parse_listing(result.stdout)


def _check_ran(result: ToolResult, timeout: float) -> None:
    if result.error is not None:
        raise ProbeError(f"{PROBE_TOOL} could not be run: {clean(result.error)}")
    if result.timed_out:
        stuck = "; it could not be stopped (stuck in I/O?)" if result.abandoned else ""
        raise ProbeError(f"{PROBE_TOOL} did not answer within {timeout:g} s{stuck}")
    if result.truncated:
        raise ProbeError(f"{PROBE_TOOL} printed more than {PROBE_MAX_OUTPUT} bytes,"
                         " which is not its listing")
    if result.exit_code != 0:
        said = next((line for line in result.stderr.decode("utf-8", "replace").splitlines()
                     if line.strip()), "")
        raise ProbeError(f"{PROBE_TOOL} failed with exit status {result.exit_code}"
                         + (f": {clean(said)}" if said else ""))


def parse_listing(stdout: bytes) -> list[Signature]:
    """wipefs --json's ``{"signatures": [{"type", "offset", "usage"}, ...]}``; anything else is
    a ProbeError (the probe fails closed, so output it cannot read is not "nothing found")."""
    try:
        data: Any = json.loads(stdout.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ProbeError(f"{PROBE_TOOL} printed something other than its JSON listing:"
                         f" {clean(stdout[:80].decode('utf-8', 'replace'))!r}") from None
    items = data.get("signatures") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise ProbeError(f"{PROBE_TOOL}'s listing has no list of signatures")
    found = []
    for index, item in enumerate(items):
        kind = item.get("type") if isinstance(item, dict) else None
        offset = _offset(item.get("offset")) if isinstance(item, dict) else None
        usage = item.get("usage") if isinstance(item, dict) else None
        if not isinstance(kind, str) or not kind.strip() or offset is None:
            raise ProbeError(f"{PROBE_TOOL}'s listing: signature {index} has no type or offset")
        found.append(Signature(clean(kind), clean(usage) if isinstance(usage, str) else "", offset))
    return sorted(found, key=lambda s: s.offset)


def _offset(value: object) -> int | None:
    """wipefs prints offsets as hex strings ("0x438"); a number is accepted as it is."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, str) and len(value) <= 24:
        try:
            number = int(value, 0)
        except ValueError:
            return None
        return number if number >= 0 else None
    return None


def clean(text: str, limit: int = 60) -> str:
    """Tool output fit for a refusal message: no control characters or escapes, bounded."""
    text = _UNPRINTABLE.sub("?", text.strip())
    return text if len(text) <= limit else text[:limit] + "..."


def describe(device: str, signatures: list[Signature]) -> list[str]:
    """One refusal reason per signature, the first few by name."""
    reasons = [f"{device} holds {sig}" for sig in signatures[:_NAMED]]
    if len(signatures) > _NAMED:
        reasons.append(f"{device} holds {len(signatures) - _NAMED} more signature(s)")
    return reasons
