"""``python -m stortune.agent.tlscheck KEY CERT CA [NAME]``: can these files serve TLS?

Without NAME: whether the key and the certificate belong together. With NAME:
also whether a peer that trusts only CA and dials NAME accepts the certificate
(``TLSFiles.server_identity``); the names and expiry it vouches for are printed
as JSON. Exit 0 when usable, 1 with the reason on stderr.

The agent runs this as a child process (``identity.check_pair``,
``identity.identity_of``): the OpenSSL contexts and handshake state a check
builds would otherwise stay in the idle agent's memory, about 1 MiB.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from stortune.api.agent.tlsfiles import TLSError, TLSFiles


def check(files: TLSFiles, name: str | None) -> str:
    """What to print: {} for a pair that belongs together, the identity when NAME is given."""
    if name is None:
        files.read()
        return "{}"
    found = files.server_identity(name)
    return json.dumps({"names": sorted(found.names), "notAfter": found.not_after.isoformat()})


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) not in (3, 4):
        print("usage: python -m stortune.agent.tlscheck KEY CERT CA [NAME]", file=sys.stderr)
        return 1
    files = TLSFiles(key=Path(args[0]), cert=Path(args[1]), ca=Path(args[2]))
    try:
        print(check(files, args[3] if len(args) == 4 else None))
    except TLSError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
