"""``stortune-agent``: discover, explain, plan, apply and restore on this host.

Exit codes: 0 success (``plan``: nothing to change), 2 ``plan`` has changes
pending, 1 error. Errors go to stderr and name the field, device or tunable.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from stortune.agent import local, render
from stortune.agent.kernelfs import KernelFS
from stortune.schemas.documents import DocumentError
from stortune.schemas.profile import check_labels

EXIT_OK, EXIT_ERROR, EXIT_PENDING = 0, 1, 2
DEFAULT_STATE_DIR = "/var/lib/stortune"


def _roots(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sysfs", default="/sys", help="sysfs root (default /sys)")
    p.add_argument("--procfs", default="/proc", help="procfs root (default /proc)")


def _files(p: argparse.ArgumentParser) -> None:
    p.add_argument("-f", "--file", action="append", required=True, metavar="FILE|DIR",
                   help="StorageProfile YAML file, directory of them, or - for stdin; repeatable")


def _state(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state-dir", default=DEFAULT_STATE_DIR,
                   help=f"journal and originals (default {DEFAULT_STATE_DIR})")


def _output(p: argparse.ArgumentParser, choices: Sequence[str], default: str) -> None:
    p.add_argument("-o", "--output", choices=choices, default=default)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stortune-agent", description=__doc__.split("\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("topology", help="discover the block-device topology")
    _roots(p)
    _output(p, ("json", "yaml", "table"), "table")

    p = sub.add_parser("explain", help="which rule wins for each device, and why others did not")
    _roots(p)
    _files(p)
    p.add_argument("--all", action="store_true", help="also devices no rule matched")

    p = sub.add_parser("plan", help="dry run: the ordered changes (exit 2 when any)")
    _roots(p)
    _files(p)
    _output(p, ("json", "yaml", "table"), "table")

    p = sub.add_parser("apply", help="apply transactionally: journal, write, verify, roll back")
    _roots(p)
    _files(p)
    _state(p)
    _output(p, ("json", "yaml", "table"), "table")

    p = sub.add_parser("restore", help="put every changed setting back to its recorded original")
    _roots(p)
    _state(p)
    _output(p, ("json", "yaml", "table"), "table")

    p = sub.add_parser("udev-rules", help="export the resolved settings as udev rules")
    _roots(p)
    _files(p)

    p = sub.add_parser("serve", help="keep the last desired state applied (boot, hot-plug);"
                                     " with --listen/--server, also serve the control plane")
    _roots(p)
    _state(p)
    p.add_argument("--rescan-interval", type=float, default=30.0,
                   help="seconds between rescans when udev events are unavailable")
    p.add_argument("--once", action="store_true", help="recover, re-apply and exit")
    p.add_argument("--server", metavar="URL",
                   help="control plane base URL (http://host:port): register and heartbeat")
    p.add_argument("--listen", metavar="ADDR",
                   help="serve the agent gRPC API on HOST:PORT (port 0: any free port);"
                        " required with --server")
    p.add_argument("--advertise", metavar="ADDR",
                   help="HOST:PORT the control plane should dial (default: the --listen address,"
                        " with this host's name for a wildcard host)")
    p.add_argument("--name", help="agent name at the control plane (default: the hostname)")
    p.add_argument("--label", action="append", default=[], type=_label, metavar="KEY=VALUE",
                   help="label for profile host selectors; repeatable")
    p.add_argument("--heartbeat", type=_positive, metavar="S",
                   help="heartbeat at least this often (default: the server's interval)")
    return parser


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE, e.g. role=streamer")
    try:
        check_labels({key: value})
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return key, value


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be more than 0 seconds")
    return value


def _fs(args: argparse.Namespace) -> KernelFS:
    return KernelFS.at(args.sysfs, args.procfs)


def _topology(args: argparse.Namespace) -> int:
    topo = local.discover(_fs(args))
    if args.output == "table":
        render.topology_table(topo)
    else:
        render.dump(topo.model_dump(mode="json", exclude_none=False), args.output)
    return EXIT_OK


def _explain(args: argparse.Namespace) -> int:
    profiles = local.read_profiles(args.file)
    plan = local.plan(_fs(args), profiles).plan
    render.explain_table(plan, verbose=args.all)
    return EXIT_OK


def _plan(args: argparse.Namespace) -> int:
    profiles = local.read_profiles(args.file)
    plan = local.plan(_fs(args), profiles).plan
    if args.output == "table":
        render.plan_table(plan)
    else:
        render.dump(plan.model_dump(mode="json", exclude={"explanations"}), args.output)
    if plan.fatal:
        return EXIT_ERROR
    return EXIT_PENDING if plan.changes else EXIT_OK


def _report(report: local.Report, fmt: str) -> int:
    if fmt == "table":
        render.table(report.title, ["device", "tunable", "before", "after", "status"],
                     [[r.device, r.tunable, r.before, r.after, r.status] for r in report.rows])
        for msg in report.messages:
            print(msg, file=sys.stderr if not report.ok else sys.stdout)
    else:
        render.dump(report.model_dump(mode="json"), fmt)
    return EXIT_OK if report.ok else EXIT_ERROR


def _apply(args: argparse.Namespace) -> int:
    profiles = local.read_profiles(args.file)
    return _report(local.apply(_fs(args), profiles, Path(args.state_dir)), args.output)


def _restore(args: argparse.Namespace) -> int:
    return _report(local.restore(_fs(args), Path(args.state_dir)), args.output)


def _udev(args: argparse.Namespace) -> int:
    from stortune.agent import udev

    profiles = local.read_profiles(args.file)
    planned = local.plan(_fs(args), profiles)
    sys.stdout.write(udev.render(profiles, planned.topology, planned.plan))
    return EXIT_OK


def _serve(args: argparse.Namespace) -> int:
    managed = args.listen or args.server
    if not managed:
        from stortune.agent import daemon

        return daemon.run(_fs(args), Path(args.state_dir), args.rescan_interval, once=args.once)
    if args.once:
        raise local.AgentError("--once re-applies and exits; it cannot be combined with"
                               " --listen/--server")
    if args.server and not args.listen:
        raise local.AgentError("--server needs --listen HOST:PORT: the control plane calls the"
                               " agent there")
    if args.server and not args.server.startswith(("http://", "https://")):
        raise local.AgentError(f"--server {args.server!r}: expected an http:// or https:// URL")
    labels = dict(args.label)
    if len(labels) != len(args.label):
        dupes = sorted({k for k, _ in args.label if [k2 for k2, _ in args.label].count(k) > 1})
        raise local.AgentError(f"--label {', '.join(dupes)} given more than once")
    # Imported here: grpc is needed only by the managed agent.
    from stortune.agent import serve

    options = serve.ServeOptions(
        listen=args.listen, server=args.server, name=args.name, labels=labels,
        heartbeat=args.heartbeat, advertise=args.advertise, rescan_interval=args.rescan_interval,
    )
    return serve.run(_fs(args), Path(args.state_dir), options)


COMMANDS = {
    "topology": _topology, "explain": _explain, "plan": _plan, "apply": _apply,
    "restore": _restore, "udev-rules": _udev, "serve": _serve,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return COMMANDS[args.command](args)
    except DocumentError as exc:
        print(f"error: invalid document\n{exc}", file=sys.stderr)
    except local.AgentError as exc:
        print(f"error: {exc}", file=sys.stderr)
    except BrokenPipeError:
        return EXIT_OK
    except KeyboardInterrupt:
        return 130
    return EXIT_ERROR


if __name__ == "__main__":
    raise SystemExit(main())
