"""``stortune analyze host NAME``: where a host's limits are, layer by layer.

The control plane builds the analysis (GET /api/v1/hosts/NAME/analysis) from the topology
the agent reported, its probe figures and its latest benchmark runs; this prints it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, Final

from stortune.cli.client import Client
from stortune.cli.render import Output
from stortune.schemas.analysis import render
from stortune.schemas.analysis.model import HostAnalysis

EXIT_OK: Final = 0

ANALYZE_HELP: Final = """\
Show each device's chain (filesystem, dm, md, member disks, links, HBA ports, controllers
and their PCIe links) with the ceiling of every layer and where it came from: a negotiated
link rate from sysfs, a probe's measurement (stortune probe), or the device class (marked ~,
an estimate). The lowest ceiling is the device's limit. Then the layout checks (alignment,
filesystem against RAID geometry, wide or degraded arrays, stripe cache RAM), members slower
than their peers across the latest benchmark runs, and each path's share of the I/O.

  stortune analyze host db01
  stortune analyze host db01 --device dm-0 -o json
"""


def add_parser(sub: Any, *, connection_options: Callable[..., None], runs: Callable[[str], int],
               parser_class: type[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("analyze", help="where a host's limits are: layer ceilings, checks, slow members",
                       description=ANALYZE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = p.add_subparsers(dest="what", required=True, metavar="WHAT", parser_class=parser_class)
    h = what.add_parser("host", help="one host's analysis")
    connection_options(h, top=False)
    h.add_argument("name", help="the host")
    h.add_argument("--device", action="append", metavar="NAME",
                   help="only this device (repeatable; default: every device)")
    h.add_argument("--runs", type=runs, metavar="N",
                   help="latest benchmark runs compared for slow members (server default 10)")
    h.add_argument("-o", "--output", choices=("table", "yaml", "json"), default="table")


def command(args: argparse.Namespace, client: Client, out: Output) -> int:
    data = client.get_host_analysis(args.name, runs=args.runs)
    analysis = HostAnalysis.model_validate(data)
    if args.device:
        wanted = set(args.device)
        analysis.devices = [d for d in analysis.devices if d.device in wanted]
    if args.output != "table":
        out.dump(analysis.model_dump(mode="json"), args.output)
        return EXIT_OK
    print_analysis(analysis, out)
    return EXIT_OK


def print_analysis(analysis: HostAnalysis, out: Output) -> None:
    for section in render.sections(analysis):
        out.line(section.heading, "bold")
        if section.headers:
            out.table(section.headers, section.rows, indent=2)
        for line in section.lines:
            out.line(f"  {line}", "yellow" if section.attention else "")
        out.line()
