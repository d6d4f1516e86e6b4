"""The tables of the control plane (SQLAlchemy typed ORM).

These classes are storage only; the API speaks through the pydantic models in
``stortune.server.models``. Every table change needs a migration in
``migrations/versions`` (a test compares the two).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Double, ForeignKey, Index, String, Text, UniqueConstraint, false
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from stortune.server.db.types import BigId, JSONDoc, UTCDateTime

NAME_LENGTH = 253  # RFC 1123 subdomain, as for Kubernetes object names


class Base(DeclarativeBase):
    type_annotation_map = {
        datetime: UTCDateTime(),
        dict[str, Any]: JSONDoc,
        dict[str, str]: JSONDoc,
        dict[str, int]: JSONDoc,
        list[str]: JSONDoc,
        list[dict[str, Any]]: JSONDoc,
    }


class Counter(Base):
    """Named monotonic counters; ``resourceVersion`` orders every write of every object."""

    __tablename__ = "counters"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger)


RESOURCE_VERSION = "resourceVersion"


class Profile(Base):
    __tablename__ = "profiles"

    name: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    uid: Mapped[str] = mapped_column(String(36), unique=True)
    generation: Mapped[int]
    resource_version: Mapped[int] = mapped_column(BigInteger)
    spec: Mapped[dict[str, Any]]
    labels: Mapped[dict[str, str]]
    annotations: Mapped[dict[str, str]]
    status: Mapped[dict[str, Any]]
    finalizers: Mapped[list[str]]
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    deletion_timestamp: Mapped[datetime | None]

    # The ORM adds "WHERE resource_version = <read value>" to every UPDATE and
    # DELETE, so a write based on a stale read fails instead of winning.
    __mapper_args__ = {"version_id_col": resource_version, "version_id_generator": False}


class Host(Base):
    __tablename__ = "hosts"

    name: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    uid: Mapped[str] = mapped_column(String(36), unique=True)
    # Set through the API; they win over reported_labels for the same key.
    labels: Mapped[dict[str, str]]
    reported_labels: Mapped[dict[str, str]]
    address: Mapped[str] = mapped_column(Text)
    facts: Mapped[dict[str, Any]]
    topology: Mapped[dict[str, Any] | None]
    topology_hash: Mapped[str | None] = mapped_column(Text)
    boot_id: Mapped[str | None] = mapped_column(Text)
    registered_at: Mapped[datetime]
    # Mirrors the Ready condition (the reconciler's verdict), for cheap listing.
    ready: Mapped[bool]
    # Set when the lease ran out; the next heartbeat clears it in its one UPDATE.
    lease_expired: Mapped[bool] = mapped_column(server_default=false())
    resource_version: Mapped[int] = mapped_column(BigInteger)
    # conditions and the per-device settings table
    status: Mapped[dict[str, Any]]
    # profile name -> generation the agent last applied; what profile finalizers wait on
    applied_generations: Mapped[dict[str, int]]
    # SHA-256 of the host key its agent enrolled with (services/host_keys.py); None: not pinned
    # (registered before host keys, or by an admin without one).
    host_key_sha256: Mapped[str | None] = mapped_column(String(64))

    __mapper_args__ = {"version_id_col": resource_version, "version_id_generator": False}
    # What the in-memory fleet index reads after a write: the rows written since it last looked.
    __table_args__ = (Index("ix_hosts_resource_version", "resource_version"),)

    @property
    def effective_labels(self) -> dict[str, str]:
        """What host selectors see: reported labels overlaid by the ones set through the API."""
        return {**self.reported_labels, **self.labels}


class HostLease(Base):
    """An agent's lease, renewed by every heartbeat.

    Its own small row: on SQLite an UPDATE rewrites the whole row, and a host
    row carries the topology and the settings table, so renewing the lease
    there cost a fleet's heartbeats several times more CPU.
    """

    __tablename__ = "host_leases"

    name: Mapped[str] = mapped_column(
        String(NAME_LENGTH), ForeignKey("hosts.name", ondelete="CASCADE"), primary_key=True)
    renew_time: Mapped[datetime]
    expire_time: Mapped[datetime]
    # The digest of the values the agent last reported (stortune.api.agent.observed); None
    # until an agent that reports it calls, and for older agents, which are asked instead.
    observed_digest: Mapped[str | None] = mapped_column(String(64))

    __table_args__ = (Index("ix_host_leases_expire_time", "expire_time"),)


class Event(Base):
    __tablename__ = "events"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    host: Mapped[str | None] = mapped_column(String(NAME_LENGTH))
    profile: Mapped[str | None] = mapped_column(String(NAME_LENGTH))
    type: Mapped[str] = mapped_column(String(16))  # Normal | Warning
    reason: Mapped[str] = mapped_column(String(128))
    message: Mapped[str] = mapped_column(Text)
    involved_kind: Mapped[str] = mapped_column(String(64))
    involved_name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    first_timestamp: Mapped[datetime]
    last_timestamp: Mapped[datetime]
    count: Mapped[int]

    __table_args__ = (
        Index("ix_events_last_timestamp", "last_timestamp"),
        Index("ix_events_host", "host", "last_timestamp"),
        Index("ix_events_profile", "profile", "last_timestamp"),
        Index("ix_events_involved", "involved_kind", "involved_name", "id"),
    )


class HostConditionChange(Base):
    """One transition of one host condition, kept for diagnostics."""

    __tablename__ = "host_conditions_history"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    host: Mapped[str] = mapped_column(
        String(NAME_LENGTH), ForeignKey("hosts.name", ondelete="CASCADE"))
    type: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))  # True | False | Unknown
    reason: Mapped[str] = mapped_column(String(128))
    message: Mapped[str] = mapped_column(Text)
    at: Mapped[datetime]

    __table_args__ = (Index("ix_host_conditions_history_host", "host", "at"),)


class ApiToken(Base):
    """A bearer token of the REST API. The secret itself is never stored: only its SHA-256."""

    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(16), primary_key=True)  # public: listed, audited
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    description: Mapped[str] = mapped_column(Text)
    role: Mapped[str] = mapped_column(String(16))
    # Label selector text (support tokens): the only hosts the token sees.
    host_selector: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]
    created_by: Mapped[str] = mapped_column(Text)
    expires_at: Mapped[datetime | None]
    # Written at most about once a minute per token, not on every request.
    last_used_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]
    revoked_by: Mapped[str | None] = mapped_column(Text)


class UiSession(Base):
    """A dashboard sign-in (api/sessions.py): a cookie standing for the token that made it.

    The cookie's secret is never stored, only its SHA-256 (as for tokens). A row lives until
    its sign-out or expiry; its token's revocation or expiry ends it at once, since every
    look-up reads the token too. A table rather than process memory: every replica on one
    PostgreSQL database accepts the same cookie."""

    __tablename__ = "ui_sessions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # SHA-256 of the cookie secret
    token_id: Mapped[str] = mapped_column(String(16), ForeignKey("api_tokens.id", ondelete="CASCADE"))
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime]

    __table_args__ = (Index("ix_ui_sessions_token", "token_id"),
                      Index("ix_ui_sessions_expires", "expires_at"))


class AuditRecord(Base):
    """One audited call: who (token), what (method, path, outcome), when, from where."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    at: Mapped[datetime]
    token_id: Mapped[str] = mapped_column(String(16))
    token_name: Mapped[str] = mapped_column(String(NAME_LENGTH))
    role: Mapped[str] = mapped_column(String(16))
    method: Mapped[str] = mapped_column(String(16))
    path: Mapped[str] = mapped_column(Text)  # with the query string; secrets redacted
    resource: Mapped[str] = mapped_column(Text)
    code: Mapped[int]
    client: Mapped[str] = mapped_column(String(64))

    __table_args__ = (
        Index("ix_audit_log_at", "at"),
        Index("ix_audit_log_token", "token_id", "at"),
    )


