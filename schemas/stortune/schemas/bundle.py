"""A diagnostics bundle: files by relative path, and what was collected, failed, missing and masked.

Pure: packing and unpacking work on bytes in memory. The manifest's file list
(size and sha256 of every file) is computed when packing, never stored in the
``Bundle``, so it always describes the bytes in the archive, after redaction
and after the control plane added its own files.

An archive holds one top directory (``Bundle.root``) with ``manifest.json``
and the files under it. ``unpack`` accepts untrusted input (the control plane
unpacks what agents send): only regular files with plain relative paths, a
size limit, and every file checked against the manifest.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import re
import tarfile
from typing import Final, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

FORMAT: Final = "stortune-diagnostics/1"
MANIFEST = "manifest.json"
#: More than any real host produces (a 1,000-LUN SAN host is tens of MB); stops archive bombs.
MAX_UNPACKED_BYTES = 1 << 30

SourceKind = Literal["file", "command", "generated", "control-plane"]


class BundleError(ValueError):
    """An archive that is not a valid bundle; ``problems`` lists every reason found."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Collected(_Model):
    """One file in the bundle and where its content came from."""

    path: str = Field(description="The file in the bundle")
    source: SourceKind
    origin: str = Field(description="What was read or run: /proc/mdstat, 'smartctl -j -a /dev/sda'")
    argv: list[str] | None = None
    exit_code: int | None = None
    duration_seconds: float | None = None
    note: str | None = None


class Failure(_Model):
    """Something that was tried and did not (fully) work: a hung or failing tool, an unreadable file."""

    what: str
    reason: str
    path: str | None = Field(default=None, description="Partial output or stderr kept in the bundle")


class Missing(_Model):
    """A tool that is not installed: not an error, support just knows it was not there."""

    tool: str
    searched: list[str] = Field(description="Executable names looked for")
    wanted_for: list[str] = Field(description="Command lines that were not run")


class MaskedKind(_Model):
    values: int = Field(description="Distinct values replaced by a token")
    occurrences: int


class RedactionSummary(_Model):
    kinds: list[str] = Field(description="Kinds of values looked for")
    masked: dict[str, MaskedKind] = Field(default_factory=dict)
    not_redacted: list[str] = Field(default_factory=list, description="Binary files, left as they were")


class FileEntry(_Model):
    path: str
    size: int
    sha256: str


class BundleInfo(_Model):
    """Everything in the manifest except the file list."""

    format: Literal["stortune-diagnostics/1"] = FORMAT
    collector: str = Field(description="What made the bundle, with its version")
    created: AwareDatetime
    host: str
    collected: list[Collected] = Field(default_factory=list)
    failed: list[Failure] = Field(default_factory=list)
    missing: list[Missing] = Field(default_factory=list)
    redaction: RedactionSummary | None = Field(default=None, description="None: not redacted")


class Manifest(BundleInfo):
    files: list[FileEntry]


_CONTROL = re.compile(r"[\x00-\x1f\x7f\\]")


def check_path(path: str) -> str:
    """A plain relative POSIX path inside the bundle; raises ValueError otherwise."""
    parts = path.split("/")
    if (not path or path.startswith("/") or _CONTROL.search(path)
            or any(p in ("", ".", "..") for p in parts)):
        raise ValueError(f"bundle path {path!r} must be relative, plain and without control characters")
    if path == MANIFEST:
        raise ValueError(f"{MANIFEST} is written by pack(); it cannot be a bundle file")
    return path


class Bundle(BaseModel):
    model_config = ConfigDict(extra="forbid")

    info: BundleInfo
    files: dict[str, bytes] = Field(default_factory=dict)

    def put(self, path: str, data: bytes | str) -> None:
        """Store a file (replacing one at the same path) without describing it."""
        check_path(path)
        # a name that is a file and a directory at once could not be extracted
        clash = next((p for p in self.files if p.startswith(f"{path}/") or path.startswith(f"{p}/")), None)
        if clash is not None:
            raise ValueError(f"bundle path {path!r} clashes with {clash!r}: one would be a directory")
        self.files[path] = data.encode() if isinstance(data, str) else data

    def add(self, path: str, data: bytes | str, *, source: SourceKind, origin: str,
            argv: list[str] | None = None, exit_code: int | None = None,
            duration_seconds: float | None = None, note: str | None = None) -> None:
        """Store a file and record where it came from (how the control plane adds its files)."""
        self.put(path, data)
        self.info.collected = [c for c in self.info.collected if c.path != path]
        self.info.collected.append(Collected(
            path=path, source=source, origin=origin, argv=argv, exit_code=exit_code,
            duration_seconds=duration_seconds, note=note,
        ))

    def fail(self, what: str, reason: str, path: str | None = None) -> None:
        self.info.failed.append(Failure(what=what, reason=reason, path=path))

    @property
    def root(self) -> str:
        """The archive's top directory: the (redacted) host and the creation time."""
        host = re.sub(r"[^A-Za-z0-9._-]", "_", self.info.host) or "host"
        stamp = self.info.created.strftime("%Y%m%dT%H%M%SZ")
        return f"stortune-diag-{host}-{stamp}"

    def manifest(self) -> Manifest:
        entries = [FileEntry(path=p, size=len(d), sha256=hashlib.sha256(d).hexdigest())
                   for p, d in sorted(self.files.items())]
        return Manifest(**self.info.model_dump(), files=entries)


