"""The ``stortune-server`` console script: the control plane, or which extra it misses.

``pip install stortune`` is the agent alone; the control plane's dependencies come
with ``stortune[server]``. Without them the command says so in one line instead of
a traceback. This module imports nothing the extra brings until it runs.
"""

from __future__ import annotations

from collections.abc import Callable

from stortune.schemas.launch import run_or_name_extra

#: The top-level modules of the `server` extra's distributions (pyproject.toml);
#: tests/test_extras.py keeps the two in step.
EXTRA_MODULES = frozenset({
    "fastapi", "fastapi_offline", "uvicorn", "httptools", "sqlalchemy", "alembic", "psycopg", "httpx",
    "matplotlib", "croniter", "optuna", "prometheus_client",
})


def main() -> int:
    def load() -> Callable[[], int]:
        from stortune.server.cli import main as run

        return run

    return run_or_name_extra("stortune-server", load, extra="server", modules=EXTRA_MODULES,
                             what="the control plane's")
