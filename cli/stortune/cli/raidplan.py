"""``stortune plan raid``: compare RAID levels for a set of disks, computed here (no server needed).

    plan raid --disks N --disk-iops IOPS [--disk-mbps MB/s] [--disk-size SIZE] --read-pct P
              [--levels raid10,raid5,raid6] [--need-iops N] [--need-mbps N] [--need-capacity SIZE]
              [-o table|json|yaml]

The same model answers ``POST /api/v1/raid-plans`` (stortune.schemas.analysis.raid).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any, Final

from pydantic import ValidationError

from stortune.cli.client import Client
from stortune.cli.render import Cell, Output, Row
from stortune.schemas.analysis.diskclass import CLASSES
from stortune.schemas.analysis.model import LevelPlan
from stortune.schemas.analysis.raid import LEVELS, RaidPlanRequest, human_bytes, plan_raid

EXIT_OK: Final = 0
EXIT_ERROR: Final = 1

#: Request field path -> the option that sets it, so an error names what the user typed.
_OPTIONS: Final = {
    ("disks", "count"): "--disks", ("disks", "iops"): "--disk-iops", ("disks", "mbps"): "--disk-mbps",
    ("disks", "sizeBytes"): "--disk-size", ("disks", "class"): "--disk-class",
    ("disks", "ureBits"): "--ure-bits", ("workload", "readPct"): "--read-pct",
    ("workload", "pattern"): "--pattern", ("workload", "blockSize"): "--block-size",
    ("requirements", "iops"): "--need-iops", ("requirements", "mbps"): "--need-mbps",
    ("requirements", "capacityBytes"): "--need-capacity", ("groups",): "--groups",
    ("levels",): "--levels", ("speedLimitMinKib",): "--speed-limit-min",
    ("speedLimitMaxKib",): "--speed-limit-max", ("disks",): "--disk-iops or --disk-class",
}

PLAN_RAID_HELP: Final = """\
Compare RAID levels for N disks: usable capacity, random IOPS = N x per-disk IOPS / (read share +
write share x write penalty) with penalties RAID0 1, RAID1/10 2, RAID5/50 4, RAID6/60 6, sequential
MB/s, fault tolerance, rebuild time at md's sync limits, IOPS while rebuilding, the disks needed to
meet --need-* and warnings (RAID5 wider than 8 disks, the unrecoverable-read-error risk of a RAID5
rebuild). Computed locally: no control plane needed.

example:
  stortune plan raid --disks 16 --disk-iops 180 --disk-size 600GB --read-pct 70
