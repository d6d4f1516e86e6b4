"""``stortune``: apply, diff and inspect StorageProfiles and hosts through the control plane's REST API.

Exit codes: 0 success; 1 error (invalid document, unreachable or refusing
server, bad usage), and from ``wait`` when the rollout halted or the timeout
passed; 2 from ``diff`` when there are differences, and from
``bench run``/``bench compare`` when a threshold failed or a metric got worse.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Final

import yaml

from stortune.cli import analyze, audit, bench, manifests, probe, raidplan, render, rollout, sync, tune, tuned
from stortune.cli.client import (
    DEFAULT_SERVER,
    DEFAULT_TIMEOUT,
    Client,
    ClientError,
    Forbidden,
    Invalid,
    NotFound,
    Unauthorized,
    Unreachable,
    UsageError,
)
from stortune.cli.render import Output
from stortune.schemas.cliparser import Parser
from stortune.schemas.documents import DocumentError
from stortune.schemas.profile import check_labels

EXIT_OK: Final = 0
EXIT_ERROR: Final = 1
EXIT_DIFFERENT: Final = 2
SERVER_ENV: Final = "STORTUNE_SERVER"
TOKEN_ENV: Final = "STORTUNE_TOKEN"  # noqa: S105 - the variable's name, not a secret
ROLES: Final = ("admin", "operator", "viewer", "support", "agent", "metrics")

ACCESS_HELP: Final = """\
Issue, list and revoke API tokens (admin only). Roles: admin (everything),
operator (profiles, host labels, benchmarks, and every read), viewer (read
only), support (the hosts --hosts selects, their events and diagnostics,
until --expires), agent (what stortune-agent serve calls with --token-file),
metrics (a Prometheus server's scrape of /metrics, nothing else).
`create` prints the secret on stdout, once: the server keeps only its hash.

  stortune token create --role support --name vendor-1234 --hosts role=streamer --expires 72h
"""

DIFF_HELP: Final = """\
Compare the files with what the control plane holds, and with what the hosts
would do, without changing anything. Differences are: a document missing on the
server; a difference in spec, labels or annotations (shown as a unified diff);
with --prune, profiles an earlier apply created that the files no longer hold;
and what the hosts the documents select (or selected) would do, planned by the
server for the whole set at once: changes, and settings put back to their
originals because no profile sets them any more, e.g. after a setting was
removed or a profile pruned (changes of audit-mode profiles are shown but do
not count).

exit codes (for CI gates):
  0  in sync: applying would change nothing, on the server or on any host
  1  error: an invalid document (nothing is compared), the server unreachable
     or refusing a document
  2  differences found
"""

APPLY_HELP: Final = """\
Create or update the StorageProfiles in the files (multi-document YAML; a
directory adds its *.yaml and *.yml files recursively, sorted, hidden ones
skipped; - reads stdin). Every document is validated first; if any is invalid,
nothing is sent. Applied objects carry the annotation
stortune.dev/managed-by=stortune-apply: --prune deletes only profiles with it
that the files no longer hold, never profiles created by other means. BenchmarkSpec,
BenchmarkSchedule and TuningExperiment documents in the files are passed over (stortune bench
run -f, stortune tune run -f take them).
"""


# Errors that every further call would meet too: a command stops at the first, said once.
_FATAL: Final = (Unreachable, Unauthorized, Forbidden)


def _version() -> str:
    try:
        return version("stortune")
    except PackageNotFoundError:
        return "unknown"


def _connection_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    # On the top parser and every subcommand, so `stortune get hosts --server URL` works too;
    # SUPPRESS keeps a subcommand from resetting what was given before it.
    default: Any = None if top else argparse.SUPPRESS
    parser.add_argument("--server", metavar="URL", default=default,
                        help=f"control plane URL (default: ${SERVER_ENV}, else {DEFAULT_SERVER})")
    parser.add_argument("--request-timeout", metavar="SECONDS", type=_seconds,
                        default=DEFAULT_TIMEOUT if top else argparse.SUPPRESS,
                        help=f"give up on a request after this long (default {DEFAULT_TIMEOUT:g})")
    parser.add_argument("--token", metavar="TOKEN", default=default,
                        help=f"API token (default: --token-file, else ${TOKEN_ENV}); visible to other "
                             "local users in the process list, prefer the other two")
    parser.add_argument("--token-file", metavar="FILE", default=default,
                        help="read the API token from FILE")


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be more than 0")
    return seconds


def _files(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--filename", dest="files", action="append", required=True,
                        metavar="FILE|DIR", help="YAML file, directory of them, or - for stdin; repeatable")


_RESOURCES: Final = {
    "host": "hosts", "hosts": "hosts",
    "profile": "profiles", "profiles": "profiles", "storageprofile": "profiles",
    "storageprofiles": "profiles", "sp": "profiles",
    "event": "events", "events": "events", "ev": "events",
}


def _resource(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        found = _RESOURCES.get(text.lower())
        if found not in allowed:
            raise argparse.ArgumentTypeError(f"unknown resource {text!r}; expected {' or '.join(allowed)}")
        return found
    return parse


def _positive_int(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 1000:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number from 1 to 1000")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="stortune", description="Apply, diff and inspect StorageProfiles and hosts "
                                                  "through the stortune control plane's REST API.",
                     epilog="exit codes: 0 ok, 1 error (and wait: halted or timed out), 2 differences "
                            "(diff), a failed threshold or a regression (bench run, bench compare)")
    parser.add_argument("--version", action="version", version=f"stortune {_version()}")
    _connection_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    raw = argparse.RawDescriptionHelpFormatter

    p = sub.add_parser("apply", help="create or update profiles from files", description=APPLY_HELP,
                       formatter_class=raw)
    _connection_options(p, top=False)
    _files(p)
    p.add_argument("--dry-run", action="store_true",
                   help="validate on the server and print what each host would change; store nothing")
    p.add_argument("--prune", action="store_true",
                   help="delete profiles an earlier apply created that the files no longer hold")

    p = sub.add_parser("diff", help="what apply would change (exit 0 in sync, 2 different, 1 error)",
                       description=DIFF_HELP, formatter_class=raw)
    _connection_options(p, top=False)
    _files(p)
    p.add_argument("--prune", action="store_true",
                   help="also count profiles apply --prune would delete")

    p = sub.add_parser("get", help="list hosts, profiles or events")
    _connection_options(p, top=False)
    p.add_argument("resource", type=_resource("hosts", "profiles", "events"),
                   help="hosts, profiles or events")
    p.add_argument("name", nargs="?", help="one object (hosts and profiles)")
    p.add_argument("-o", "--output", choices=("table", "yaml", "json", "name"), default="table")
    p.add_argument("-l", "--selector", metavar="SELECTOR",
                   help="label selector, e.g. role=streamer,tier in (a,b),!legacy (hosts and profiles)")
    p.add_argument("--host", help="events of this host")
    p.add_argument("--profile", help="events of this profile")
    p.add_argument("--limit", type=_positive_int, help="at most this many events (server default 100)")

    p = sub.add_parser("describe", help="a host in detail: labels, facts, conditions, settings, events")
    _connection_options(p, top=False)
    p.add_argument("resource", type=_resource("hosts"), help="host")
    p.add_argument("name")

    p = sub.add_parser("label", help="set (key=value) or remove (key-) labels on a host",
                       description="Set or remove a host's API labels, kubectl style: "
                                   "`stortune label host web-1 tier=gold legacy-`. API labels win "
                                   "over labels the agent reports for the same key.")
    _connection_options(p, top=False)
    p.add_argument("resource", type=_resource("hosts"), help="host")
    p.add_argument("name")
    p.add_argument("labels", nargs="+", metavar="KEY=VALUE|KEY-")
    p.add_argument("--overwrite", action="store_true", help="allow replacing a label's existing value")

    p = sub.add_parser("diag", help="download a host's diagnostics bundle for vendor support (tar.gz)",
                       description="Collect a host's support bundle through the control plane: the "
                                   "agent's topology, procfs tables and storage tools' output, plus "
                                   "desired against observed settings, condition history and drift "
                                   "events. Hostnames, addresses, serials and WWNs are replaced by "
                                   "tokens unless an admin asks for --no-redact; the mapping stays "
                                   "on the control plane (GET /api/v1/redactions, admins only).")
    _connection_options(p, top=False)
    p.add_argument("host")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="where to write it (default: the name the server suggests, in this directory;"
                        " - for stdout)")
    p.add_argument("--no-redact", action="store_true", help="values in clear (admin tokens only)")
    p.add_argument("--tool-timeout", metavar="SECONDS", type=_seconds, default=0,
                   help="per storage tool on the host (default: the agent's)")

    p = sub.add_parser("token", help="issue, list and revoke API tokens (admin)", description=ACCESS_HELP,
                       formatter_class=raw)
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=Parser)
    t = actions.add_parser("create", help="issue a token; prints its secret once")
    _connection_options(t, top=False)
    t.add_argument("--role", required=True, choices=ROLES)
    t.add_argument("--name", help="who or what holds it (default: the role)")
    t.add_argument("--description", default="")
    t.add_argument("--hosts", metavar="SELECTOR",
                   help="support tokens: the hosts it may see, e.g. 'role=streamer,rack in (a1,a2)'")
    t.add_argument("--expires", metavar="DURATION", help="e.g. 72h, 30m, 7d (default: never)")
    t = actions.add_parser("list", help="every token (never a secret)")
    _connection_options(t, top=False)
    t.add_argument("-o", "--output", choices=("table", "yaml", "json"), default="table")
    t = actions.add_parser("revoke", help="revoke a token by its id")
    _connection_options(t, top=False)
    t.add_argument("id", help="the token's id (stortune token list)")

    bench.add_parser(sub, connection_options=_connection_options, parser_class=Parser)
    tune.add_parser(sub, connection_options=_connection_options, parser_class=Parser)
    audit.add_parser(sub, connection_options=_connection_options, limit=_positive_int)
    raidplan.add_parser(sub, parser_class=Parser)
    tuned.add_parser(sub, parser_class=Parser)
    analyze.add_parser(sub, connection_options=_connection_options, runs=_positive_int, parser_class=Parser)
    probe.add_parser(sub, connection_options=_connection_options)
    rollout.add_parser(sub, connection_options=_connection_options, parser_class=Parser)
    return parser


# Commands ------------------------------------------------------------------------


def _apply(args: argparse.Namespace, client: Client, out: Output) -> int:
    docs = manifests.read(args.files)
    suffix = " (dry run)" if args.dry_run else ""
    failed = False
    outcomes: list[sync.Outcome] = []
    for manifest in docs:
        try:
            outcome = sync.apply(client, manifest, dry_run=args.dry_run)
        except _FATAL:
            raise
        except ClientError as exc:
            _report(out, exc, manifest.ref)
            failed = True
            continue
        outcomes.append(outcome)
        out.line(f"{manifest.ref} {outcome.action}{suffix}",
                 "" if outcome.action == "unchanged" else "green")
    pruned: list[str] = []
    if args.prune:
        if failed:
            # The files were not all applied; deleting on their account could remove the wrong things.
            out.warn("not pruning: some documents were not applied")
        else:
            for profile in sync.prunable(client, {m.name for m in docs}):
                ref = f"storageprofile/{profile.name}"
                if args.dry_run:
                    out.line(f"{ref} pruned (dry run)", "yellow")
                    pruned.append(profile.name)
                    continue
                try:
                    deleted = client.delete_profile(profile.name)
                except NotFound:
                    continue  # deleted by someone else meanwhile: the outcome we wanted
                except _FATAL:
                    raise
                except ClientError as exc:
                    _report(out, exc, ref)
                    failed = True
                    continue
                pruned.append(profile.name)
                out.line(f"{ref} pruned" + (" (hosts are restoring its settings)" if deleted.pending
                                            else ""), "yellow")
    if args.dry_run:
        out.line()
        out.line("Planned changes on hosts (dry run; nothing stored):", "bold")
        plans = sync.host_changes(client, outcomes, pruned=pruned)
        render.host_plans(out, plans)
        found = sync.errors(plans, {m.name for m in docs})
        render.plan_errors(out, found)
        return EXIT_ERROR if failed or found else EXIT_OK
    if outcomes and not _stored_plans_hold_no_errors(client, out, outcomes):
        failed = True
    return EXIT_ERROR if failed else EXIT_OK


def _stored_plans_hold_no_errors(client: Client, out: Output, outcomes: list[sync.Outcome]) -> bool:
    """After an apply: the settings of these profiles the hosts they select cannot set, as the
    server plans them now (pruned ones are gone already), printed; so nobody learns of one only
    from a host's condition."""
    try:
        plans = sync.host_changes(client, outcomes)
    except _FATAL:
        raise
    except ClientError as exc:
        out.error(f"stored, but the hosts' plans could not be checked for errors: {exc}")
        return False
    found = sync.errors(plans, {o.manifest.name for o in outcomes})
    render.plan_errors(out, found)
    return not found


def _yaml(document: dict[str, Any]) -> str:
    # Sorted keys: the server may store JSON in another key order (PostgreSQL jsonb).
    return yaml.safe_dump(document, sort_keys=True, default_flow_style=False, allow_unicode=True)


def _diff(args: argparse.Namespace, client: Client, out: Output) -> int:
    docs = manifests.read(args.files)
    errors = differences = 0
    outcomes: list[sync.Outcome] = []
    for manifest in docs:
        try:
            outcome = sync.apply(client, manifest, dry_run=True)
        except _FATAL:
            raise
        except ClientError as exc:
            _report(out, exc, manifest.ref)
            errors += 1
            continue
        outcomes.append(outcome)
        if outcome.action == "unchanged":
            continue
        differences += 1
        before = "" if outcome.live is None else _yaml(manifests.live(outcome.live))
        out.diff(before, _yaml(manifest.compared()),
                 "/dev/null" if outcome.live is None else f"server:{manifest.ref}",
                 f"{manifest.source}:{manifest.ref}")
    pruned: list[str] = []
    if args.prune and not errors:
        for profile in sync.prunable(client, {m.name for m in docs}):
            differences += 1
            pruned.append(profile.name)
            out.diff(_yaml(manifests.live(profile)), "", f"server:storageprofile/{profile.name}",
                     "/dev/null (pruned)")
    if errors:
        out.error(f"{errors} document(s) could not be compared")
        return EXIT_ERROR
    hosts = [h for h in sync.host_changes(client, outcomes, pruned=pruned)
             if h.changes or h.restorations or h.rejections or not h.topology_reported]
    pending = sum(sync.pending(h) for h in hosts)
    if hosts:
        out.line("Pending changes on hosts (dry run):", "bold")
        render.host_plans(out, hosts)
    # An error outranks "differences": a gate must not go on to apply it.
    if found := sync.errors(hosts, {m.name for m in docs}):
        render.plan_errors(out, found)
        return EXIT_ERROR
    if differences or pending:
        out.line(f"{differences} profile difference(s), {pending} pending host change(s)", "yellow")
        return EXIT_DIFFERENT
    out.line(f"in sync: {len(docs)} profile(s), no pending host changes", "green")
    return EXIT_OK


def _get(args: argparse.Namespace, client: Client, out: Output) -> int:
    if args.resource == "events":
        if args.name:
            raise UsageError("get events takes no NAME; use --host or --profile")
        if args.selector:
            raise UsageError("events have no labels; filter with --host or --profile")
        listing = client.list_events(host=args.host, profile=args.profile, limit=args.limit)
        return _show(out, args.output, raw=listing.raw, kind="event",
                     names=[str(e.raw.get("id", "")) for e in listing.items],
                     table=render.event_rows(listing.items))
    if args.host or args.profile or args.limit is not None:
        raise UsageError("--host, --profile and --limit apply to events")
    if args.name and args.selector:
        raise UsageError("give a NAME or a --selector, not both")
    if args.resource == "hosts":
        if args.name:
            host = client.get_host(args.name)
            return _show(out, args.output, raw=host.raw, kind="host", names=[host.name],
                         table=render.host_rows([host]))
        hosts = client.list_hosts(args.selector)
        return _show(out, args.output, raw=hosts.raw, kind="host", names=[h.name for h in hosts.items],
                     table=render.host_rows(hosts.items))
    if args.name:
        profile = client.get_profile(args.name)
        return _show(out, args.output, raw=profile.raw, kind="storageprofile", names=[profile.name],
                     table=render.profile_rows([profile]))
    profiles = client.list_profiles(args.selector)
    return _show(out, args.output, raw=profiles.raw, kind="storageprofile",
                 names=[p.name for p in profiles.items], table=render.profile_rows(profiles.items))


def _show(out: Output, fmt: str, *, raw: dict[str, Any], kind: str, names: list[str],
          table: tuple[list[str], list[render.Row]]) -> int:
    if fmt in ("json", "yaml"):
        out.dump(raw, fmt)
    elif fmt == "name":
        for name in names:
            out.line(f"{kind}/{name}")
    elif table[1]:
        out.table(*table)
    else:
        out.note("No resources found.")
    return EXIT_OK


def _describe(args: argparse.Namespace, client: Client, out: Output) -> int:
    host = client.get_host(args.name)
    lease = client.get_host_lease(host.name)
    events = client.list_events(host=host.name, limit=20).items
    render.describe_host(out, host, events, lease, client.get_host_protected(host.name))
    return EXIT_OK


def _parse_label_changes(items: Sequence[str]) -> dict[str, str | None]:
    changes: dict[str, str | None] = {}
    for item in items:
        key, sep, val = item.partition("=")
        if sep:
            new: str | None = val
        elif item.endswith("-") and len(item) > 1:
            key, new = item[:-1], None
        else:
            raise UsageError(f"{item!r}: expected KEY=VALUE to set a label or KEY- to remove it")
        try:
            check_labels({key: new or ""})
        except ValueError as exc:
            raise UsageError(f"{item!r}: {exc}") from None
        if key in changes:
            raise UsageError(f"label {key!r} is given more than once")
        changes[key] = new
    return changes


def _label(args: argparse.Namespace, client: Client, out: Output) -> int:
    changes = _parse_label_changes(args.labels)
    host = client.get_host(args.name)
    for key, new in changes.items():
        old = host.labels.get(key)
        if new is not None and old is not None and old != new and not args.overwrite:
            raise UsageError(f"label {key!r} already has a value ({old}); use --overwrite to replace it")
        if new is None and key not in host.api_labels:
            if key in host.reported_labels:
                out.warn(f"label {key!r} is reported by the agent, not set through the API, so it "
                         "cannot be removed here; set a value to override it, or change the agent's "
                         "--label")
            else:
                out.warn(f"label {key!r} not found")
    client.merge_host_labels(host.name, changes)
    removing_only = all(v is None for v in changes.values())
    out.line(f"host/{host.name} {'unlabeled' if removing_only else 'labeled'}")
    return EXIT_OK


def _token(args: argparse.Namespace, client: Client, out: Output) -> int:
    if args.action == "create":
        token, secret = client.create_token(args.role, name=args.name, description=args.description,
                                            hosts=args.hosts, expires=args.expires)
        until = f", expires {token.expires.isoformat(timespec='seconds')}" if token.expires else ""
        out.note(f"token {token.id} ({token.name}, role {token.role}{until}) created; "
                 "its secret is shown this once:")
        out.line(secret)
        return EXIT_OK
    if args.action == "list":
        listing = client.list_tokens()
        return _show(out, args.output, raw=listing.raw, kind="token",
                     names=[t.id for t in listing.items], table=render.token_rows(listing.items))
    revoked = client.revoke_token(args.id)
    out.line(f"token/{revoked.id} ({revoked.name}) revoked")
    return EXIT_OK


def _diag(args: argparse.Namespace, client: Client, out: Output) -> int:
    data, suggested = client.download_diagnostics(args.host, redact=not args.no_redact,
                                                   tool_timeout=args.tool_timeout)
    if args.output == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return EXIT_OK
    target = Path(args.output or suggested or f"stortune-diag-{args.host}.tar.gz")
    try:
        # 0600: even a redacted bundle describes the customer's storage.
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
    except OSError as exc:
        raise UsageError(f"--output {target}: {exc.strerror or exc}") from None
    how = "in clear (not redacted)" if args.no_redact else "redacted"
    out.line(f"{target}: diagnostics of {args.host}, {len(data):,} bytes, {how}")
    return EXIT_OK


COMMANDS: Final[dict[str, Callable[[argparse.Namespace, Client, Output], int]]] = {
    "apply": _apply, "diff": _diff, "get": _get, "describe": _describe, "label": _label,
    "token": _token, "diag": _diag, "bench": bench.command, "audit": audit.command,
    "tune": tune.command, "plan": raidplan.command, "analyze": analyze.command,
    "probe": probe.command, "import": tuned.import_command, "export": tuned.export_command,
    "rollout": rollout.command, "wait": rollout.wait_command,
}


# Errors and the entry point ----------------------------------------------------------


def _report(out: Output, exc: ClientError, ref: str | None = None) -> None:
    prefix = f"{ref}: " if ref else ""
    if isinstance(exc, Invalid) and exc.causes:
        out.error(f"{prefix}refused by the control plane as invalid:")
        for cause in exc.causes:
            out.note(f"  {cause}")
        return
    if isinstance(exc, Unauthorized):
        out.error(f"{prefix}not authenticated: {exc.message}")
        out.note(f"  give an API token with --token-file FILE, ${TOKEN_ENV} or --token "
                 "(the first admin token is in the server's STATE_DIR/admin.token)")
        return
    if isinstance(exc, Forbidden):
        out.error(f"{prefix}forbidden: {exc.message}")
        return
    out.error(f"{prefix}{exc.message}")


def server_url(given: str | None) -> str:
    url = (given or os.environ.get(SERVER_ENV) or DEFAULT_SERVER).strip()
    if not url.startswith(("http://", "https://")):
        source = "--server" if given else SERVER_ENV
        raise UsageError(f"{source} {url!r}: expected an http:// or https:// URL, e.g. {DEFAULT_SERVER}")
    return url.rstrip("/")


def api_token(given: str | None, path: str | None) -> str | None:
    """--token, else --token-file, else $STORTUNE_TOKEN; None: call without one."""
    if given:
        return given.strip()
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise UsageError(f"--token-file {path}: {exc.strerror or exc}") from None
        if not text:
            raise UsageError(f"--token-file {path} is empty")
        return text
    return os.environ.get(TOKEN_ENV, "").strip() or None


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR
    out = Output(sys.stdout, sys.stderr)
    try:
        token = api_token(args.token, args.token_file)
        with Client(server_url(args.server), token=token, timeout=args.request_timeout) as client:
            return COMMANDS[args.command](args, client, out)
    except DocumentError as exc:
        out.error("invalid document(s); nothing was sent to the control plane")
        for problem in exc.problems:
            out.note(f"  {problem}")
    except UsageError as exc:
        out.error(str(exc))
    except ClientError as exc:
        _report(out, exc)
    except BrokenPipeError:
        # The reader went away (| head): stop quietly, and keep Python from complaining at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except KeyboardInterrupt:
        return 130
    return EXIT_ERROR


if __name__ == "__main__":
    raise SystemExit(main())