def pack(bundle: Bundle) -> bytes:
    """The bundle as tar.gz bytes: byte-identical for the same bundle (sorted, fixed metadata)."""
    manifest = bundle.manifest().model_dump_json(indent=2).encode() + b"\n"
    root = bundle.root
    mtime = int(bundle.info.created.timestamp())
    raw = io.BytesIO()
    # mtime=0 and no file name in the gzip header, so equal bundles give equal bytes
    with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        top = tarfile.TarInfo(root)
        top.type, top.mode, top.mtime = tarfile.DIRTYPE, 0o755, mtime
        tar.addfile(top)
        for path, data in [(MANIFEST, manifest), *sorted(bundle.files.items())]:
            info = tarfile.TarInfo(f"{root}/{path}")
            info.size, info.mode, info.mtime = len(data), 0o644, mtime
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


def _read(data: bytes, max_bytes: int) -> tuple[dict[str, bytes], list[str]]:
    """Files by bundle path (manifest included) and the problems found reading them."""
    problems: list[str] = []
    files: dict[str, bytes] = {}
    root: str | None = None
    total = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for member in tar:
                top, _, rel = member.name.rstrip("/").partition("/")
                if root is None:
                    root = top
                if top != root or top in ("", ".", ".."):
                    problems.append(f"{member.name}: outside the bundle's one top directory {root!r}")
                    continue
                if member.isdir():
                    continue
                if not member.isfile():
                    problems.append(f"{member.name}: not a regular file (links and devices are refused)")
                    continue
                try:
                    if rel != MANIFEST:
                        check_path(rel)
                except ValueError as exc:
                    problems.append(str(exc))
                    continue
                total += member.size
                if total > max_bytes:
                    raise BundleError([*problems, f"more than {max_bytes} bytes unpacked; refused"])
                if rel in files:
                    problems.append(f"{rel}: stored twice")
                extracted = tar.extractfile(member)
                files[rel] = extracted.read() if extracted is not None else b""
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise BundleError([f"not a readable tar.gz archive: {exc}"]) from None
    return files, problems


def _check(files: dict[str, bytes], problems: list[str]) -> Manifest | None:
    raw = files.pop(MANIFEST, None)
    if raw is None:
        problems.append(f"{MANIFEST} is missing")
        return None
    try:
        manifest = Manifest.model_validate_json(raw)
    except ValidationError as exc:
        problems.append(f"{MANIFEST} is invalid: {exc}")
        return None
    listed = {e.path: e for e in manifest.files}
    for path, entry in sorted(listed.items()):
        data = files.get(path)
        if data is None:
            problems.append(f"{path}: listed in the manifest but not in the archive")
        elif len(data) != entry.size or hashlib.sha256(data).hexdigest() != entry.sha256:
            problems.append(f"{path}: size or sha256 differs from the manifest")
    problems.extend(f"{p}: in the archive but not in the manifest" for p in sorted(set(files) - set(listed)))
    return manifest


def verify(data: bytes, *, max_bytes: int = MAX_UNPACKED_BYTES) -> list[str]:
    """Every way the archive does not match its manifest; empty when it is intact."""
    try:
        files, problems = _read(data, max_bytes)
    except BundleError as exc:
        return exc.problems
    _check(files, problems)
    return problems


def unpack(data: bytes, *, max_bytes: int = MAX_UNPACKED_BYTES) -> Bundle:
    """The bundle in an archive made by ``pack``; raises BundleError unless it verifies."""
    files, problems = _read(data, max_bytes)
    manifest = _check(files, problems)
    if problems or manifest is None:
        raise BundleError(problems)
    info = BundleInfo(**manifest.model_dump(exclude={"files"}))
    return Bundle(info=info, files=files)

