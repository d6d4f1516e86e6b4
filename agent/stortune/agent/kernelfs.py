"""The agent's one seam to the kernel: sysfs, procfs and /dev under injected roots.

Every read and write of the agent goes through a ``KernelFS``. Tests pass a
fixture tree; production passes ``/sys``, ``/proc`` and ``/dev`` (device nodes,
which only benchmarks open). Writes are confined:
a device name must be a plain kernel name, the attribute path must come from
the tunable catalog, and the resolved target must stay inside the root.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from stortune.schemas.catalog import Tunable
from stortune.schemas.topology import is_device_name

if TYPE_CHECKING:
    from stortune.agent.controllers.access import ControllerAccess

TABLE_MAX = 64 << 20  # bytes of one procfs table read whole


class UnsafePathError(ValueError):
    """A device name or attribute path that could escape the kernel roots."""


class KernelWriteError(OSError):
    """Writing an attribute failed; carries the kernel's errno and text."""


def check_device_name(name: str) -> str:
    if not is_device_name(name):  # the topology model's rule: sda, nvme0n1p2, cciss!c0d0 ...
        raise UnsafePathError(f"device name {name!r} is not a kernel block device name")
    return name


def _check_relative(rel: str) -> str:
    parts = rel.split("/")
    if rel.startswith("/") or "\x00" in rel or any(p in ("", ".", "..") for p in parts):
        raise UnsafePathError(f"attribute path {rel!r} must be relative and plain")
    return rel


