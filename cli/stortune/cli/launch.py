"""The ``stortune`` console script: the client, or which extra it misses.

``pip install stortune`` is the agent alone; the client's HTTP library comes with
``stortune[cli]``. Without it the command says so in one line instead of a traceback.
"""

from __future__ import annotations

from collections.abc import Callable

from stortune.schemas.launch import run_or_name_extra

#: The top-level modules of the `cli` extra's distributions (pyproject.toml);
#: tests/test_extras.py keeps the two in step.
EXTRA_MODULES = frozenset({"httpx"})


def main() -> int:
    def load() -> Callable[[], int]:
        from stortune.cli.main import main as run

        return run

    return run_or_name_extra("stortune", load, extra="cli", modules=EXTRA_MODULES,
                             what="the client's")
