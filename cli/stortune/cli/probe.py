"""``stortune probe HOST [--device D] --consent``: measure a device's ceilings on its host.

The agent reads each member disk (or path) of the device alone, then 1, 2, 4 ... at once,
read-only and holding the host's benchmark lock; the control plane stores what it measured
and the host analysis (stortune analyze host) uses it as measured ceilings.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any, Final

from stortune.cli.client import Client, UsageError
from stortune.cli.render import Output
from stortune.schemas.analysis.probe import ProbeResult
from stortune.schemas.analysis.render import mbps

EXIT_OK: Final = 0
EXIT_ERROR: Final = 1
POLL_SECONDS: Final = 2.0

PROBE_HELP: Final = """\
Measure where a device's limits are: its member disks (or multipath paths) are read alone,
sequential 1 MiB and random 4 KiB direct reads, then 1, 2, 4 ... members at once, to find each
disk's ceiling and where adding members stops adding throughput (a shared layer: the HBA, a
port, the PCIe link). Read-only, but it loads the disks for a few seconds per step: --consent
says you accept that on this host. Refused while a benchmark or another probe runs there.

  stortune probe db01 --device md126 --consent
  stortune probe db01 --list
"""


def add_parser(sub: Any, *, connection_options: Callable[..., None]) -> None:
    p = sub.add_parser("probe", help="measure a device's ceilings on its host (loads its disks)",
                       description=PROBE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    connection_options(p, top=False)
    p.add_argument("host")
    p.add_argument("--device", help="the device whose members are read (default: every disk)")
    p.add_argument("--consent", action="store_true",
                   help="accept that the probe loads the host's disks (required to start one)")
    p.add_argument("--no-wait", action="store_true", help="start it and return its id")
    p.add_argument("--list", action="store_true", help="the host's probes, newest first")
    p.add_argument("--show", metavar="ID", help="one probe and what it measured")
    p.add_argument("--cancel", metavar="ID", help="stop a running probe")
    p.add_argument("-o", "--output", choices=("table", "yaml", "json"), default="table")


def command(args: argparse.Namespace, client: Client, out: Output) -> int:
    if args.list:
        data = client.list_probes(args.host)
        if args.output != "table":
            out.dump(data, args.output)
            return EXIT_OK
        items = [i for i in data.get("items") or [] if isinstance(i, dict)]
        out.table(("ID", "DEVICE", "STATE", "CREATED", "MESSAGE"),
                  [[str(i.get("id")), str(i.get("device") or "(every disk)"), str(i.get("state")),
                    str(i.get("createdAt")), str(i.get("message") or "")] for i in items])
        return EXIT_OK
    if args.cancel:
        return _show(client.cancel_probe(args.host, args.cancel), args, out)
    if args.show:
        return _show(client.get_probe(args.host, args.show), args, out)
    if not args.consent:
        raise UsageError("a probe loads the host's disks: add --consent to start one")
    view = client.start_probe(args.host, device=args.device)
    probe_id = str(view.get("id"))
    out.note(f"probe {probe_id} started on {args.host}")
    if args.no_wait:
        out.line(probe_id)
        return EXIT_OK
    while view.get("state") in ("queued", "running"):
        time.sleep(POLL_SECONDS)
        view = client.get_probe(args.host, probe_id)
    return _show(view, args, out)


def _show(view: dict[str, Any], args: argparse.Namespace, out: Output) -> int:
    if args.output != "table":
        out.dump(view, args.output)
    else:
        print_probe(view, out)
    return EXIT_OK if view.get("state") in ("done", "queued", "running") else EXIT_ERROR


def print_probe(view: dict[str, Any], out: Output) -> None:
    out.line(f"probe {view.get('id')} on {view.get('host')}: {view.get('state')}"
             + (f" ({view['message']})" if view.get("message") else ""), "bold")
    raw = view.get("result")
    if not isinstance(raw, dict):
        return
    result = ProbeResult.model_validate(raw)
    out.table(("DEVICE", "SEQUENTIAL READ", "RANDOM 4K READ"),
              [[c.device, mbps(c.read_bytes_per_second),
                "-" if c.read_iops is None else f"{c.read_iops:,.0f} IOPS"] for c in result.ceilings],
              indent=2)
    if result.scaling:
        out.line("  scaling (members read at once):")
        out.table(("AT ONCE", "THROUGHPUT", "GAIN"),
                  [[str(p.count), mbps(p.read_bytes_per_second),
                    "-" if p.gain is None else f"{p.gain:+.0%}"] for p in result.scaling], indent=4)
        if result.scaling_stops_at is not None:
            out.line(f"  adding members stopped adding 10 % from {result.scaling_stops_at} at once:"
                     " a shared layer above the disks is the limit")