class Redaction(Base):
    """One masked value of diagnostics bundles: the token support sees, and what it stands for.

    One mapping for the whole fleet, so a value (a shared SAN's WWN) is the same
    token in every host's bundle. It never leaves the control plane except to admins.
    """

    __tablename__ = "redactions"

    token: Mapped[str] = mapped_column(String(32), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    value: Mapped[str] = mapped_column(Text)
    #: The host whose bundle first carried it, and when.
    host: Mapped[str] = mapped_column(String(NAME_LENGTH))
    created_at: Mapped[datetime]

    __table_args__ = (Index("ix_redactions_host", "host"),)


class BenchmarkRun(Base):
    """One benchmark run on one host: queued, followed while it runs, then its result.

    The queue is these rows: a server that restarts finds its queued runs and
    re-attaches to the running ones. The normalised result lives here; fio's raw
    files are in ``benchmark_raw`` so that listing runs stays cheap.
    """

    __tablename__ = "benchmark_runs"

    #: Queue order (FIFO per host); the public id is ``id``.
    seq: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    #: Chosen by the control plane and sent to the agent (StartBenchmark is idempotent on it).
    id: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH))  # the spec's metadata.name
    host: Mapped[str] = mapped_column(String(NAME_LENGTH))
    spec: Mapped[dict[str, Any]]  # the BenchmarkSpec document, canonical units
    requested_by: Mapped[str] = mapped_column(Text)
    schedule: Mapped[str | None] = mapped_column(String(NAME_LENGTH))
    state: Mapped[str] = mapped_column(String(16))  # queued | running | done | failed | cancelled
    message: Mapped[str] = mapped_column(Text)
    #: The latest progress the agent reported (percent, rates, step), written at most once a second.
    progress: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    cancel_requested_at: Mapped[datetime | None]
    #: Starts refused (busy, unreachable) so far, and when the next may be tried.
    attempts: Mapped[int]
    not_before: Mapped[datetime | None]
    unreachable_since: Mapped[datetime | None]
    #: The agent still keeps the run's files (ForgetBenchmark not yet acknowledged).
    agent_holds: Mapped[bool]
    #: Profile -> generation in effect on the host (the agent's own record once the run ended).
    profiles: Mapped[dict[str, int]]
    kernel: Mapped[str | None] = mapped_column(Text)
    fio_version: Mapped[str | None] = mapped_column(Text)
    topology_hash: Mapped[str | None] = mapped_column(Text)
    passed: Mapped[bool | None]  # the thresholds' verdict, when the spec has thresholds
    result: Mapped[dict[str, Any] | None]  # the BenchmarkResult document
    #: The tuning experiment this run is a trial of (its id); None for a benchmark asked for itself.
    experiment: Mapped[str | None] = mapped_column(String(64))

    __table_args__ = (
        Index("ix_benchmark_runs_host", "host", "seq"),
        Index("ix_benchmark_runs_state", "state", "seq"),
        Index("ix_benchmark_runs_schedule", "schedule", "seq"),
        Index("ix_benchmark_runs_name", "name", "seq"),
    )


