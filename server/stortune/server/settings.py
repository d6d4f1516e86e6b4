"""The one settings object of the control plane."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from stortune.schemas.stripecache import DEFAULT_RAM_SHARE

DEFAULT_STATE_DIR = Path("/var/lib/stortune-server")
DEFAULT_LISTEN = "127.0.0.1:8080"
#: The largest request body: a topology of a large host is a few MiB; profiles are kilobytes.
DEFAULT_MAX_BODY_BYTES = 8 << 20


def default_db_url(state_dir: Path) -> str:
    return f"sqlite:///{state_dir / 'stortune.db'}"


def split_listen(listen: str) -> tuple[str, int]:
    """'HOST:PORT' or '[v6]:PORT' -> (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{listen!r} is not HOST:PORT (e.g. 127.0.0.1:8080 or [::1]:8080)")
    return host.removeprefix("[").removesuffix("]"), int(port)


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    db_url: str = Field(default_factory=lambda: default_db_url(DEFAULT_STATE_DIR),
                        description="SQLAlchemy URL: sqlite:///PATH or postgresql+psycopg://...")
    listen: str = DEFAULT_LISTEN
    # Every host is looked at this often even when nothing asked for it (drift
    # detection, lease expiry). At most a minute: drift must not go unseen long.
    reconcile_interval_s: float = Field(default=30, gt=0, le=60)
    # Concurrent reconciles; each mostly waits on its agent's gRPC answer.
    reconcile_workers: int = Field(default=16, ge=1, le=256)
    # Kubernetes' node lease defaults: renewed every 10 s, expired after 40 s. Agents that
    # stop answering are noticed sooner by the reconciler's calls than by their lease.
    lease_duration_s: float = Field(default=40, gt=0)
    heartbeat_interval_s: float = Field(default=10, gt=0)
    # The fleet's heartbeat budget: past max_heartbeats_per_s * heartbeat_interval_s hosts,
    # agents are told to heartbeat less often and their leases last longer (services/pacing.py).
    max_heartbeats_per_s: float = Field(default=5, gt=0)
    # An agent's watch (POST /agents/{name}/watch) is held this long at most, then called again:
    # while it is held the agent's lease is kept in batches, with no request per heartbeat, and
    # an agent that goes away is noticed within the lease (docs/replicas.md, "Agents at scale").
    agent_watch_s: float = Field(default=300, gt=0, le=3600)
    # Agents that report their values' digest are not asked every interval: only every ten
    # intervals, or less often once the fleet would need more looks a second than this.
    max_looks_per_s: float = Field(default=10, gt=0)
    # Hostile input: bodies larger than this are 413; JSON or YAML nested deeper than
    # this is 400 before any parser recurses (documents here are about 8 levels deep).
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, ge=1024)
    max_document_depth: int = Field(default=64, ge=8, le=256)
    # The work one document (profile, benchmark, experiment, schedule) may give its parser: bytes
    # (documents are KiB; the body limit above is for topologies), nodes (values, lists and
    # mappings, keys included) and characters in one value. Bytes alone do not bound it: a 1.3 MiB
    # profile of 100,000 keys held the parser for seconds (issue 26).
    max_document_bytes: int = Field(default=1 << 20, ge=1024)
    max_document_nodes: int = Field(default=20_000, ge=1000, le=1_000_000)
    max_document_value_chars: int = Field(default=256 * 1024, ge=1024)
    # Documents (and large JSON bodies) parsed at once, off the event loop (api/documents.py);
    # 16 more per parser may wait, the rest are answered 503 at once.
    document_parsers: int = Field(default=1, ge=1, le=64)
    # Per-token rate limits of expensive calls, in calls per minute, by name
    # ("dry-run", "diagnostics", "benchmark-runs"); unnamed ones keep the route's default.
    rate_limits: dict[str, float] = Field(default_factory=dict)
    # The settings a host's agent set back on its own (reported with its heartbeats) become events:
    # the same device, tunable and cause within 10 minutes raise one event's count; new ones past
    # this many a minute per host are counted and summed up in one event, not written one by one.
    agent_correction_events_per_minute: int = Field(default=30, ge=1, le=10_000)
    # The benchmark run queue is looked at this often (and at once when a run is asked for):
    # due schedules fire, queued runs whose retry time came are started.
    benchmark_interval_s: float = Field(default=5, gt=0, le=60)
    # A run whose agent does not answer for this long fails, with the reason.
    benchmark_unreachable_timeout_s: float = Field(default=600, gt=0)
    # Tuning experiments: the most points a grid may hold (the document's own limit is 4096;
    # a smaller fleet-wide limit keeps a careless grid from taking hosts for days).
    experiment_max_grid: int = Field(default=4096, ge=1, le=4096)
    # The experiment queue is looked at this often (and at once when one is submitted or cancelled).
    experiment_interval_s: float = Field(default=5, gt=0, le=60)
    # Live rollouts are stepped this often, and at once when a host reports or a rollout changes.
    rollout_interval_s: float = Field(default=1.0, gt=0, le=60)
    # Several servers on one PostgreSQL database divide the hosts into shards (shards/keeper.py).
    # A server that stops renewing its leases loses them after this long; it renews every third.
    shard_lease_s: float = Field(default=15, ge=1, le=300)
    # How long an accepted token is trusted without reading its row again. A revocation
    # through this server is immediate; other servers sharing the database see it this late.
    token_cache_s: float = Field(default=10, ge=0, le=300)
    # Failed sign-ins (a token or session cookie refused) per client address: this many, then
    # this many a minute; past them the address's calls are 429 unless their credentials were
    # accepted lately (api/signins.py). A typo or two never comes near; a guesser soon does.
    failed_auth_burst: int = Field(default=20, ge=1, le=10_000)
    failed_auth_per_minute: float = Field(default=10, gt=0, le=10_000)
    # A database that hangs must not hang the API: PostgreSQL cancels a statement (a wait on a
    # lock included) after db_statement_timeout_s and gives up connecting after
    # db_connect_timeout_s, and the call is 503; on SQLite a writer waits that long for another.
    # /healthz (readiness) answers 503 when the database does not answer within readiness_timeout_s.
    db_statement_timeout_s: float = Field(default=30, gt=0, le=3600)
    db_connect_timeout_s: float = Field(default=10, ge=1, le=300)
    readiness_timeout_s: float = Field(default=2, gt=0, le=60)
    # How long a dashboard sign-in (a session cookie, api/sessions.py) lasts; never beyond its
    # token's own expiry. Signing in again makes a new session.
    session_ttl_s: float = Field(default=8 * 3600, ge=60, le=30 * 86400)
    # The CA that signs agents' certificates and holds the control plane's client certificate
    # (tls.init_pki); the control plane dials agents with mutual TLS. None: plaintext to agents,
    # which `stortune-server` allows only with --insecure.
    agent_pki: Path | None = None
    # A stripe_cache_size costing more than this share of a host's RAM is refused: by the
    # reconciler's and dry runs' planning, and said by the host analysis' checks.
    stripe_cache_ram_share: float = Field(default=DEFAULT_RAM_SHARE, gt=0, le=1)

    @field_validator("rate_limits")
    @classmethod
    def _rates(cls, v: dict[str, float]) -> dict[str, float]:
        for name, per_minute in v.items():
            if not per_minute > 0:
                raise ValueError(f"rate limit {name!r}: calls per minute must be more than 0")
        return v

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        split_listen(v)
        return v

    @model_validator(mode="after")
    def _heartbeat_fits_lease(self) -> Settings:
        # A lease shorter than two heartbeats expires on a single lost packet.
        if self.heartbeat_interval_s * 2 > self.lease_duration_s:
            raise ValueError(
                f"lease_duration_s ({self.lease_duration_s}) must be at least twice "
                f"heartbeat_interval_s ({self.heartbeat_interval_s})"
            )
        return self

    @property
    def host_port(self) -> tuple[str, int]:
        return split_listen(self.listen)
