"""The ``stortune-agent bench`` arguments.

Apart from ``cli`` (which runs them) so that building the agent's parser, which
every command does, serve included, does not load fio's machinery and the
benchmark models.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stortune.agent.protection import DEFAULT_MOUNTS, HostProtection
from stortune.schemas.bench.preset_names import PRESET_NAMES
from stortune.schemas.topology import is_device_name

#: STATE_DIR/OWN_DIR holds the agent's own file targets (``files``); named here so that
#: building the parser does not import ``files``.
OWN_DIR = "bench-files"


def bench_dir(text: str) -> Path:
    from stortune.agent.bench.files import check_directory

    try:
        return check_directory(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_bench_dirs(p: argparse.ArgumentParser) -> None:
    """--bench-dir: where this host lets benchmark file targets be created."""
    p.add_argument("--bench-dir", action="append", default=[], type=bench_dir, metavar="DIR",
                   help="a directory where benchmark file targets may be created and overwritten;"
                        f" repeatable. Besides STATE_DIR/{OWN_DIR}, none by default")


def add_parser(sub: Any, roots: Callable[[argparse.ArgumentParser], None],
               state: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("bench", help="run a BenchmarkSpec or a preset on this host (fio)")
    roots(p)
    p.add_argument("--dev", default="/dev", help="device node root (default /dev)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("-f", "--file", metavar="SPEC.yaml", help="a BenchmarkSpec document (- for stdin)")
    source.add_argument("--preset", choices=PRESET_NAMES, help="run one preset on --target")
    p.add_argument("--target", metavar="DEV|FILE",
                   help="with --preset: a device (loop3, /dev/sdb) or a file path on a filesystem")
    p.add_argument("--file-size", default="1GiB", help="with a file --target: its size (default 1GiB)")
    p.add_argument("--size", help="with --preset: bytes per job (4M, 1GiB)")
    p.add_argument("--runtime", help="with --preset: per step (10s, 2m)")
    p.add_argument("--repeats", type=int, default=1, help="with --preset: runs of each step")
    p.add_argument("--allow-destructive", action="store_true",
                   help="with --preset: allow writes to a raw device (destroys its contents)")
    p.add_argument("--run-id", help="name of the run (default: time and a random suffix)")
    p.add_argument("--baseline", metavar="RESULT.json",
                   help="compare with an earlier result (this command's -o json, or a run's result.json)")
    p.add_argument("--dry-run", action="store_true",
                   help="make every check the run would (target, protected devices, unsafe writes,"
                        " fio) and show the steps; run nothing")
    state(p)
    add_bench_dirs(p)
    add_protection(p)
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")


def add_protection(p: argparse.ArgumentParser) -> None:
    """The host's protected devices: no experiment, benchmark or probe on them (``protection``)."""
    g = p.add_argument_group("protected devices", "the devices holding /, /boot, /var and swap,"
                             " whole disks and stacks included, and other users' loop devices"
                             " take no experiment, benchmark or probe (profiles may still tune them)")
    g.add_argument("--protect-mount", action="append", default=[], type=_absolute, metavar="PATH",
                   help="also protect the device holding PATH; repeatable")
    g.add_argument("--protect-device", action="append", default=[], type=_device, metavar="NAME",
                   help="also protect the block device NAME (sdc, md0) and what lies on it; repeatable")
    g.add_argument("--allow-loop", action="append", default=[], type=_device, metavar="NAME",
                   help="allow the loop device NAME although its backing file is another user's;"
                        " repeatable")


def protection_of(args: argparse.Namespace) -> HostProtection:
    return HostProtection(mounts=(*DEFAULT_MOUNTS, *args.protect_mount), devices=tuple(args.protect_device),
                          allow_loops=tuple(args.allow_loop))


def _absolute(text: str) -> str:
    if not text.startswith("/") or "\x00" in text:
        raise argparse.ArgumentTypeError(f"{text!r} is not an absolute path")
    return text.rstrip("/") or "/"


def _device(text: str) -> str:
    name = text.removeprefix("/dev/")
    if not is_device_name(name):
        raise argparse.ArgumentTypeError(f"{text!r} is not a kernel block device name (sdc, md0, loop3)")
    return name
