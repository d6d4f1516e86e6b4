"""Where benchmark files may live on this host, and which of them stortune made.

A file target comes in a BenchmarkSpec, from whoever holds an operator token at
the control plane; where the agent, running as root, may create and overwrite
files is the host's decision. ``BenchFiles`` holds the directories the host gave
the agent (``--bench-dir``, repeatable) and the agent's own
``<state>/bench-files``, nothing else. A file target is accepted only when:

* its path is absolute and plain: no ``.``, ``..`` or empty component, no
  control character, at most PATH_MAX bytes with components of at most
  NAME_MAX, not under /dev, /sys or /proc;
* it lies inside one of those directories (not elsewhere in the state
  directory, should a --bench-dir hold it) and is reached without following a
  symbolic link: each component below the directory is looked at with lstat
  and opened with O_NOFOLLOW relative to its parent's descriptor, so a link
  anywhere below the directory is refused, never followed;
* a directory given through a link (``--bench-dir /home/alice/bench`` naming
  ``/srv/bench``) is resolved once, when the agent starts: the checks, the
  record and fio all use the real path from then on. Whoever may change the
  link (here alice) would otherwise choose, after the checks, where fio and
  the removal of the run's file go;
* no mount point (a bind mount included) lies between the directory and the
  file: the file is on the directory's filesystem, the device the results
  name, not on whatever was mounted below it;
* the directory and everything below it on the way are owned by the agent's
  user and writable by nobody else, and the directories above it are not
  writable by others (sticky ones excepted): fio opens the file by path, so
  nobody but root may be able to swap a component for a link in between;
* the file does not exist yet, or stortune made it. ``<state>/bench-files.json``
  records the path, device, inode and inode generation of every file the
  agent made (created with O_CREAT|O_EXCL|O_NOFOLLOW relative to the
  directory's descriptor). Any other file at that path is refused, whatever
  ``allowDestructive`` says: even a read workload lays a short file out anew.
  The generation (FS_IOC_GETVERSION) matters: filesystems hand a freed inode
  number to the next file made, which gets another generation; where a
  filesystem keeps none, the file's change time stands in for it.

fio lays a file out by unlinking and creating it again, so the record follows
the file: after each step the path is walked again and the regular,
single-link file of the agent's user found there is recorded as the run's
(``settle``). While a run uses a file its record is marked busy; a record left
busy by an agent that died mid-run adopts the file found at its path the same
way. The record is written only by a run, under the state directory's bench
lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stortune.agent import procfs
from stortune.agent.bench.args import OWN_DIR  # named there for the parser
from stortune.agent.bench.errors import BenchmarkError
from stortune.agent.journal import atomic_write
from stortune.agent.kernelfs import KernelFS

RECORD = "bench-files.json"
PATH_MAX = 4095  # bytes, without the terminating NUL
NAME_MAX = 255
#: Device nodes and kernel trees: never a benchmark directory, never a file target.
SYSTEM_TREES = ("/dev", "/proc", "/sys")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_FS_IOC_GETVERSION = 0x80087601  # _IOR('v', 1, long): the inode's generation
_SHOWN = 160  # characters of a hostile path repeated in a message


class FileTargetError(BenchmarkError):
    """A file target this host does not allow; the message names spec.target.file.path and why."""

    def __init__(self, path: str, why: str) -> None:
        self.path = path
        self.why = why
        super().__init__(f"spec.target.file.path {_show(path)}: {why}")


def _show(path: str) -> str:
    return repr(path if len(path) <= _SHOWN else path[:_SHOWN] + "...")


def system_tree(path: str) -> str | None:
    """The kernel tree ``path`` lies in (/dev, /sys, /proc), or None."""
    return next((t for t in SYSTEM_TREES if path == t or path.startswith(t + "/")), None)


def check_directory(text: str) -> Path:
    """A --bench-dir as the host gives it: absolute, not / and not a kernel tree. ValueError otherwise."""
    if not text.startswith("/") or any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise ValueError(f"{text!r}: give an absolute directory without control characters")
    path = os.path.normpath(text)
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    if path == "/":
        raise ValueError("'/': a benchmark directory of / would let benchmarks write any file")
    tree = system_tree(path)
    if tree is not None:
        raise ValueError(f"{text!r} is under {tree}: benchmark files go on a mounted filesystem")
    return Path(path)


@dataclass(frozen=True)
class Place:
    """Where a file target resolved, checked."""

    path: str  # as the spec gives it: what fio opens
    real: str  # the same file through its directory's real path: what mountinfo lists
    directory: Path  # the benchmark directory holding it
    exists: bool  # a file stortune made is there already


@dataclass(frozen=True)
class _File:
    """A file as the record knows it."""

    st: os.stat_result
    generation: int | None  # None: the filesystem keeps none; the change time stands in

    @classmethod
    def of(cls, fd: int) -> _File:
        buf = bytearray(8)
        try:
            fcntl.ioctl(fd, _FS_IOC_GETVERSION, buf)
        except OSError:  # ENOTTY: tmpfs and others keep no generation
            return cls(os.fstat(fd), None)
        return cls(os.fstat(fd), struct.unpack("=I", bytes(buf[:4]))[0])  # the kernel puts an int

    def identity(self) -> dict[str, int | None]:
        return {"dev": self.st.st_dev, "ino": self.st.st_ino, "generation": self.generation,
                "ctime_ns": self.st.st_ctime_ns if self.generation is None else None}

    def matches(self, entry: dict[str, Any]) -> bool:
        return all(entry.get(k) == v for k, v in self.identity().items())

    @property
    def plain(self) -> bool:
        """A regular file of the agent's user with no other name: what fio leaves behind."""
        return stat.S_ISREG(self.st.st_mode) and self.st.st_uid == os.geteuid() and self.st.st_nlink == 1


