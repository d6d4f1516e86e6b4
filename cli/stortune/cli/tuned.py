"""``stortune import tuned`` and ``stortune export tuned``: TuneD profiles, here (no server needed).

    import tuned DIR|FILE [-o yaml|json]    a StorageProfile on stdout, skipped lines on stderr
    export tuned -f PROFILE.yaml [-o DIR]   a tuned.conf on stdout or in DIR/tuned.conf

The conversion is stortune.schemas.tuned; this module only reads and writes files.
"""

from __future__ import annotations

import argparse
import errno
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from stortune.cli.client import Client
from stortune.cli.render import Output
from stortune.schemas.documents import DocumentError, load_yaml_documents, parse_profile
from stortune.schemas.tuned import (
    MAX_FILE_BYTES,
    TUNED_DIRS,
    Found,
    TunedFileError,
    export_profile,
    import_profile,
)

EXIT_OK: Final = 0
EXIT_ERROR: Final = 1
CONF: Final = "tuned.conf"


def read_bounded(path: Path) -> str:
    """The file's text: never through a symlink, never a device or FIFO, never more than the cap."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise TunedFileError(f"{path}: is a symlink; not followed") from None
        raise TunedFileError(f"{path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise TunedFileError(f"{path}: not a regular file")
        data = fh.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise TunedFileError(f"{path}: larger than {MAX_FILE_BYTES} bytes; not a TuneD profile")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise TunedFileError(f"{path}: not UTF-8 text") from None


class DirectorySource:
    """Profiles by name from TuneD's directories, the imported profile's own directory first."""

    def __init__(self, directories: Sequence[str]) -> None:
        self.directories = list(dict.fromkeys(directories))

    def find(self, name: str, skip_directory: str | None) -> Found | None:
        for directory in self.directories:
            if directory == skip_directory:
                continue
            path = Path(directory) / name / CONF
            if not path.exists() and not path.is_symlink():
                continue
            return Found(str(path), directory, read_bounded(path))
        return None


def start(target: str, search: Sequence[str]) -> tuple[Found, str, DirectorySource]:
    given = Path(target)
    path = given / CONF if given.is_dir() else given
    name = path.parent.name if path.name == CONF else path.stem
    directory = str(path.parent.parent)
    found = Found(str(path), directory, read_bounded(path))
    return found, name, DirectorySource([directory, *search])


def add_parser(sub: Any, *, parser_class: type[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("import", help="turn another tool's tuning into a StorageProfile (no server needed)")
    kinds = p.add_subparsers(dest="import_kind", required=True, metavar="KIND", parser_class=parser_class)
    t = kinds.add_parser("tuned", help="a TuneD profile (tuned.conf) and the profiles it includes")
    t.add_argument("path", metavar="DIR|FILE", help="a TuneD profile directory or its tuned.conf")
    t.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    t.add_argument("--tuned-dir", action="append", default=None, metavar="DIR",
                   help=f"where includes are looked up (repeatable; default {', '.join(TUNED_DIRS)})")
    p = sub.add_parser("export", help="write a StorageProfile in another tool's format (no server needed)")
    kinds = p.add_subparsers(dest="export_kind", required=True, metavar="KIND", parser_class=parser_class)
    t = kinds.add_parser("tuned", help="a tuned.conf doing what the profile does, where TuneD can")
    t.add_argument("-f", "--filename", required=True, metavar="PROFILE.yaml")
    t.add_argument("-o", "--output", metavar="DIR", help="write DIR/tuned.conf (default: stdout)")


def import_command(args: argparse.Namespace, client: Client, out: Output) -> int:
    del client  # computed here: no control plane
    try:
        found, name, source = start(args.path, args.tuned_dir or TUNED_DIRS)
        result = import_profile(found, name, source)
    except TunedFileError as exc:
        out.error(str(exc))
        return EXIT_ERROR
    for note in result.notes:
        out.note(note)
    for skipped in result.skipped:
        out.warn(f"{skipped.where}: skipped {skipped.line!r}: {skipped.reason}")
    profile = result.profile()
    if profile is None:
        out.error(f"{args.path}: no block-device setting to convert ({len(result.skipped)} lines skipped)")
        return EXIT_ERROR
    out.dump(profile.document(), args.output)
    return EXIT_OK


def export_command(args: argparse.Namespace, client: Client, out: Output) -> int:
    del client
    try:
        text = read_bounded(Path(args.filename))
        documents = load_yaml_documents(text, args.filename)
        profiles = [parse_profile(data, where) for where, data in documents
                    if isinstance(data, dict) and data.get("kind") == "StorageProfile"]
    except TunedFileError as exc:
        out.error(str(exc))
        return EXIT_ERROR
    except DocumentError as exc:
        out.error(f"{args.filename}: invalid document(s)")
        for problem in exc.problems:
            out.note(f"  {problem}")
        return EXIT_ERROR
    if len(profiles) != 1:
        out.error(f"{args.filename}: expected one StorageProfile, found {len(profiles)}")
        return EXIT_ERROR
    result = export_profile(profiles[0])
    for why in result.left_out:
        out.warn(f"not exported: {why}")
    if args.output is None:
        out.out.write(result.text)
        return EXIT_OK
    target = Path(args.output) / CONF
    try:
        Path(args.output).mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(result.text)
    except OSError as exc:
        out.error(f"--output {target}: {exc.strerror or exc}")
        return EXIT_ERROR
    out.line(f"{target}: TuneD profile for {profiles[0].name}, {len(result.left_out)} item(s) left out")
    return EXIT_OK
