"""The control plane's one seam to host agents: ``AgentClient``.

``AgentClients`` hands out real clients over grpc.aio, one cached channel per
agent address; ``FakeAgentClients``/``FakeAgentClient`` stand in for them in
the server's unit tests (nothing else in the server should be faked to avoid
talking to an agent). Errors are one small hierarchy:

    AgentError                 anything an agent call can fail with
    ├── AgentUnreachable       no answer (refused, timed out, reset): retry with backoff
    ├── AgentBusy              the agent is applying something else: retry soon
    ├── AgentRejected          the request is wrong (invalid profile, bad state): terminal
    └── AgentNotFound          no such benchmark run

``AgentError.retryable`` tells the controller which of its two paths to take.
Messages are converted by ``stortune.api.agent.wire``; nothing here touches
protobuf fields.
"""

from __future__ import annotations

import asyncio
import re
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

import grpc
import grpc.aio

from stortune.api.agent import wire
from stortune.api.agent.tls import TLSFiles
from stortune.api.agent.wire import (
    ApplyResult,
    BenchmarkOutcome,
    BenchmarkProgress,
    HostInfo,
    Observation,
    Observed,
    RestoreResult,
    SettingKey,
)
from stortune.schemas import planner, stripecache
from stortune.schemas.analysis.probe import ProbeResult
from stortune.schemas.bench.spec import BenchmarkSpec
from stortune.schemas.plan import Plan
from stortune.schemas.profile import StorageProfile
from stortune.schemas.topology import HOST_TARGET, RecordedOriginal, Topology, TunableState

__all__ = [
    "AgentBusy", "AgentClient", "AgentClientFactory", "AgentClients", "AgentError",
    "AgentNotFound", "AgentRejected", "AgentUnreachable", "ApplyResult", "BenchmarkOutcome",
    "BenchmarkProgress",
    "FakeAgentClient", "FakeAgentClients", "GrpcAgentClient", "HostInfo", "Observation", "Observed",
    "RestoreResult", "SettingKey", "Timeouts",
]


# -- errors ------------------------------------------------------------------------
class AgentError(Exception):
    """An agent call failed. ``code`` is the gRPC status name when there was one."""

    retryable: ClassVar[bool] = False

    def __init__(self, address: str, message: str, code: str | None = None) -> None:
        self.address = address
        self.message = message
        self.code = code
        super().__init__(f"agent {address}: {message}")


class AgentUnreachable(AgentError):
    """No answer from the agent; ``reason`` is short ("connection refused", "deadline exceeded")."""

    retryable = True

    def __init__(self, address: str, reason: str, code: str | None = None) -> None:
        self.reason = reason
        super().__init__(address, f"unreachable: {reason}", code)


class AgentBusy(AgentError):
    retryable = True


class AgentRejected(AgentError):
    """The agent refused the request as given; retrying the same request will not help."""


class AgentNotFound(AgentError):
    pass


# -- the seam ------------------------------------------------------------------------
class AgentClient(Protocol):
    """What the control plane asks of one host agent."""

    address: str

    async def get_topology(self) -> tuple[HostInfo, Topology, str]:
        """(host, topology with current values, topology structure hash)."""
        ...

    async def get_observed(self) -> Observation:
        """The host, its current values ({device: {tunable: state}}, decoded on first use) with
        their digest, and the topology structure hash."""
        ...

    async def plan(self, profiles: Sequence[StorageProfile]) -> Plan:
        ...

    async def apply(self, profiles: Sequence[StorageProfile], generations: Mapping[str, int],
                    request_id: str, *, ram_share: float | None = None) -> ApplyResult:
        """Converge the host to exactly ``profiles`` (empty: restore everything stortune set).

        ``ram_share``: the control plane's stripe-cache share of RAM; the agent holds to the
        smaller of it and its own (None: its own alone)."""
        ...

    async def restore(self, only: Collection[SettingKey] | None = None) -> RestoreResult:
        ...

    def watch_benchmark(self, run_id: str) -> AsyncIterator[BenchmarkProgress]:
        """Progress updates until the run ends (async generator)."""
        ...

    async def start_benchmark(self, run_id: str, spec: BenchmarkSpec) -> BenchmarkProgress:
        """Start a run under the control plane's id; starting the same id again is a no-op.
        AgentBusy while another benchmark runs there; AgentRejected for a target it refuses."""
        ...

    async def cancel_benchmark(self, run_id: str) -> tuple[bool, BenchmarkProgress]:
        """(whether it was still running, its progress now)."""
        ...

    async def get_benchmark_result(self, run_id: str) -> BenchmarkOutcome:
        ...

    async def forget_benchmark(self, run_id: str) -> bool:
        ...

    async def start_probe(self, probe_id: str, device: str | None) -> BenchmarkProgress:
        """Start (or find, when repeated) a probe; its progress streams through watch_benchmark."""
        ...

    async def get_probe_result(self, probe_id: str) -> tuple[BenchmarkProgress, ProbeResult | None]:
        ...

    async def collect_diagnostics(self, command_timeout_s: float = 0.0) -> bytes:
        """The host's unredacted diagnostics bundle (tar.gz)."""
        ...