class BenchmarkRawFile(Base):
    """fio's own files of a run (job, JSON output, stderr per step run), as the agent kept them."""

    __tablename__ = "benchmark_raw"

    run_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("benchmark_runs.id", ondelete="CASCADE"), primary_key=True)
    path: Mapped[str] = mapped_column(String(512), primary_key=True)  # relative to the run
    text: Mapped[str] = mapped_column(Text)


class BenchmarkSchedule(Base):
    """A BenchmarkSpec run on every host its selector matches, when a cron expression says."""

    __tablename__ = "benchmark_schedules"

    name: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    cron: Mapped[str] = mapped_column(String(256))
    spec: Mapped[dict[str, Any]]  # the BenchmarkSpec document (with spec.hostSelector)
    suspended: Mapped[bool]
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    created_by: Mapped[str] = mapped_column(Text)
    #: The next fire time (UTC); None while suspended. Missed times fire once, not once each.
    next_due_at: Mapped[datetime | None]
    last_fired_at: Mapped[datetime | None]
    last_message: Mapped[str] = mapped_column(Text)

    __table_args__ = (Index("ix_benchmark_schedules_next_due_at", "next_due_at"),)


class BenchmarkBaseline(Base):
    """A run marked as the reference for a class of hosts: later runs of the same benchmark
    (spec name) on hosts the selector matches are judged against it."""

    __tablename__ = "benchmark_baselines"

    name: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(64), ForeignKey("benchmark_runs.id"))
    host_selector: Mapped[dict[str, Any]]  # a LabelSelector document
    benchmark: Mapped[str] = mapped_column(String(NAME_LENGTH))
    description: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    created_by: Mapped[str] = mapped_column(Text)

    __table_args__ = (Index("ix_benchmark_baselines_benchmark", "benchmark"),)


