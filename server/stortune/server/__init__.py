"""The stortune control plane: profiles and hosts behind a Kubernetes-style HTTP API.

The public surface is small: ``create_app(settings)`` builds the service,
``Settings`` configures it and ``Controller`` is the seam the reconciler plugs
into. Everything else is private to the package.

The names are imported when first used: ``stortune.server.launch`` must load
where the ``server`` extra (FastAPI, SQLAlchemy...) is not installed, to say so.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stortune.server.app import create_app
    from stortune.server.controller import Controller, RecordingController
    from stortune.server.settings import Settings

__all__ = ["Controller", "RecordingController", "Settings", "create_app"]

_HOMES = {"create_app": "stortune.server.app", "Controller": "stortune.server.controller",
          "RecordingController": "stortune.server.controller", "Settings": "stortune.server.settings"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'stortune.server' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
