"""The exit codes every stortune command line shares, and the parser that keeps them.

0 is success and 1 any error, bad usage included. 2 carries a meaning a
pipeline acts on: ``stortune diff`` and ``stortune-agent plan`` found changes
to make, ``bench run`` a threshold failed, ``bench compare`` a regression.
argparse exits 2 on a usage error, which such a pipeline would read as
"changes pending"; ``Parser`` exits 1 instead. Every parser and subparser of
``stortune``, ``stortune-agent`` and ``stortune-server`` is one.
"""

from __future__ import annotations

import argparse
import sys
from typing import Final, NoReturn

EXIT_OK: Final = 0
EXIT_ERROR: Final = 1
#: diff/plan: differences or changes pending; bench: a threshold failed or a metric got worse.
EXIT_CHANGES: Final = 2


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors exit 1 (with the usage and the message, as argparse does)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message}\n")