class AgentIdentity(Base):
    """The key that first obtained a certificate for a host name: it keeps the name.

    Another key asking for the same name (another machine holding the bootstrap
    token) is refused until an admin deletes the host, which drops this row.
    """

    __tablename__ = "agent_identities"

    name: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    #: SHA-256 of the agent's public key (DER SubjectPublicKeyInfo), hex.
    key_sha256: Mapped[str] = mapped_column(String(64))
    first_issued_at: Mapped[datetime]
    last_issued_at: Mapped[datetime]
    expires_at: Mapped[datetime]


class Experiment(Base):
    """A TuningExperiment submitted to the control plane: the queue of experiments is these rows.

    ``document`` is the experiment as validated at submission; ``outcome`` the evidence
    (per host and pooled), rewritten after every recorded trial so a reader sees it grow.
    """

    __tablename__ = "experiments"

    seq: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(NAME_LENGTH))  # metadata.name
    document: Mapped[dict[str, Any]]
    state: Mapped[str] = mapped_column(String(16))  # queued | running | done | cancelled | failed
    #: Why it ended (done, budget-trials, budget-duration, cancelled, or the failure), or what it waits on.
    reason: Mapped[str] = mapped_column(Text)
    created_by: Mapped[str] = mapped_column(Text)
    #: The hosts chosen at submission, in order (their index makes the trials' run ids).
    hosts: Mapped[list[str]]
    seed: Mapped[int]
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    cancel_requested_at: Mapped[datetime | None]
    outcome: Mapped[dict[str, Any] | None]

    __table_args__ = (
        Index("ix_experiments_state", "state", "seq"),
        Index("ix_experiments_name", "name", "seq"),
    )


class ExperimentHost(Base):
    """One host of an experiment: while its state is ``running`` the experiment owns the host's
    settings (the reconciler holds off, benchmarks and other experiments wait)."""

    __tablename__ = "experiment_hosts"

    experiment: Mapped[str] = mapped_column(
        String(64), ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True)
    host: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    #: queued | running | restoring | done | failed | cancelled
    state: Mapped[str] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text)
    #: The target device chosen on this host (kernel name) and those beneath it that are tuned.
    device: Mapped[str | None] = mapped_column(Text)
    #: The parameter values in effect before the first trial (the baseline point).
    baseline: Mapped[dict[str, Any] | None]
    #: What the host held before: {device: {tunable: value}} of every tuned setting, and the
    #: desired profiles (documents) every trial is applied on top of.
    originals: Mapped[dict[str, Any] | None]
    #: The trial being run (its index), None between trials.
    current_trial: Mapped[int | None]
    #: Live progress: trial k of n, the values under test, the metric so far, the leader and its margin.
    progress: Mapped[dict[str, Any]]
    #: This host's evidence so far (the engine's Outcome), rewritten with every recorded trial.
    outcome: Mapped[dict[str, Any] | None]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    updated_at: Mapped[datetime]

    __table_args__ = (Index("ix_experiment_hosts_host", "host", "state"),)


class ExperimentTrial(Base):
    """One trial of one host: the point under test, its benchmark run and what it measured.

    The primary key (experiment, host, index) is what keeps a trial from being recorded twice:
    a restarted control plane that reaches the same index finds the row and re-attaches.
    """

    __tablename__ = "experiment_trials"

    experiment: Mapped[str] = mapped_column(
        String(64), ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True)
    host: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    index: Mapped[int] = mapped_column(primary_key=True)
    point: Mapped[dict[str, Any]]
    purpose: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16))  # queued | running | done | failed
    run_id: Mapped[str] = mapped_column(String(64))
    #: The Measurement (objective and constrained metrics, job CV, ok, message), once recorded.
    measurement: Mapped[dict[str, Any] | None]
    message: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]

    __table_args__ = (UniqueConstraint("run_id", name="uq_experiment_trials_run_id"),)


