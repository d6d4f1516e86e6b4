"""Console scripts that need an extra: run the command, or say in one line which extra to install.

``pip install stortune`` is the agent alone; the control plane and the client come with extras.
A launcher imports nothing of its extra until it runs, so a missing dependency is one line
naming the extra, not a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable


def run_or_name_extra(command: str, load: Callable[[], Callable[[], int]], *, extra: str,
                      modules: frozenset[str], what: str) -> int:
    """``load()`` returns the command's main; a missing module of ``modules`` names ``extra``."""
    try:
        run = load()
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing not in modules:
            raise
        print(f"{command}: {what} dependencies are not installed (no module {missing!r}); install them"
              f" with: pip install 'stortune[{extra}]'", file=sys.stderr)
        return 1
    return run()