class AgentClientFactory(Protocol):
    def for_address(self, address: str, host: str | None = None) -> AgentClient:
        """A client for the agent at ``address``; with mTLS its certificate must name ``host``."""
        ...

    async def forget_host(self, host: str) -> None:
        """Close what is open to ``host``'s agent: the host was deleted, nothing dials it again."""
        ...


# -- over gRPC -----------------------------------------------------------------------
@dataclass(frozen=True)
class Timeouts:
    """Per-call deadlines in seconds; ``watch`` None streams until the run ends."""

    read: float = 10.0  # GetTopology, GetObserved, Plan, benchmark calls
    apply: float = 120.0  # Apply, Restore: a slow device can take a while to verify
    watch: float | None = None
    diagnostics: float = 600.0  # every tool has its own timeout on the agent; many disks add up


#: A bundle larger than this is refused rather than held in memory.
MAX_DIAGNOSTICS_BYTES = 512 << 20


_REJECTED = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
             grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.PERMISSION_DENIED,
             grpc.StatusCode.UNAUTHENTICATED}
_BUSY = {grpc.StatusCode.ABORTED, grpc.StatusCode.RESOURCE_EXHAUSTED}

# gRPC puts the OS error somewhere in a long "failed to connect to all addresses" text.
_REASONS = (
    (re.compile(r"hostname verification", re.I),
     "TLS: the agent's certificate names another host than the one registered"),
    (re.compile(r"certificate_verify_failed|certificate verify failed|unsupported certificate purpose",
                re.I), "TLS handshake failed: certificate not accepted"),
    (re.compile(r"connection refused", re.I), "connection refused"),
    (re.compile(r"dns resolution failed|name resolution|could not resolve", re.I),
     "name resolution failed"),
    (re.compile(r"connection reset", re.I), "connection reset"),
    (re.compile(r"no route to host", re.I), "no route to host"),
    (re.compile(r"network is unreachable", re.I), "network unreachable"),
    (re.compile(r"timed? ?out|timeout", re.I), "connect timeout"),
    (re.compile(r"socket closed|connection closed|goaway|broken pipe|end of tcp stream", re.I),
     "connection closed"),
    (re.compile(r"ssl|tls|handshake|certificate", re.I), "TLS handshake failed"),
)


def unavailable_reason(details: str) -> str:
    for pattern, reason in _REASONS:
        if pattern.search(details):
            return reason
    return details.strip().splitlines()[0] if details.strip() else "unavailable"


def error_from_rpc(address: str, method: str, exc: grpc.aio.AioRpcError) -> AgentError:
    code = exc.code()
    details = exc.details() or ""
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return AgentUnreachable(address, "deadline exceeded", code.name)
    if code == grpc.StatusCode.UNAVAILABLE:
        return AgentUnreachable(address, unavailable_reason(details), code.name)
    if code in _REJECTED:
        return AgentRejected(address, details or code.name, code.name)
    if code in _BUSY:
        return AgentBusy(address, details or code.name, code.name)
    if code == grpc.StatusCode.NOT_FOUND:
        return AgentNotFound(address, details or code.name, code.name)
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return AgentRejected(address, f"{method} is not implemented by this agent (older version?)",
                             code.name)
    return AgentError(address, f"{method}: {code.name}: {details}", code.name)


_T = TypeVar("_T")