class Probe(Base):
    """One probe of a host's device: its measured ceilings and scaling curve once done.

    The row is refreshed from the agent (GetProbeResult) while it is not finished; the
    host analysis takes the done probes' ceilings as measured (``services.probes.measured``).
    """

    __tablename__ = "probes"

    seq: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    #: Chosen by the control plane and sent to the agent (StartProbe is idempotent on it).
    id: Mapped[str] = mapped_column(String(64), unique=True)
    host: Mapped[str] = mapped_column(String(NAME_LENGTH))
    device: Mapped[str | None] = mapped_column(String(NAME_LENGTH))  # None: every disk
    requested_by: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16))  # queued | running | done | failed | cancelled
    message: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]
    result: Mapped[dict[str, Any] | None]  # the ProbeResult document

    __table_args__ = (Index("ix_probes_host", "host", "seq"),)


class RateBucket(Base):
    """A token bucket of a rate limit shared by every server on one PostgreSQL database
    (api/sharedlimits.py): one token's calls of one limit, wherever they land."""

    __tablename__ = "rate_buckets"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)  # the limit
    key: Mapped[str] = mapped_column(String(64), primary_key=True)  # the token id
    tokens: Mapped[float] = mapped_column(Double)
    at: Mapped[datetime]


class Replica(Base):
    """A control-plane server sharing this PostgreSQL database (shards/keeper.py): alive while
    its heartbeat is younger than the shard lease."""

    __tablename__ = "replicas"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    started_at: Mapped[datetime]
    heartbeat_at: Mapped[datetime]


class ShardLease(Base):
    """Who works on one shard of the hosts (shards/ownership.py) and until when. ``generation``
    grows at every change of owner: a write fenced with an older one is refused."""

    __tablename__ = "shard_leases"

    shard: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    owner: Mapped[str | None] = mapped_column(String(128))
    generation: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[datetime]


class ProfileGeneration(Base):
    """A profile as it was at one generation, kept while a rollout may pin a host to it.

    ``spec`` None is a tombstone: the profile was deleted at this generation, and a host
    pinned there holds nothing of it. Pruned to what the profile and its rollout still name."""

    __tablename__ = "profile_generations"

    profile: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    generation: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    spec: Mapped[dict[str, Any] | None]
    created_at: Mapped[datetime]


class Rollout(Base):
    """The latest rollout of a profile (issue 27): the pure machine's state, stored as JSON.

    ``phase`` mirrors ``state.phase`` for cheap listing; ``known`` the hosts the rollout has
    seen (an enrolling host is one it has not); ``commands`` people's pending pause / resume /
    undo. ``version`` fences writes as on Profile: a stale step fails instead of winning."""

    __tablename__ = "rollouts"

    profile: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    generation: Mapped[int]
    phase: Mapped[str] = mapped_column(String(16))
    state: Mapped[dict[str, Any]]
    known: Mapped[list[str]]
    commands: Mapped[list[dict[str, Any]]]
    version: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[datetime]

    __mapper_args__ = {"version_id_col": version}
    __table_args__ = (Index("ix_rollouts_phase", "phase"),)


class RolloutPin(Base):
    """The generation of a profile a host must hold while a rollout moves it (0, a tombstone, or
    a generation whose selector leaves the host out: it holds nothing of the profile). No pin:
    the host takes the profile's current generation."""

    __tablename__ = "rollout_pins"

    profile: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    host: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    generation: Mapped[int]

    __table_args__ = (Index("ix_rollout_pins_host", "host"),)


class RolloutAnalysis(Base):
    """A canary's benchmark evidence in a rollout (issue 27, point 2): its before- and after-run
    (``benchmark_runs`` ids, no foreign key: a run may be pruned, the verdict stays) and the
    noise rule's verdict; ``detail`` the spec both run, the device, the figures and the reason."""

    __tablename__ = "rollout_analyses"

    profile: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    generation: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    host: Mapped[str] = mapped_column(String(NAME_LENGTH), primary_key=True)
    before_run: Mapped[str | None] = mapped_column(String(64))
    after_run: Mapped[str | None] = mapped_column(String(64))
    verdict: Mapped[str | None] = mapped_column(String(16))
    detail: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