@dataclass
class _Parent:
    fd: int  # the file's directory, opened without following links
    name: str
    place: Place
    file: _File | None  # the file, when there is one


class BenchFiles:
    def __init__(self, fs: KernelFS, state_dir: Path, directories: Sequence[Path] = ()) -> None:
        self.fs = fs
        self.state_dir = state_dir
        self.own = state_dir / OWN_DIR
        self.record_path = state_dir / RECORD
        try:
            dirs = [self.own, *(check_directory(str(d)) for d in directories)]
        except ValueError as exc:
            raise BenchmarkError(f"--bench-dir {exc}") from None
        #: The agent's own first, then the host's, as given.
        self.directories = list(dict.fromkeys(dirs))
        #: Each directory without links, as it resolved when the agent started: what is opened.
        self._real = {d: Path(os.path.realpath(d)) for d in self.directories}
        #: Longest first, so a path is judged by the innermost directory holding it.
        self._innermost_first = sorted(self.directories, key=lambda d: -len(str(d)))

    # -- the checks ------------------------------------------------------------------------
    def check(self, raw: str) -> Place:
        """The place of a file target this host allows; FileTargetError with the reason otherwise."""
        with self._parent(raw) as parent:
            if parent.file is not None and not self._ours(parent.place.real, parent.file, self._load()):
                raise FileTargetError(raw, "a file stortune did not create is there; it is not"
                                           " overwritten: give a path that does not exist yet")
            return parent.place

    def _locate(self, raw: str) -> tuple[Path, str, list[str]]:
        """(benchmark directory, the directory as the path spells it, components below it)."""
        if not raw.startswith("/"):
            raise FileTargetError(raw, "must be an absolute path")
        if any(ord(c) < 32 or ord(c) == 127 for c in raw):
            raise FileTargetError(raw, "holds a NUL or another control character")
        try:
            encoded = raw.encode("utf-8")
        except UnicodeEncodeError:
            raise FileTargetError(raw, "is not valid UTF-8 text") from None
        if len(encoded) > PATH_MAX:
            raise FileTargetError(raw, f"is longer than {PATH_MAX} bytes (PATH_MAX)")
        parts = raw.split("/")[1:]
        if any(p in ("", ".", "..") for p in parts):
            raise FileTargetError(raw, "must be plain: no '.', '..' or empty component, no trailing '/'")
        if any(len(p.encode("utf-8")) > NAME_MAX for p in parts):
            raise FileTargetError(raw, f"has a component longer than {NAME_MAX} bytes (NAME_MAX)")
        for tree in (*SYSTEM_TREES, str(self.fs.dev), str(self.fs.sysfs), str(self.fs.procfs)):
            if raw == tree or raw.startswith(tree.rstrip("/") + "/"):
                raise FileTargetError(raw, f"is under {tree}; to benchmark a device, use"
                                           " target.device with a match")
        for directory in self._innermost_first:
            real = str(self._real[directory])
            for spelled in dict.fromkeys((str(directory), real)):
                prefix = spelled.rstrip("/") + "/"
                if raw.startswith(prefix) and len(raw) > len(prefix):
                    rel = raw[len(prefix):].split("/")
                    if directory != self.own and self._in_state(real, rel):
                        raise FileTargetError(raw, f"is in the agent's state directory {self.state_dir};"
                                                   f" benchmark files go in {self.own} there")
                    return directory, spelled, rel
        allowed = ", ".join(str(d) for d in self.directories)
        raise FileTargetError(raw, f"is not inside a benchmark directory of this host ({allowed});"
                                   " the host decides where benchmark files may be written:"
                                   " stortune-agent serve --bench-dir DIR")

    def _in_state(self, real_directory: str, rel: list[str]) -> bool:
        """Whether a path below a host directory lands in the state directory (a --bench-dir
        holding it): the journal, originals and bench records are not benchmark files."""
        state = os.path.realpath(self.state_dir).rstrip("/") + "/"
        return f"{real_directory.rstrip('/')}/{'/'.join(rel)}".startswith(state)

    @contextlib.contextmanager
    def _parent(self, raw: str) -> Iterator[_Parent]:
        """Walk from the benchmark directory to the file's directory without following a link."""
        directory, spelled, parts = self._locate(raw)
        real = str(self._real[directory])
        if directory == self.own:
            with contextlib.suppress(OSError):
                self.own.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            # Its real path, not the one given: a link there is followed once, at start (see above).
            fd = os.open(real, _DIR_FLAGS | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise FileTargetError(raw, f"the benchmark directory {directory} does not exist on this"
                                       " host") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise FileTargetError(raw, f"the benchmark directory {directory} was {real} when the agent"
                                           " started and is a symbolic link now: restart the agent") from None
            raise FileTargetError(raw, f"cannot open the benchmark directory {directory}:"
                                       f" {exc.strerror}") from None
        try:
            top = os.fstat(fd)
            self._above_trusted(raw, real)
            self._trusted(raw, top, str(directory))
            mounts = self._mountpoints()
            shown, real_here = spelled, real
            for part in parts[:-1]:
                shown, real_here = f"{shown.rstrip('/')}/{part}", f"{real_here.rstrip('/')}/{part}"
                below = self._step(raw, fd, part, shown=shown, top=top, mounted=real_here in mounts)
                os.close(fd)
                fd = below
            name = parts[-1]
            shown, real_here = f"{shown.rstrip('/')}/{name}", f"{real_here.rstrip('/')}/{name}"
            try:
                st: os.stat_result | None = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            except OSError as exc:
                raise FileTargetError(raw, f"cannot look at {shown}: {exc.strerror}") from None
            if st is not None:
                if stat.S_ISLNK(st.st_mode):
                    raise FileTargetError(raw, f"{shown} is a symbolic link; links are not followed"
                                               " below a benchmark directory")
                if not stat.S_ISREG(st.st_mode):
                    raise FileTargetError(raw, f"{shown} exists and is not a regular file")
                if st.st_dev != top.st_dev or real_here in mounts:
                    raise FileTargetError(raw, f"{shown} is a mount point; a file target stays on the"
                                               " filesystem of its benchmark directory")
            file = self._look(raw, fd, name, st, shown) if st is not None else None
            yield _Parent(fd, name, Place(raw, real_here, directory, st is not None), file)
        finally:
            os.close(fd)

    def _step(self, raw: str, fd: int, part: str, *, shown: str, top: os.stat_result,
              mounted: bool) -> int:
        """Open directory ``part`` below ``fd`` without following a link; the caller keeps ``fd``."""
        try:
            st = os.stat(part, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            raise FileTargetError(raw, f"directory {shown} does not exist; create it on the host"
                                       " first") from None
        except OSError as exc:
            raise FileTargetError(raw, f"cannot look at {shown}: {exc.strerror}") from None
        if stat.S_ISLNK(st.st_mode):
            raise FileTargetError(raw, f"{shown} is a symbolic link; links are not followed"
                                       " below a benchmark directory")
        if not stat.S_ISDIR(st.st_mode):
            raise FileTargetError(raw, f"{shown} is not a directory")
        if st.st_dev != top.st_dev or mounted:
            raise FileTargetError(raw, f"{shown} is a mount point; a file target stays on the"
                                       " filesystem of its benchmark directory")
        try:
            below = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
        except OSError as exc:  # ELOOP: it became a link since the lstat
            raise FileTargetError(raw, f"cannot open {shown}: {exc.strerror}") from None
        try:
            opened = os.fstat(below)
            if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
                raise FileTargetError(raw, f"{shown} changed while it was checked")
            self._trusted(raw, opened, shown)
        except BaseException:
            os.close(below)
            raise
        return below

    @staticmethod
    def _look(raw: str, fd: int, name: str, st: os.stat_result, shown: str) -> _File:
        """The regular file ``name`` below ``fd``, opened (read-only, no link followed) to read its
        generation."""
        try:
            file_fd = os.open(name, _FILE_FLAGS, dir_fd=fd)
        except OSError as exc:
            raise FileTargetError(raw, f"cannot open {shown}: {exc.strerror}") from None
        try:
            file = _File.of(file_fd)
        finally:
            os.close(file_fd)
        if (file.st.st_dev, file.st.st_ino) != (st.st_dev, st.st_ino):
            raise FileTargetError(raw, f"{shown} changed while it was checked")
        return file

    @staticmethod
    def _trusted(raw: str, st: os.stat_result, shown: str) -> None:
        """A directory at or below a benchmark directory: the agent's, writable by it alone."""
        if st.st_uid != os.geteuid():
            raise FileTargetError(raw, f"{shown} belongs to uid {st.st_uid}, not to the agent's user;"
                                       " whoever owns it could swap its files for links")
        if st.st_mode & 0o022:
            raise FileTargetError(raw, f"{shown} is writable by others (mode {stat.S_IMODE(st.st_mode):o});"
                                       " they could swap its files for links: chmod go-w")

    @staticmethod
    def _above_trusted(raw: str, real: str) -> None:
        """The directories holding a benchmark directory: writable by no one else, unless sticky."""
        for above in Path(real).parents:
            try:
                st = os.stat(above)
            except OSError as exc:
                raise FileTargetError(raw, f"cannot look at {above}: {exc.strerror}") from None
            if st.st_uid not in (0, os.geteuid()) or (st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX):
                raise FileTargetError(raw, f"{above}, above the benchmark directory, can be changed by"
                                           " others, who could replace the directory with a link")

    def _mountpoints(self) -> set[str]:
        mounts, _ = procfs.parse_mountinfo(self.fs.read_table("self/mountinfo") or "")
        return {m.mountpoint for m in mounts}

    # -- what stortune made ----------------------------------------------------------------
    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.record_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            # Unreadable: nothing is known to be ours, so nothing existing is overwritten.
            raise BenchmarkError(f"{self.record_path} cannot be read ({exc}); move it away to"
                                 " start a new record") from None
        files = data.get("files") if isinstance(data, dict) else None
        return {k: v for k, v in files.items() if isinstance(v, dict)} if isinstance(files, dict) else {}

    def _save(self, files: dict[str, dict[str, Any]]) -> None:
        atomic_write(self.record_path, json.dumps({"files": files}, indent=1, sort_keys=True).encode())

    def _ours(self, real: str, file: _File, files: dict[str, dict[str, Any]]) -> bool:
        entry = files.get(real)
        if entry is None:
            return False
        # Busy: a run was using it when its agent died, and fio may have made it anew.
        return file.matches(entry) or (bool(entry.get("busy")) and file.plain)

    def _record(self, files: dict[str, dict[str, Any]], place: Place, file: _File,
                run_id: str, *, busy: bool) -> None:
        files[place.real] = {**file.identity(), "path": place.path, "run": run_id, "busy": busy}
        self._save(files)

    def _pruned(self) -> dict[str, dict[str, Any]]:
        """The record without the files that are gone or were replaced since."""
        kept = {}
        for real, entry in self._load().items():
            try:
                st = os.lstat(real)
            except OSError:
                continue
            if entry.get("busy") or (entry.get("dev"), entry.get("ino")) == (st.st_dev, st.st_ino):
                kept[real] = entry
        return kept

    # -- a run's use of its file (under the bench lock) ------------------------------------
    def claim(self, raw: str, run_id: str) -> bool:
        """Make the file (or take the one stortune made) for ``run_id``, recorded as busy;
        True when this call made it."""
        files = self._pruned()
        with self._parent(raw) as parent:
            if parent.file is None:
                file = self._create(parent)
            elif self._ours(parent.place.real, parent.file, files):
                file = parent.file
            else:
                raise FileTargetError(raw, "a file stortune did not create appeared there; it is"
                                           " not overwritten")
            self._record(files, parent.place, file, run_id, busy=True)
            return parent.file is None

    def renew(self, raw: str, run_id: str) -> None:
        """Remove stortune's file and make it again, empty (a step that writes a fresh file)."""
        files = self._load()
        with self._parent(raw) as parent:
            if parent.file is not None:
                if not self._ours(parent.place.real, parent.file, files):
                    raise FileTargetError(raw, "the file there is no longer the one stortune made")
                os.unlink(parent.name, dir_fd=parent.fd)
            self._record(files, parent.place, self._create(parent), run_id, busy=True)

    def settle(self, raw: str, run_id: str) -> None:
        """After fio: record the file fio left at the path (it may have made it anew)."""
        files = self._load()
        with self._parent(raw) as parent:
            if parent.file is None:
                files.pop(parent.place.real, None)
                self._save(files)
            elif self._ours(parent.place.real, parent.file, files) or parent.file.plain:
                self._record(files, parent.place, parent.file, run_id, busy=True)
            else:
                raise FileTargetError(raw, "after the step the file there is not a plain file of the"
                                           " agent's user; it is left alone")

    def release(self, raw: str, run_id: str, *, remove: bool) -> None:
        """The run is over: remove stortune's file, or keep it recorded (not busy) for later runs."""
        files = self._load()
        with self._parent(raw) as parent:
            real = parent.place.real
            if parent.file is None or not self._ours(real, parent.file, files):
                if files.pop(real, None) is not None:
                    self._save(files)
                return
            if remove:
                os.unlink(parent.name, dir_fd=parent.fd)
                files.pop(real, None)
                self._save(files)
            else:
                self._record(files, parent.place, parent.file, run_id, busy=False)

    @staticmethod
    def _create(parent: _Parent) -> _File:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(parent.name, flags, 0o600, dir_fd=parent.fd)
        except FileExistsError:
            raise FileTargetError(parent.place.path, "something appeared at the path while the run"
                                                     " was starting; it is not overwritten") from None
        except OSError as exc:
            raise FileTargetError(parent.place.path, f"cannot create it: {exc.strerror}") from None
        try:
            return _File.of(fd)
        finally:
            os.close(fd)
