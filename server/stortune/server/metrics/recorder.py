"""What this process did since it started: counters and histograms, normal Prometheus semantics.

One registry per app (tests build many apps in one process); the reconciler,
the agent routes and the request middleware call the methods here and never
touch prometheus-client themselves. Every label takes values from a closed set
the code names (a tunable of the catalog, a reason this code writes), so
cardinality stays bounded whatever agents report.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

#: Reconciles take milliseconds when idle, seconds when an apply waits on a slow disk.
RECONCILE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
REQUEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class Recorder:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self._drift = Counter("stortune_drift_events", "Settings found changed since they were applied",
                              ["tunable", "cause"], registry=r)
        self._corrected = Counter("stortune_correction_events", "Drifted settings set back by an apply",
                                  ["tunable", "cause"], registry=r)
        self._apply_failed = Counter("stortune_apply_failures", "Applies that did not converge the host",
                                     ["reason"], registry=r)
        self._reconcile = Histogram("stortune_reconcile_duration_seconds", "One reconcile of one host",
                                    ["result"], buckets=RECONCILE_BUCKETS, registry=r)
        self._rpc_errors = Counter("stortune_agent_rpc_errors", "Reconciler calls to agents that failed",
                                   ["kind"], registry=r)
        self._heartbeats = Counter("stortune_agent_heartbeats", "Heartbeats accepted from agents",
                                   registry=r)
        self._lease_expiries = Counter("stortune_lease_expiries", "Agent leases that ran out", registry=r)
        self._requests = Histogram("stortune_http_request_duration_seconds", "REST requests by route",
                                   ["method", "route", "code"], buckets=REQUEST_BUCKETS, registry=r)
        self._queue_depth = Gauge("stortune_reconcile_queue_depth", "Hosts queued for a reconcile now",
                                  registry=r)
        self._queue_depth.set_function(lambda: 0.0)
        self._shards = Gauge("stortune_shards_owned", "Shards of the hosts this server works on now",
                             registry=r)
        self._shards.set_function(lambda: 0.0)
        self._shard_changes = Counter("stortune_shard_changes", "Shards gained, lost (a lease ran out"
                                      " or was taken) and released by this server", ["change"], registry=r)

    # -- the reconciler ------------------------------------------------------------------
    def drift(self, tunable: str, cause: str) -> None:
        self._drift.labels(tunable, cause).inc()

    def corrected(self, tunable: str, cause: str) -> None:
        self._corrected.labels(tunable, cause).inc()

    def apply_failed(self, reason: str) -> None:
        self._apply_failed.labels(reason).inc()

    def reconciled(self, result: str, seconds: float) -> None:
        self._reconcile.labels(result).observe(seconds)

    def rpc_error(self, kind: str) -> None:
        self._rpc_errors.labels(kind).inc()

    def lease_expired(self, count: int = 1) -> None:
        self._lease_expiries.inc(count)

    def queue_depth_from(self, depth: Callable[[], int]) -> None:
        """Read at each scrape: the queue's own length, no bookkeeping on the hot path."""
        self._queue_depth.set_function(lambda: float(depth()))

    # -- shards (several servers on one database) ------------------------------------------
    def shards_owned_from(self, owned: Callable[[], int]) -> None:
        self._shards.set_function(lambda: float(owned()))

    def shard_changes(self, change: str, count: int) -> None:
        if count:
            self._shard_changes.labels(change).inc(count)

    # -- the REST API ----------------------------------------------------------------------
    def heartbeat(self) -> None:
        self._heartbeats.inc()

    def request(self, method: str, route: str, code: int, seconds: float) -> None:
        self._requests.labels(method, route, str(code)).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)

