"""Collect a diagnostics bundle on this host: read only, and unredacted.

The bundle holds what support asks for when storage underperforms (the block,
md, lvm2, scsi, nvme, multipath and xfs parts of an sos report, storcli or
perccli output) next to what only stortune knows: the discovered topology with
every tunable's raw value. Redaction is a separate, pure step
(``stortune.schemas.redact``) so the control plane can add its own files to
the bundle first and mask everything consistently.

Nothing here writes to the host. Files are read through the injected procfs
root and commands run through an injected ``ToolRunner``, so fixture hosts and
fake tools stand in for a real machine in tests.
"""

from __future__ import annotations

import importlib.metadata
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from stortune.agent import discovery
from stortune.agent.kernelfs import KernelFS
from stortune.agent.tools import ToolResult, ToolRunner
from stortune.schemas.bundle import Bundle, BundleInfo, Missing
from stortune.schemas.topology import DeviceKind, Role, Topology

#: procfs tables, read whole, kept under the same relative path
PROC_TABLES = ("mdstat", "diskstats", "partitions", "self/mountinfo")

# Kernel messages about block devices, their transports and filesystems. Names need a
# digit where the bare word is common ("loop" in "delay loop" is not a loop device).
_STORAGE_LINE = re.compile(
    r"(?i)\b(?:sd[a-z]{1,3}\d*|sd \d+:\d+:\d+:\d+|sr\d+|scsi|ata\d+(?:\.\d+)?|ahci|libata"
    r"|nvme\d*(?:n\d+)?|md\d*|md/raid\d*|raid\d+|dm-\d+|device-mapper|multipathd?"
    r"|blk_update_request|blk-mq|i/o error|buffer i/o|critical medium error|medium error|sense key"
    r"|xfs|ext4-fs|ext4|btrfs|jbd2|megaraid_sas|mpt\dsas|qla2xxx|lpfc|iscsi\w*|virtio_blk|vd[a-z]+"
    r"|bcache|zram\d*|loop\d+|fc_host|fcoe|fip|fibre.channel|rport-[\d:-]+|nfs|lvm)\b")


@dataclass(frozen=True)
class Command:
    """One tool invocation: the first of ``names`` found runs with ``args``; stdout goes to ``path``."""

    tool: str
    names: tuple[str, ...]
    args: tuple[str, ...]
    path: str

    def line(self, executable: str | None = None) -> str:
        return shlex.join([executable or self.names[0], *self.args])


def version() -> str:
    try:
        return importlib.metadata.version("stortune")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _node(name: str) -> str:
    """The device node of a kernel name: ``cciss!c0d0`` is ``/dev/cciss/c0d0``."""
    return "/dev/" + name.replace("!", "/")


def commands(topo: Topology) -> list[Command]:
    """Every command to run for this topology, in the order they run."""
    out = [Command("lsblk", ("lsblk",), ("-J", "-O"), "commands/lsblk.json")]
    for dev in topo.devices:
        if dev.kind is DeviceKind.MD:
            out.append(Command("mdadm", ("mdadm",), ("--detail", _node(dev.name)),
                               f"commands/mdadm-detail/{dev.name}.txt"))
    # Multipath paths are SAN LUNs: no SMART data, and a thousand of them would take minutes.
    for dev in topo.devices:
        if dev.kind is DeviceKind.DISK and Role.MPATH_PATH not in dev.roles:
            out.append(Command("smartctl", ("smartctl",), ("-j", "-a", _node(dev.name)),
                               f"commands/smartctl/{dev.name.replace('!', '_')}.json"))
    out += [
        Command("nvme", ("nvme",), ("list", "-o", "json"), "commands/nvme-list.json"),
        Command("multipath", ("multipath",), ("-ll",), "commands/multipath-ll.txt"),
        Command("dmsetup", ("dmsetup",), ("table",), "commands/dmsetup-table.txt"),
    ]
    for mountpoint, name in _xfs_mounts(topo):
        out.append(Command("xfs_info", ("xfs_info",), (mountpoint,),
                           f"commands/xfs_info/{name.replace('!', '_')}.txt"))
    for tool in ("storcli", "perccli"):
        names = (tool, f"{tool}64")
        # controllers, arrays and enclosures; then every drive behind them (serials, media
        # errors). nolog: otherwise they write storcli.log/perccli.log into the working directory.
        out.append(Command(tool, names, ("/call", "show", "all", "J", "nolog"),
                           f"commands/{tool}/call-show-all.json"))
        out.append(Command(tool, names, ("/call/eall/sall", "show", "all", "J", "nolog"),
                           f"commands/{tool}/drives-show-all.json"))
    return out