"""


def add_parser(sub: Any, *, parser_class: type[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("plan", help="plan storage: compare RAID levels for a set of disks (no server needed)")
    kinds = p.add_subparsers(dest="plan_kind", required=True, metavar="KIND", parser_class=parser_class)
    r = kinds.add_parser("raid", help="compare RAID levels for N disks", description=PLAN_RAID_HELP,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("--disks", required=True, type=_number(int), metavar="N", help="how many disks")
    r.add_argument("--disk-iops", type=_number(float), metavar="IOPS",
                   help="random IOPS per disk, measured or from the datasheet (or give --disk-class)")
    r.add_argument("--disk-mbps", type=_number(float), metavar="MB/s", help="sequential MB/s per disk")
    r.add_argument("--disk-size", metavar="SIZE", help="capacity per disk: 600GB, 4TB, 1.8TiB")
    r.add_argument("--disk-class", choices=tuple(CLASSES),
                   help="datasheet figures for what is not given")
    r.add_argument("--read-pct", required=True, type=_number(float), metavar="P",
                   help="share of reads in percent (70 = 70/30 read/write)")
    r.add_argument("--levels", default="raid10,raid5,raid6", metavar="LEVELS",
                   help=f"comma-separated, of {','.join(LEVELS)} (default raid10,raid5,raid6)")
    r.add_argument("--pattern", choices=("random", "sequential"), default="random")
    r.add_argument("--block-size", default="4k", metavar="SIZE", help="bytes per I/O (default 4k)")
    r.add_argument("--need-iops", type=_number(float), metavar="IOPS", help="required random IOPS")
    r.add_argument("--need-mbps", type=_number(float), metavar="MB/s", help="required MB/s")
    r.add_argument("--need-capacity", metavar="SIZE", help="required usable capacity")
    r.add_argument("--groups", type=_number(int), metavar="N", help="RAID50/60: groups striped together")
    r.add_argument("--speed-limit-min", type=_number(int), default=1000, metavar="KiB/s",
                   help="dev.raid.speed_limit_min (default 1000)")
    r.add_argument("--speed-limit-max", type=_number(int), default=200000, metavar="KiB/s",
                   help="dev.raid.speed_limit_max (default 200000)")
    r.add_argument("--ure-bits", type=_number(float), metavar="BITS",
                   help="bits per unrecoverable read error (1e14 desktop, 1e15 enterprise)")
    r.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")


def _number(kind: Callable[[str], int | float]) -> Callable[[str], int | float]:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            what = "a whole number" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        return value
    return parse


def request_of(args: argparse.Namespace) -> dict[str, Any]:
    """The options as the REST body (camelCase): one model validates both."""
    disks: dict[str, Any] = {"count": args.disks}
    for key, value in (("iops", args.disk_iops), ("mbps", args.disk_mbps), ("sizeBytes", args.disk_size),
                       ("class", args.disk_class), ("ureBits", args.ure_bits)):
        if value is not None:
            disks[key] = value
    requirements = {k: v for k, v in (("iops", args.need_iops), ("mbps", args.need_mbps),
                                      ("capacityBytes", args.need_capacity)) if v is not None}
    body: dict[str, Any] = {
        "disks": disks,
        "levels": [level for level in args.levels.split(",") if level.strip()],
        "workload": {"readPct": args.read_pct, "pattern": args.pattern, "blockSize": args.block_size},
        "requirements": requirements,
        "speedLimitMinKib": args.speed_limit_min, "speedLimitMaxKib": args.speed_limit_max,
    }
    if args.groups is not None:
        body["groups"] = args.groups
    return body


def _where(loc: tuple[int | str, ...]) -> str:
    path = tuple(str(p) for p in loc)
    for length in (2, 1):
        option = _OPTIONS.get(path[:length])
        if option:
            return option
    return ".".join(path) or "the options"


def command(args: argparse.Namespace, client: Client, out: Output) -> int:
    del client  # computed here: no control plane
    try:
        request = RaidPlanRequest.model_validate(request_of(args))
    except ValidationError as exc:
        for error in exc.errors():
            message = error["msg"].removeprefix("Value error, ")
            out.error(f"{_where(error['loc'])}: {message}")
        return EXIT_ERROR
    result = plan_raid(request)
    if args.output != "table":
        out.dump([level.model_dump(mode="json") for level in result.levels], args.output)
        return EXIT_OK
    out.table(*rows(result.levels))
    for level in result.levels:
        for warning in level.warnings:
            out.warn(f"{level.level}: {warning}")
    return EXIT_OK


def _count(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _bytes(value: int | None) -> str:
    return "-" if value is None else human_bytes(value)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds >= 86400:
        return f"{seconds / 86400:.1f} d"
    return f"{seconds / 3600:.1f} h"


def rows(levels: list[LevelPlan]) -> tuple[list[str], list[Row]]:
    headers = ["LEVEL", "DISKS", "USABLE", "RANDOM IOPS", "SEQ MB/S", "TOLERATES", "REBUILD IDLE/BUSY",
               "IOPS REBUILDING", "URE RISK", "NEEDED", "WARNINGS"]
    table: list[Row] = []
    for p in levels:
        style = "" if p.meets_requirements is None else "green" if p.meets_requirements else "yellow"
        needed = Cell("-" if p.disks_needed is None else str(p.disks_needed), style)
        risk = "-" if p.rebuild_ure_risk is None else f"{p.rebuild_ure_risk:.1%}"
        rebuild = (f"{_duration(p.rebuild_seconds_idle)}/{_duration(p.rebuild_seconds_busy)}"
                   if p.rebuild_seconds_idle is not None else "-")
        groups = f"{p.disks} ({p.groups} groups)" if p.groups else str(p.disks)
        table.append([p.level, groups, _bytes(p.usable_bytes), _count(p.random_iops),
                      _count(p.sequential_mbps), str(p.fault_tolerance), rebuild,
                      _count(p.rebuilding_random_iops), risk, needed,
                      Cell(str(len(p.warnings)), "yellow") if p.warnings else "0"])
    return headers, table
