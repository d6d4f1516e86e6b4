"""Prometheus metrics of the control plane, served at ``/metrics`` (docs/metrics.md).

``recorder``  counters and histograms of what this process did since it started
              (prometheus-client, one registry per app)
``exposition`` the fleet's gauges in the text format, each host's lines kept until it changes
              (from services/fleet_state.py, which the host list's filters share)
``http``      REST request duration and codes by route template

The agent never imports this package (tests/test_boundaries.py): its idle memory budget
has no room for prometheus-client.
"""

from stortune.server.metrics.recorder import Recorder

__all__ = ["Recorder"]
