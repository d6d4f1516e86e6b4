"""``stortune audit``: the control plane's audit log (admins), newest first.

    stortune audit [--token-id ID] [--method M] [--resource R] [--since TIME] [--limit N]
                   [-o table|yaml|json]

The filters are GET /api/v1/audit's query parameters; the acting token's filter
is ``--token-id`` because ``--token`` is the caller's own API token.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from stortune.cli.client import JSON, Client
from stortune.cli.render import Cell, Output, Row

EXIT_OK: Final = 0
METHODS: Final = ("GET", "POST", "PUT", "PATCH", "DELETE")

AUDIT_HELP: Final = """\
Who did what, when and from where: every mutating call and every diagnostics
download, whatever its outcome (admin tokens only). Newest first.

  stortune audit --since 2025-03-01T00:00:00Z --method DELETE
  stortune audit --resource profiles/vod-streamer -o json
  stortune audit --token-id 3f9c0a1b2d4e        # what one token did (stortune token list)
"""


def _method(text: str) -> str:
    upper = text.upper()
    if upper not in METHODS:
        raise argparse.ArgumentTypeError(f"{text!r}: expected one of {', '.join(METHODS)}")
    return upper


def add_parser(sub: Any, *, connection_options: Callable[..., None],
               limit: Callable[[str], int]) -> None:
    p = sub.add_parser("audit", help="the audit log: who did what, when, from where (admin)",
                       description=AUDIT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    connection_options(p, top=False)
    p.add_argument("--token-id", metavar="ID",
                   help="calls made with this token (its id: stortune token list)")
    p.add_argument("--method", type=_method, metavar="METHOD", help="one of " + ", ".join(METHODS))
    p.add_argument("--resource", help="what the call was about: profiles, or profiles/NAME")
    p.add_argument("--since", metavar="TIME", help="RFC 3339, e.g. 2025-03-01T12:00:00Z (a time without a "
                                                   "zone is UTC)")
    p.add_argument("--limit", type=limit, help="at most this many records (server default 100)")
    p.add_argument("-o", "--output", choices=("table", "yaml", "json"), default="table")


def _when(value: Any) -> str:
    if not isinstance(value, str):
        return "-"
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return value
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return f"{moment.astimezone(UTC):%Y-%m-%d %H:%M:%SZ}"


def _code(value: Any) -> Cell:
    code = value if isinstance(value, int) and not isinstance(value, bool) else 0
    style = "green" if 200 <= code < 300 else "red" if code >= 500 else "yellow" if code >= 400 else ""
    return Cell(str(code or "-"), style)


def rows(records: Sequence[JSON]) -> tuple[list[str], list[Row]]:
    out: list[Row] = []
    for r in records:
        out.append([_when(r.get("time")), f"{r.get('tokenName', '')} ({r.get('tokenId', '')})",
                    str(r.get("role", "")), str(r.get("method", "")), str(r.get("resource", "")),
                    _code(r.get("code")), str(r.get("client", "")), str(r.get("path", ""))])
    return ["TIME", "TOKEN", "ROLE", "METHOD", "RESOURCE", "CODE", "CLIENT", "PATH"], out


def command(args: argparse.Namespace, client: Client, out: Output) -> int:
    data = client.list_audit(token=args.token_id, method=args.method, resource=args.resource,
                             since=args.since, limit=args.limit)
    if args.output != "table":
        out.dump(data, args.output)
        return EXIT_OK
    items = data.get("items")
    records = [r for r in items if isinstance(r, dict)] if isinstance(items, list) else []
    if records:
        out.table(*rows(records))
    else:
        out.note("No audit records found.")
    return EXIT_OK