def _xfs_mounts(topo: Topology) -> Iterator[tuple[str, str]]:
    """(a mountpoint, the device) of each device holding a mounted xfs. The file is named after
    the device, as smartctl's are: a mountpoint (/srv/acme) in a file name would outlive its
    redaction."""
    for dev in topo.devices:
        mount = next((m for m in dev.mounts if m.fstype == "xfs"), None)
        if mount is not None:
            yield mount.mountpoint, dev.name


def collect(fs: KernelFS, *, tools: ToolRunner | None = None, now: datetime | None = None) -> Bundle:
    """An unredacted bundle of this host (the one ``fs`` is rooted at) as it is now."""
    tools = tools or ToolRunner()
    topo = discovery.discover(fs)
    bundle = Bundle(info=BundleInfo(
        collector=f"stortune-agent {version()}",
        created=now or datetime.now(UTC),
        host=topo.hostname or "unknown",
    ))
    bundle.add("topology.json", topo.model_dump_json(indent=2) + "\n", source="generated",
               origin="stortune discovery of sysfs and procfs",
               note=f"{len(topo.devices)} devices; every tunable with its raw value")
    for rel in PROC_TABLES:
        text = fs.read_table(rel)
        origin = f"{fs.procfs}/{rel}"
        if text is None:
            reason = "not present (the md driver is not loaded)" if rel == "mdstat" else "cannot be read"
            bundle.fail(origin, reason)
        else:
            bundle.add(f"proc/{rel}", text, source="file", origin=origin)
    missing: dict[str, Missing] = {}
    for command in commands(topo):
        _run(bundle, tools, command, missing)
    _kernel_messages(bundle, tools, missing)
    bundle.info.missing = list(missing.values())
    return bundle


def _find(tools: ToolRunner, command: Command, missing: dict[str, Missing]) -> str | None:
    for name in command.names:
        found = tools.which(name)
        if found is not None:
            return found
    entry = missing.setdefault(command.tool, Missing(tool=command.tool, searched=list(command.names),
                                                     wanted_for=[]))
    entry.wanted_for.append(command.line())
    return None


def _run(bundle: Bundle, tools: ToolRunner, command: Command, missing: dict[str, Missing]) -> None:
    executable = _find(tools, command, missing)
    if executable is None:
        return
    result = tools.run([executable, *command.args])
    _record(bundle, command.line(executable), command.path, result, timeout=tools.timeout)


def _record(bundle: Bundle, line: str, path: str, result: ToolResult, *, timeout: float,
            stdout: bytes | None = None, note: str | None = None) -> None:
    """Keep a command's output and stderr; record why it failed, if it did."""
    if result.error is not None:
        bundle.fail(line, result.error)
        return
    out = result.stdout if stdout is None else stdout
    notes = "; ".join(n for n in (note, "output truncated" if result.truncated else None) if n)

    def keep(file: str, data: bytes, origin: str, comment: str | None = None) -> str:
        bundle.add(file, data, source="command", origin=origin, argv=result.argv,
                   exit_code=result.exit_code, duration_seconds=round(result.duration, 3), note=comment)
        return file

    kept: str | None = None
    if out or result.exit_code == 0:
        kept = keep(path, out, line, notes or None)
    if result.stderr.strip():
        kept = keep(f"{path}.stderr", result.stderr, f"stderr of {line}")
    if result.timed_out:
        reason = f"timed out after {timeout:g} s and was killed"
        if result.abandoned:
            reason += "; it did not exit (stuck in uninterruptible I/O?) and was left behind"
        bundle.fail(line, reason, kept)
    elif result.exit_code != 0:
        tail = result.stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
        bundle.fail(line, f"exit status {result.exit_code}" + (f": {' / '.join(tail)}" if tail else ""),
                    kept)


def _kernel_messages(bundle: Bundle, tools: ToolRunner, missing: dict[str, Missing]) -> None:
    """Storage-related lines of the kernel ring buffer (dmesg), and only those."""
    command = Command("dmesg", ("dmesg",), (), "kernel/storage-messages.txt")
    executable = _find(tools, command, missing)
    if executable is None:
        return
    result = tools.run([executable])
    lines = result.stdout.decode("utf-8", "replace").splitlines()
    kept = storage_lines(lines)
    text = "".join(f"{line}\n" for line in kept).encode()
    _record(bundle, command.line(executable), command.path, result, timeout=tools.timeout, stdout=text,
            note=f"{len(kept)} of {len(lines)} lines: storage-related only")


def storage_lines(lines: list[str]) -> list[str]:
    """The kernel messages ``collect`` keeps."""
    return [line for line in lines if _STORAGE_LINE.search(line)]