# Big hosts (SANs with thousands of paths) produce topology documents of several MB.
DEFAULT_CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 16 << 20),
    # Notices a silently dead agent during a long WatchBenchmark stream.
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    # After a connection failure a channel fails calls at once with the last error until its
    # reconnect backoff ends (by default growing to 120 s): an agent restarted after a few
    # seconds would look "connection refused" for minutes. Agents restart; look again within seconds.
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", 5_000),
)


class GrpcAgentClient:
    """AgentClient over the channel ``AgentClients`` keeps for its address.

    Cheap to make and to keep: the channel is looked up at each call, on the
    running event loop.
    """

    def __init__(self, address: str, clients: AgentClients, timeouts: Timeouts,
                 host: str | None = None) -> None:
        self.address = address
        self.host = host
        self._clients = clients
        self._timeouts = timeouts

    async def _call(self, method: str, request: Any, timeout: float,
                    decode: Callable[[Any], _T]) -> _T:
        try:
            stub = self._clients.stub(self.address, self.host)
            response = await getattr(stub, method)(request, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise self._failed(method, exc) from None
        try:
            return decode(response)
        except wire.WireError as exc:
            raise AgentError(self.address, f"{method}: invalid response: {exc}") from None

    def _failed(self, method: str, exc: grpc.aio.AioRpcError) -> AgentError:
        return error_from_rpc(self.address, method, exc)

    async def get_topology(self) -> tuple[HostInfo, Topology, str]:
        return await self._call("GetTopology", wire.topology_request(), self._timeouts.read,
                                wire.topology_from)

    async def get_observed(self) -> Observation:
        return await self._call("GetObserved", wire.observed_request(), self._timeouts.read,
                                wire.observation_from)

    async def plan(self, profiles: Sequence[StorageProfile]) -> Plan:
        return await self._call("Plan", wire.plan_request(profiles), self._timeouts.read,
                                lambda response: wire.plan_from(response)[1])

    async def apply(self, profiles: Sequence[StorageProfile], generations: Mapping[str, int],
                    request_id: str, *, ram_share: float | None = None) -> ApplyResult:
        return await self._call("Apply", wire.apply_request(profiles, generations, request_id,
                                                            ram_share=ram_share),
                                self._timeouts.apply, wire.apply_from)

    async def restore(self, only: Collection[SettingKey] | None = None) -> RestoreResult:
        return await self._call("Restore", wire.restore_request(only), self._timeouts.apply,
                                wire.restore_from)

    async def watch_benchmark(self, run_id: str) -> AsyncIterator[BenchmarkProgress]:
        stub = self._clients.stub(self.address, self.host)
        call = stub.WatchBenchmark(wire.watch_request(run_id), timeout=self._timeouts.watch)
        try:
            async for message in call:
                yield wire.progress_from(message)
        except grpc.aio.AioRpcError as exc:
            raise self._failed("WatchBenchmark", exc) from None
        finally:
            call.cancel()  # the consumer stopped early: tell the agent

    async def start_benchmark(self, run_id: str, spec: BenchmarkSpec) -> BenchmarkProgress:
        return await self._call("StartBenchmark", wire.start_request(run_id, spec), self._timeouts.read,
                                lambda response: wire.start_from(response)[1])

    async def cancel_benchmark(self, run_id: str) -> tuple[bool, BenchmarkProgress]:
        return await self._call("CancelBenchmark", wire.cancel_request(run_id), self._timeouts.apply,
                                wire.cancel_from)

    async def get_benchmark_result(self, run_id: str) -> BenchmarkOutcome:
        return await self._call("GetBenchmarkResult", wire.result_request(run_id), self._timeouts.read,
                                wire.result_from)

    async def forget_benchmark(self, run_id: str) -> bool:
        return await self._call("ForgetBenchmark", wire.forget_request(run_id), self._timeouts.read,
                                wire.forget_from)

    async def start_probe(self, probe_id: str, device: str | None) -> BenchmarkProgress:
        return await self._call("StartProbe", wire.probe_request(probe_id, device), self._timeouts.apply,
                                lambda response: wire.probe_from(response)[1])

    async def get_probe_result(self, probe_id: str) -> tuple[BenchmarkProgress, ProbeResult | None]:
        return await self._call("GetProbeResult", wire.probe_result_request(probe_id),
                                self._timeouts.read, wire.probe_result_from)

    async def collect_diagnostics(self, command_timeout_s: float = 0.0) -> bytes:
        stub = self._clients.stub(self.address, self.host)
        call = stub.CollectDiagnostics(wire.diagnostics_request(command_timeout_s),
                                       timeout=self._timeouts.diagnostics)
        parts: list[bytes] = []
        size = 0
        try:
            async for message in call:
                chunk = wire.diagnostics_data(message)
                size += len(chunk)
                if size > MAX_DIAGNOSTICS_BYTES:
                    raise AgentError(self.address, f"diagnostics bundle larger than "
                                                   f"{MAX_DIAGNOSTICS_BYTES >> 20} MiB; refused")
                parts.append(chunk)
        except grpc.aio.AioRpcError as exc:
            raise self._failed("CollectDiagnostics", exc) from None
        finally:
            call.cancel()
        return b"".join(parts)


@dataclass
class _Cached:
    channel: grpc.aio.Channel
    loop: asyncio.AbstractEventLoop
    stub: Any


#: Open channels to agents kept at most (AgentClients), and how long calls in flight on one
#: being closed may go on.
MAX_CHANNELS = 4096
CLOSE_GRACE_S = 60.0


class AgentClients:
    """Clients by agent address, sharing one channel per address.

    A grpc.aio channel belongs to the event loop it was created on; a call
    from another loop (a test's fresh loop, a worker) gets a fresh channel.

    With ``tls`` (the control plane's key, certificate and the agents' CA) every
    channel is mutual TLS and the agent's certificate must name the host it
    registered as (``host``): an agent cannot answer for another host, and one
    presenting a certificate from another CA is refused at the handshake.
    Without it, plaintext (``stortune-server --insecure``).

    At most ``max_channels`` stay open, the least recently used closed first (with a grace for
    calls in flight): agents that report their own changes are called rarely, and a channel
    per host of a 10,000-host fleet, beside each host's watch, would use up the open files.
    """

    def __init__(self, *, tls: TLSFiles | None = None,
                 timeouts: Timeouts | None = None,
                 options: Sequence[tuple[str, Any]] = DEFAULT_CHANNEL_OPTIONS,
                 max_channels: int = MAX_CHANNELS) -> None:
        self._tls = tls
        self._credentials: grpc.ChannelCredentials | None = None
        self._timeouts = timeouts or Timeouts()
        self._options = list(options)
        self._max = max_channels
        self._channels: OrderedDict[tuple[str, str | None], _Cached] = OrderedDict()
        self._closing: set[asyncio.Task[None]] = set()

    def for_address(self, address: str, host: str | None = None) -> GrpcAgentClient:
        return GrpcAgentClient(address, self, self._timeouts, host)

    def _secure(self) -> grpc.ChannelCredentials:
        if self._credentials is None:
            assert self._tls is not None
            key, cert, ca = self._tls.read()
            self._credentials = grpc.ssl_channel_credentials(
                root_certificates=ca, private_key=key, certificate_chain=cert)
        return self._credentials

    def stub(self, address: str, host: str | None = None) -> Any:
        """The generated stub on this address's channel for the running loop (made on first use)."""
        loop = asyncio.get_running_loop()
        key = (address, host)
        cached = self._channels.get(key)
        if cached is not None and cached.loop is loop:
            self._channels.move_to_end(key)
            return cached.stub
        if self._tls is None:
            channel = grpc.aio.insecure_channel(address, options=self._options)
        else:
            # The certificate is checked against the registered name, not the address.
            options = [*self._options, *([("grpc.ssl_target_name_override", host)] if host else [])]
            channel = grpc.aio.secure_channel(address, self._secure(), options=options)
        self._channels[key] = _Cached(channel, loop, wire.agent_stub(channel))
        self._channels.move_to_end(key)
        while len(self._channels) > self._max:
            _, old = self._channels.popitem(last=False)
            if old.loop is loop:
                task = loop.create_task(_close(old, grace=CLOSE_GRACE_S))
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
        return self._channels[key].stub

    async def forget(self, address: str) -> None:
        """Close and drop the channels of an agent that went away (deregistered host)."""
        for key in [k for k in self._channels if k[0] == address]:
            await _close(self._channels.pop(key))

    async def forget_host(self, host: str) -> None:
        """Close and drop the channels to a deleted host's agent, whatever its address: a channel
        re-dials a failed agent on its own, with nothing calling it, until it is closed."""
        for key in [k for k in self._channels if k[1] == host]:
            await _close(self._channels.pop(key))

    def open_channels(self) -> int:
        return len(self._channels)

    async def close(self) -> None:
        cached, self._channels = list(self._channels.values()), OrderedDict()
        for c in cached:
            await _close(c)
        for task in list(self._closing):
            task.cancel()


async def _close(cached: _Cached, grace: float | None = None) -> None:
    # A channel of another (finished) loop cannot be closed from this one;
    # its loop took its transports with it.
    if cached.loop is asyncio.get_running_loop():
        await cached.channel.close(grace)


# -- the fake ------------------------------------------------------------------------
@dataclass
class FakeAgentClient:
    """An in-memory agent for the server's unit tests: behaves like the real one.

    Plans with the real planner against ``topology``; apply sets the planned
    values in ``topology`` (so observed/plan reflect it afterwards), records
    originals (also on the tunable states, as the agent reports them) and
    restores what the planner says no profile wants any more, as the agent does.
    ``fail(method, error)`` makes a method raise (``"*"`` for every method);
    ``calls`` records (method, arguments) in order.
    """

    address: str = "fake-agent:50051"
    topology: Topology = field(default_factory=lambda: Topology(hostname="fake", kernel="6.1.0"))
    info: HostInfo = field(default_factory=lambda: HostInfo(
        hostname="fake", kernel="6.1.0", boot_id="00000000-0000-4000-8000-000000000000",
        agent_version="fake", agent_started_unix=0))
    benchmarks: dict[str, list[BenchmarkProgress]] = field(default_factory=dict)
    #: Runs started through start_benchmark: run id -> spec.
    started: dict[str, BenchmarkSpec] = field(default_factory=dict)
    #: What get_benchmark_result answers once a run is finished (set by the test).
    outcomes: dict[str, BenchmarkOutcome] = field(default_factory=dict)
    #: The bundle collect_diagnostics returns (a packed Bundle); when the test sets none,
    #: a bundle holding just the topology, as the smallest a real agent sends.
    diagnostics: bytes = b""
    #: Probes started through start_probe: probe id -> device; what get_probe_result answers
    #: for a probe the test has concluded (``probe_results``).
    probes: dict[str, str | None] = field(default_factory=dict)
    probe_results: dict[str, ProbeResult] = field(default_factory=dict)
    calls: list[tuple[str, Any]] = field(default_factory=list)
    #: The agent's own stripe-cache share (--stripe-cache-ram-share), and the one each apply sent.
    ram_share: float = stripecache.DEFAULT_RAM_SHARE
    ram_shares: list[float | None] = field(default_factory=list)
    #: (device_id, tunable) -> (device name, value before stortune first wrote it)
    originals: dict[SettingKey, tuple[str, int | str | None]] = field(default_factory=dict)
    _failures: dict[str, tuple[AgentError, int | None]] = field(default_factory=dict)

    def fail(self, method: str, error: AgentError | None, *, times: int | None = None) -> None:
        """Raise ``error`` from ``method`` (``"*"``: all) ``times`` times (None: until cleared)."""
        if error is None:
            self._failures.pop(method, None)
        else:
            self._failures[method] = (error, times)

    def unreachable(self, reason: str = "connection refused") -> None:
        self.fail("*", AgentUnreachable(self.address, reason, "UNAVAILABLE"))

    def _enter(self, method: str, args: Any = None) -> None:
        self.calls.append((method, args))
        for key in (method, "*"):
            if key in self._failures:
                error, times = self._failures[key]
                if times is not None:
                    if times <= 1:
                        del self._failures[key]
                    else:
                        self._failures[key] = (error, times - 1)
                raise error

    def _hash(self) -> str:
        return self.topology.structure_hash()

    async def get_topology(self) -> tuple[HostInfo, Topology, str]:
        self._enter("get_topology")
        return self.info, self.topology.model_copy(deep=True), self._hash()

    async def get_observed(self) -> Observation:
        self._enter("get_observed")
        return Observation.of(self.info, planner.observed_of(self.topology), self._hash())

    async def plan(self, profiles: Sequence[StorageProfile]) -> Plan:
        self._enter("plan", list(profiles))
        return planner.plan(profiles, self.topology)

    def _states(self, device: str) -> dict[str, TunableState] | None:
        if device == HOST_TARGET:
            return self.topology.host_tunables
        dev = self.topology.device(device)
        return dev.tunables if dev is not None else None

    def _set(self, device: str, tunable: str, value: int | str | None) -> int | str | None:
        states = self._states(device)
        state = states.get(tunable) if states is not None else None
        if state is None:
            return None
        before = state.value
        state.value, state.raw = value, None if value is None else str(value)
        return before

    def _show(self, device: str, device_id: str, tunable: str) -> None:
        """The tunable's state shows what the journal keeps for it, as the agent reports it."""
        states = self._states(device)
        state = states.get(tunable) if states is not None else None
        recorded = self.originals.get((device_id, tunable))
        if state is not None:
            state.original = None if recorded is None or recorded[1] is None else RecordedOriginal(
                value=recorded[1])

    def remember(self, device: str, device_id: str, tunable: str, original: int | str | None) -> None:
        """What the journal keeps after stortune's first write (tests set up an earlier apply so)."""
        self.originals.setdefault((device_id, tunable), (device, original))
        self._show(device, device_id, tunable)

    def _forget(self, device: str, device_id: str, tunable: str) -> None:
        self.originals.pop((device_id, tunable), None)
        self._show(device, device_id, tunable)

    async def apply(self, profiles: Sequence[StorageProfile], generations: Mapping[str, int],
                    request_id: str, *, ram_share: float | None = None) -> ApplyResult:
        self._enter("apply", (list(profiles), dict(generations), request_id))
        self.ram_shares.append(ram_share)
        # As the agent does: the smaller of its own share and the control plane's.
        share = stripecache.tightest(self.ram_share, ram_share)
        plan = planner.plan(profiles, self.topology, stripe_cache_ram_share=share)
        rows: list[dict[str, Any]] = []
        for back in planner.releases(plan, self.topology):
            before = self._set(back.device, back.tunable, back.desired)
            if back.to == "original":
                self._forget(back.device, back.device_id, back.tunable)
            if before != back.desired:
                rows.append({"device": back.device, "tunable": back.tunable, "before": before,
                             "after": back.desired, "status": "restored", "message": ""})
        plan = planner.plan(profiles, self.topology, stripe_cache_ram_share=share)
        for change in plan.enforced().changes:
            self.remember(change.device, change.device_id, change.tunable, change.current)
            self._set(change.device, change.tunable, change.desired)
            rows.append({"device": change.device, "tunable": change.tunable, "before": change.current,
                         "after": change.desired, "status": "applied", "message": ""})
        # As the agent does: the plan's errors are reported, everything else is applied.
        rows += [{"device": r.device, "tunable": r.tunable, "before": None, "after": r.value,
                  "status": "rejected", "message": r.reason, "profile": r.source.profile}
                 for r in plan.fatal]
        report = {"title": f"apply: {len(rows)} setting(s) changed", "ok": True, "rows": rows,
                  "messages": [r.reason for r in plan.fatal]}
        after = planner.plan(profiles, self.topology, stripe_cache_ram_share=share)
        return ApplyResult(True, report, after, dict(generations), self.info, request_id, self._hash())

    async def restore(self, only: Collection[SettingKey] | None = None) -> RestoreResult:
        self._enter("restore", None if only is None else set(only))
        rows: list[dict[str, Any]] = []
        for key in sorted(self.originals if only is None else set(only) & set(self.originals)):
            device, value = self.originals[key]
            self._forget(device, key[0], key[1])
            before = self._set(device, key[1], value)
            rows.append({"device": device, "tunable": key[1], "before": before, "after": value,
                         "status": "restored", "message": ""})
        report = {"title": f"restore: {len(rows)} setting(s)", "ok": True, "rows": rows,
                  "messages": []}
        return RestoreResult(True, report, self.info)

    async def watch_benchmark(self, run_id: str) -> AsyncIterator[BenchmarkProgress]:
        self._enter("watch_benchmark", run_id)
        if run_id not in self.benchmarks:
            raise AgentNotFound(self.address, f"no benchmark run {run_id!r} on this agent", "NOT_FOUND")
        for progress in self.benchmarks[run_id]:
            yield progress
            if progress.finished:
                return

    def _latest(self, run_id: str) -> BenchmarkProgress:
        if run_id in self.outcomes:
            return self.outcomes[run_id].progress
        if run_id not in self.benchmarks:
            raise AgentNotFound(self.address, f"no benchmark run {run_id!r} on this agent", "NOT_FOUND")
        return self.benchmarks[run_id][-1]

    async def start_benchmark(self, run_id: str, spec: BenchmarkSpec) -> BenchmarkProgress:
        self._enter("start_benchmark", (run_id, spec))
        if run_id in self.started:
            return self._latest(run_id)
        for other in self.started:
            if other != run_id and not self._latest(other).finished:
                raise AgentBusy(self.address, f"busy: benchmark {other} running", "ABORTED")
        self.started[run_id] = spec
        self.benchmarks.setdefault(run_id, [BenchmarkProgress(run_id=run_id, state="queued")])
        return self._latest(run_id)

    async def cancel_benchmark(self, run_id: str) -> tuple[bool, BenchmarkProgress]:
        self._enter("cancel_benchmark", run_id)
        latest = self._latest(run_id)
        if latest.finished:
            return False, latest
        cancelled = BenchmarkProgress(run_id=run_id, state="cancelled", percent=latest.percent,
                                      message="cancelled")
        self.benchmarks[run_id].append(cancelled)
        return True, cancelled

    async def get_benchmark_result(self, run_id: str) -> BenchmarkOutcome:
        self._enter("get_benchmark_result", run_id)
        if run_id in self.outcomes:
            return self.outcomes[run_id]
        return BenchmarkOutcome(progress=self._latest(run_id), result=None, raw_files={}, info=self.info)

    async def forget_benchmark(self, run_id: str) -> bool:
        self._enter("forget_benchmark", run_id)
        known = run_id in self.started or run_id in self.outcomes or run_id in self.benchmarks
        for table in (self.started, self.outcomes, self.benchmarks):
            table.pop(run_id, None)
        return known

    async def start_probe(self, probe_id: str, device: str | None) -> BenchmarkProgress:
        self._enter("start_probe", (probe_id, device))
        if probe_id not in self.probes:
            for other in [*self.started, *self.probes]:
                if not self._latest(other).finished:
                    raise AgentBusy(self.address, f"busy: benchmark {other} running", "ABORTED")
            self.probes[probe_id] = device
            self.benchmarks.setdefault(probe_id, [BenchmarkProgress(run_id=probe_id, state="queued")])
        return self._latest(probe_id)

    async def get_probe_result(self, probe_id: str) -> tuple[BenchmarkProgress, ProbeResult | None]:
        self._enter("get_probe_result", probe_id)
        if probe_id not in self.probes:
            raise AgentNotFound(self.address, f"no benchmark run {probe_id!r} on this agent", "NOT_FOUND")
        result = self.probe_results.get(probe_id)
        if result is not None:
            return BenchmarkProgress(run_id=probe_id, state=result.state, percent=100.0,
                                     message=result.message), result
        return self._latest(probe_id), None

    async def collect_diagnostics(self, command_timeout_s: float = 0.0) -> bytes:
        self._enter("collect_diagnostics", command_timeout_s)
        if self.diagnostics:
            return self.diagnostics
        from datetime import UTC, datetime

        from stortune.schemas.bundle import Bundle, BundleInfo, pack

        bundle = Bundle(info=BundleInfo(collector="fake agent", created=datetime.now(UTC),
                                        host=self.topology.hostname))
        bundle.put("topology.json", self.topology.model_dump_json(indent=2))
        return pack(bundle)


@dataclass
class FakeAgentClients:
    """AgentClientFactory of fakes: one FakeAgentClient per address, made on first use."""

    agents: dict[str, FakeAgentClient] = field(default_factory=dict)
    #: Hosts whose clients were forgotten (deleted), in order.
    forgotten: list[str] = field(default_factory=list)

    def for_address(self, address: str, host: str | None = None) -> FakeAgentClient:
        if address not in self.agents:
            self.agents[address] = FakeAgentClient(address=address)
        return self.agents[address]

    def add(self, agent: FakeAgentClient) -> FakeAgentClient:
        self.agents[agent.address] = agent
        return agent

    async def forget_host(self, host: str) -> None:
        self.forgotten.append(host)

    async def close(self) -> None:
        pass

