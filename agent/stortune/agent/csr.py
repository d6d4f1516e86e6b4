"""``python -m stortune.agent.csr KEYFILE NAME``: print a CSR for NAME signed by the key in KEYFILE.

The key is made (P-256, mode 0600) when KEYFILE is missing or does not hold a
usable key; it never leaves the host. The agent runs this as a child process
(``identity.make_csr``) so that cryptography never stays loaded in it.
Exit 0 with the CSR on stdout, 1 with the reason on stderr.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from stortune.api.agent import tls


def csr_for(key_file: Path, name: str) -> bytes:
    try:
        return tls.make_csr(key_file.read_bytes(), name)
    except (OSError, tls.TLSError):
        key = tls.new_key()
        tls.write_private(key_file, key)
        return tls.make_csr(key, name)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m stortune.agent.csr KEYFILE NAME", file=sys.stderr)
        return 1
    try:
        sys.stdout.buffer.write(csr_for(Path(args[0]), args[1]))
    except OSError as exc:
        print(f"{args[0]}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