@dataclass(frozen=True)
class KernelFS:
    sysfs: Path
    procfs: Path
    dev: Path = Path("/dev")
    #: The other seam a host's settings live behind: its RAID controllers' vendor tools.
    #: Carried here so every operation that gets the kernel gets the controllers too.
    controllers: ControllerAccess | None = field(default=None, compare=False, repr=False)

    @classmethod
    def at(cls, sysfs: str | Path = "/sys", procfs: str | Path = "/proc",
           dev: str | Path = "/dev", controllers: ControllerAccess | None = None) -> KernelFS:
        return cls(Path(sysfs), Path(procfs), Path(dev), controllers)

    def device_node(self, name: str) -> Path:
        """The device node of a kernel name: ``cciss!c0d0`` lives at ``<dev>/cciss/c0d0``."""
        return self.dev / check_device_name(name).replace("!", "/")

    # -- reads (never raise for a missing attribute) ----------------------
    @cached_property
    def _roots(self) -> tuple[tuple[str, ...], frozenset[int]]:
        """The real root paths, and the filesystems mounted right at a root (/sys, /proc):
        every file on one of those lies under its root, by st_dev, without a readlink."""
        prefixes: list[str] = []
        mounted: set[int] = set()
        for root in (self.sysfs, self.procfs):
            real = os.path.realpath(root)
            prefixes.append(os.path.join(real, ""))
            try:
                dev = os.stat(real).st_dev
                if real != "/" and dev != os.stat(os.path.dirname(real)).st_dev:
                    mounted.add(dev)
            except OSError:
                continue
        return tuple(prefixes), frozenset(mounted)

    def _open_attribute(self, path: Path | str) -> int | None:
        """A read-only descriptor of a regular file inside the roots, else None.

        O_NONBLOCK: a FIFO in a hand-made tree would block open() until a writer came.
        Only regular files: sysfs and procfs attributes are; a FIFO, device node or
        directory is nothing discovery can report. The file the descriptor names must
        lie under the sysfs or procfs root: a link out of the tree is not followed
        (checked on the open file, so no lstat walk per path component).
        """
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and self._inside(fd, st.st_dev, path):
                return fd
        except OSError:
            pass
        os.close(fd)
        return None

    def _inside(self, fd: int, dev: int, path: Path | str) -> bool:
        prefixes, mounted = self._roots
        if dev in mounted:
            return True
        try:
            real = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            real = os.path.realpath(path)
        return real.startswith(prefixes)

    def read(self, path: Path | str) -> str | None:
        """Text of an attribute, or None when absent or unreadable on this kernel.

        One os.read of at most 64 KiB: sysfs renders an attribute whole and hands it
        over in the first read, and discovery reads tens of thousands of them.
        """
        data = self.read_bytes(path)
        return None if data is None else data.decode("utf-8", "replace")

    def read_bytes(self, path: Path | str) -> bytes | None:
        """A binary attribute (a VPD page) as the kernel hands it over, or None."""
        fd = self._open_attribute(path)
        if fd is None:
            return None
        try:
            return os.read(fd, 65536)
        except OSError:
            return None
        finally:
            os.close(fd)

    def read_table(self, rel: str) -> str | None:
        """A whole procfs table (mountinfo, mdstat): seq_file hands those out a
        page per read, and a busy host's mountinfo is larger than 64 KiB. None above
        TABLE_MAX: 100,000 mounts are 15 MB, and a table without end is no table."""
        fd = self._open_attribute(self.procfs / rel)
        if fd is None:
            return None
        chunks: list[bytes] = []
        size = 0
        try:
            while chunk := os.read(fd, 1 << 20):
                size += len(chunk)
                if size > TABLE_MAX:
                    return None
                chunks.append(chunk)
        except OSError:
            return None
        finally:
            os.close(fd)
        return b"".join(chunks).decode("utf-8", "replace")

    def read_sys(self, rel: str) -> str | None:
        return self.read(self.sysfs / rel)

    def read_proc(self, rel: str) -> str | None:
        return self.read(self.procfs / rel)

    def block_dir(self, name: str) -> Path:
        """sysfs directory of a block device (``/sys/class/block/NAME`` resolves partitions too)."""
        check_device_name(name)
        for base in ("class/block", "block"):
            candidate = self.sysfs / base / name
            if candidate.exists():
                return candidate
        return self.sysfs / "class/block" / name

    def tunable_path(self, tunable: Tunable, device: str | None,
                     directory: Path | None = None) -> Path:
        """Where a tunable lives; ``directory`` is the device's sysfs directory
        when the caller has already resolved it."""
        if tunable.scope == "controller":  # a vendor tool's setting: never a file to open
            raise UnsafePathError(f"{tunable.name} lives in the RAID controller, not in sysfs")
        rel = _check_relative(tunable.path)
        if tunable.scope == "host":
            return self.procfs / rel
        if device is None:
            raise UnsafePathError(f"{tunable.name} needs a device")
        return (directory or self.block_dir(device)) / rel

    def is_writable(self, path: Path) -> bool:
        """By mode bits: root passes access(W_OK) even on 0444 sysfs files."""
        try:
            mode = path.stat().st_mode
        except OSError:
            return False
        return (stat.S_ISREG(mode) and bool(mode & 0o222)) or stat.S_ISFIFO(mode)

    # -- the only write -----------------------------------------------------
    def write_tunable(self, tunable: Tunable, device: str | None, text: str) -> None:
        path = self.tunable_path(tunable, device)
        root = self.procfs if tunable.scope == "host" else self.sysfs
        real = Path(os.path.realpath(path))
        real_root = Path(os.path.realpath(root))
        if real != real_root and real_root not in real.parents:
            raise UnsafePathError(f"{path} resolves to {real}, outside {real_root}")
        if not real.exists():
            raise KernelWriteError(errno.ENOENT, f"{tunable.path} does not exist", str(path))
        try:
            # sysfs wants the value in one write(); O_TRUNC keeps fixture files exact.
            flags = os.O_WRONLY | (os.O_TRUNC if real.is_file() else 0)
            fd = os.open(real, flags)
            try:
                os.write(fd, text.encode())
            finally:
                os.close(fd)
        except OSError as exc:
            raise KernelWriteError(
                exc.errno or errno.EIO,
                f"kernel refused {text!r} for {tunable.name}: {os.strerror(exc.errno or errno.EIO)}",
                str(path),
            ) from exc
