"""The stortune control plane: profiles and hosts behind a Kubernetes-style HTTP API.

The public surface is small: ``create_app(settings)`` builds the service,
``Settings`` configures it and ``Controller`` is the seam the reconciler plugs
into. Everything else is private to the package.
"""

from stortune.server.app import create_app
from stortune.server.controller import Controller, RecordingController
from stortune.server.settings import Settings

__all__ = ["Controller", "RecordingController", "Settings", "create_app"]
