"""``stortune-agent serve --listen ADDR [--server URL]``: the managed agent.

Runs three things until SIGTERM/SIGINT:

* the gRPC AgentService on ADDR (``rpc.AgentService``);
* with ``--server``, the registration loop: register, heartbeat, topology
  updates (``registration.Registrar``);
* the hot-plug loop of ``daemon``: re-apply the stored desired state when the
  device graph changes, so a new disk or a reboot does not lose settings even
  while the control plane is down.

Apply/restore from the API and the hot-plug re-apply share one lock. This
module imports grpc; the CLI imports it only for this command, which keeps the
other commands (and the standalone daemon) light.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import grpc

from stortune.agent import corrections, daemon, heap, hostkey, identity, local, mtls, trials
from stortune.agent.journal import HostBusyError, StateError
from stortune.agent.kernelfs import KernelFS
from stortune.agent.protection import HostProtection
from stortune.agent.registration import Registrar, RegistrationConfig, default_name, host_facts
from stortune.agent.rpc import AgentService, BenchmarkRegistry, agent_version
from stortune.api.agent import CONTROL_PLANE_NAME, wire
from stortune.api.agent import observed as observed_values
from stortune.api.agent.tlsfiles import TLSError, TLSFiles
from stortune.schemas import stripecache
from stortune.schemas.endpoint import check_endpoint
from stortune.schemas.topology import Topology

log = logging.getLogger("stortune.agent.serve")

# Recognised in --listen to pick an address to advertise; nothing binds to them here.
_WILDCARD_HOSTS = {"", "0.0.0.0", "[::]", "::", "*"}  # noqa: S104

SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_receive_message_length", 16 << 20),
    ("grpc.max_send_message_length", 64 << 20),
    # gRPC's default SO_REUSEPORT would let a second agent bind the same port silently.
    ("grpc.so_reuseport", 0),
    # Accept the control plane's keepalive pings during long WatchBenchmark streams.
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 30_000),
)


#: How often an agent with its own certificate checks whether renewal is due.
CERTIFICATE_CHECK_S = 3600.0


class ServeError(local.AgentError):
    """The agent cannot start (address in use, bad address)."""


@dataclass(frozen=True)
class ServeOptions:
    listen: str
    server: str | None = None
    name: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    heartbeat: float | None = None
    advertise: str | None = None
    rescan_interval: float = 30.0
    #: How often the agent reads its values to report a change (drift) to the control plane.
    observe_interval: float = 10.0
    grace: float = 5.0
    backoff_base: float = 1.0
    backoff_cap: float = 30.0
    workers: int = 10
    #: Bearer token for the control plane's REST API (role agent); never logged.
    token: str | None = field(default=None, repr=False)
    #: Where diagnostics find their tools (None: PATH and the sbin directories).
    tool_path: str | None = None
    #: Directories where benchmark file targets may be created, besides STATE_DIR/bench-files.
    bench_dirs: tuple[Path, ...] = ()
    #: Plaintext gRPC, anyone on the network may call: local development only.
    insecure: bool = False
    #: The agent's key, certificate and the CA it trusts, from files (the site's PKI);
    #: None: its own under STATE_DIR/tls, obtained from --server.
    tls_files: TLSFiles | None = None
    #: The name the caller's certificate must carry.
    control_plane_name: str = CONTROL_PLANE_NAME
    #: A stripe_cache_size costing more of the host's RAM is refused.
    stripe_cache_ram_share: float = stripecache.DEFAULT_RAM_SHARE
    #: The devices no experiment, benchmark or probe may use (--protect-*, --allow-loop).
    protection: HostProtection = field(default_factory=HostProtection)


def _with_port(address: str, port: int) -> str:
    host, sep, _ = address.rpartition(":")
    if not sep:
        raise ServeError(f"address {address!r} must be HOST:PORT")
    return f"{host}:{port}"


def advertised_address(bound: str, advertise: str | None) -> str:
    """What the control plane should dial: --advertise, else the bound address with a
    wildcard host replaced by this host's name. Never one the control plane would refuse
    (schemas/endpoint.py): the agent would start, then fail every registration."""
    port = int(bound.rpartition(":")[2])
    if advertise:
        address = _with_port(advertise, port) if advertise.endswith(":0") else advertise
    else:
        host = bound.rpartition(":")[0]
        address = f"{socket.getfqdn() if host in _WILDCARD_HOSTS else host}:{port}"
    try:
        return check_endpoint(address)
    except ValueError as exc:
        raise ServeError(f"cannot advertise this address: {exc}; give --advertise HOST:PORT") from None


class Agent:
    """The running pieces of a managed agent; ``start()`` then ``stop()``."""

    def __init__(self, fs: KernelFS, state_dir: Path, options: ServeOptions, *,
                 benchmarks: BenchmarkRegistry | None = None) -> None:
        self.fs = fs
        self.state_dir = state_dir
        self.options = options
        self.benchmarks = benchmarks or BenchmarkRegistry()
        self.apply_lock = threading.Lock()
        self.service = AgentService(fs, state_dir, apply_lock=self.apply_lock,
                                    benchmarks=self.benchmarks, tool_path=options.tool_path,
                                    bench_dirs=options.bench_dirs,
                                    ram_share=options.stripe_cache_ram_share,
                                    protection=options.protection)
        self.registrar: Registrar | None = None
        self.address = ""  # bound HOST:PORT, known after start()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._server: grpc.Server | None = None
        self._hash = ""
        #: The files serving mutual TLS; None when --insecure (known after start()).
        self.tls: TLSFiles | None = None
        #: Converge at the next rescan even if the device graph did not change
        #: (a benchmark postponed the last attempt).
        self._retry = False
        #: This host's key for the control plane (``hostkey``), read at start with --server.
        self._host_key: str | None = None
        #: The digest of the values last read (``observed_values``): reported when it changes.
        self._digest: str | None = None
        #: The protected devices last seen (``HostProtection.resolve``): reported when they change.
        self._protected: dict[str, str] = {}

    def start(self) -> str:
        """Converge, listen, register, watch devices; -> the bound address."""
        self._converge_at_start()
        topology = local.discover(self.fs)
        self._hash = topology.structure_hash()
        self._protection_changed(topology)
        if self.options.server:
            self._observe()
            try:
                self._host_key = hostkey.load_or_create(self.state_dir)
            except (hostkey.HostKeyError, OSError) as exc:
                raise ServeError(f"cannot use this host's key: {exc}") from None
        self.tls = self._identity()
        self._server = self._listen()
        if self.options.server:
            self.registrar = self._registrar(self.options.server)
            self._spawn("stortune-registration", self.registrar.run)
            if self.tls is not None and self.options.tls_files is None:
                self._spawn("stortune-certificate", self._renew_certificate)
        self._spawn("stortune-devices", self._watch_devices)
        return self.address

    # -- identity ---------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.options.name or default_name(self.fs)

    def _enrollment(self) -> identity.Enrollment:
        assert self.options.server is not None
        return identity.Enrollment(server=self.options.server, name=self.name, token=self.options.token,
                                   host_key=self._host_key,
                                   version=agent_version(), backoff_base=self.options.backoff_base,
                                   backoff_cap=self.options.backoff_cap)

    def _identity(self) -> TLSFiles | None:
        """The files to serve mutual TLS with (None: --insecure), obtaining them if need be."""
        if self.options.insecure:
            log.warning("--insecure: the agent API is plaintext and open to anyone who can reach %s",
                        self.options.listen)
            return None
        given = self.options.tls_files
        if given is not None:
            try:
                identity.check_pair(given)
            except TLSError as exc:
                raise ServeError(str(exc)) from None
            return given
        own = identity.own_files(self.state_dir)
        if self.options.server:
            try:
                identity.enroll(own, self._enrollment(), self._stop)
            except identity.EnrollmentError as exc:
                raise ServeError(str(exc)) from None
            return own
        why = identity.usable(own, self.name)
        if why is not None:
            raise ServeError(f"no usable certificate in {own.cert.parent} ({why}): give --tls-cert, "
                             "--tls-key and --tls-ca, or --server to obtain one, or --insecure "
                             "(plaintext, local development only)")
        return own

    def _renew_certificate(self) -> None:
        """Ask for a new certificate a month before this one expires; served from the next handshake."""
        while not self._stop.wait(CERTIFICATE_CHECK_S):
            try:
                identity.enroll(identity.own_files(self.state_dir), self._enrollment(), self._stop)
            except identity.EnrollmentError as exc:
                if not self._stop.is_set():
                    log.error("certificate renewal failed: %s", exc)

    def _converge_at_start(self) -> None:
        with self.apply_lock:
            try:
                recovered = trials.recover(self.fs, self.state_dir,
                                           ram_share=self.options.stripe_cache_ram_share)
                if recovered:
                    log.warning("finished what an interruption left: %s", recovered)
                daemon.converge(self.fs, self.state_dir, ram_share=self.options.stripe_cache_ram_share,
                                trigger="start", cause=daemon.start_cause(self.fs, self.state_dir))
            except HostBusyError as exc:
                log.info("re-apply at start postponed: %s", exc)
                self._retry = True
            except Exception as exc:
                # Serving anyway lets the control plane see and fix the host.
                log.error("re-applying the stored desired state failed: %s", exc)

    def _listen(self) -> grpc.Server:
        interceptors: list[grpc.ServerInterceptor] = [] if self.tls is None else [
            mtls.ControlPlaneOnly(self.options.control_plane_name)]
        server = grpc.server(
            ThreadPoolExecutor(max_workers=self.options.workers, thread_name_prefix="stortune-rpc"),
            options=SERVER_OPTIONS, interceptors=interceptors,
        )
        wire.add_servicer(self.service, server)
        try:
            if self.tls is None:
                port = server.add_insecure_port(self.options.listen)
            else:
                port = server.add_secure_port(self.options.listen, mtls.server_credentials(self.tls))
        except RuntimeError as exc:
            port, cause = 0, f": {exc}"
        else:
            cause = ""
        if port == 0:
            raise ServeError(f"cannot listen on {self.options.listen}{cause}"
                             " (address in use, or not a local address?)")
        server.start()
        self.address = _with_port(self.options.listen, port)
        how = "plaintext gRPC" if self.tls is None else (
            f"mutual TLS, callers must be {self.options.control_plane_name}")
        log.info("agent API listening on %s (%s)", self.address, how)
        return server

    def _registrar(self, url: str) -> Registrar:
        version = agent_version()
        config = RegistrationConfig(
            server=url, name=self.name,
            address=advertised_address(self.address, self.options.advertise),
            labels=dict(self.options.labels), heartbeat=self.options.heartbeat,
            backoff_base=self.options.backoff_base, backoff_cap=self.options.backoff_cap,
            agent_version=version, token=self.options.token, host_key=self._host_key,
            host_key_file=str(hostkey.path_in(self.state_dir)),
        )
        return Registrar(config, facts=lambda: host_facts(self.fs, version),
                         discover=self._uploaded_topology,
                         topology_hash=lambda: self._hash,
                         boot_id=local.host_info(self.fs).get("boot_id", ""),
                         observed_digest=lambda: self._digest,
                         corrections=lambda: corrections.batch(self.state_dir),
                         recorded=lambda epoch, seq: corrections.acknowledge(self.state_dir, epoch, seq))

    def _observe(self) -> bool:
        """Read the values as GetObserved would; -> whether their digest changed."""
        try:
            values, _ = local.observed(self.fs, self.state_dir)
        except (local.AgentError, StateError) as exc:
            log.debug("reading the values for their digest failed: %s", exc)
            return False
        digest = observed_values.digest(observed_values.encode(values))
        changed = digest != self._digest
        self._digest = digest
        return changed

    def _uploaded_topology(self) -> Topology:
        """What registration sends: values with their recorded originals, so the control plane's
        dry runs see pending restorations at once, and the protected devices, so they refuse what
        this agent refuses. A damaged originals store does not keep the
        host from registering; the agent API reports it (FAILED_PRECONDITION) at the next look."""
        try:
            topology = local.discover(self.fs, self.state_dir)
        except StateError as exc:
            log.warning("topology sent without its recorded originals: %s", exc)
            topology = local.discover(self.fs)
        return self.options.protection.report(self.fs, topology)

    def _protection_changed(self, topology: Topology) -> bool:
        """Whether the protected devices changed since the last look: swap turned on, a mount
        moved, a loop's backing file changed hands, all without the device graph's hash changing."""
        protected = self.options.protection.resolve(self.fs, topology)
        changed = protected != self._protected
        self._protected = protected
        return changed

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _watch_devices(self) -> None:
        waiter = daemon.make_waiter(self.fs, self._stop)
        try:
            self._watch(waiter)
        finally:
            waiter.close()

    def _watch(self, waiter: daemon.Waiter) -> None:
        """daemon.run's loop, waking at least once a second so stop() is prompt."""
        interval = self.options.rescan_interval
        next_scan = time.monotonic() + interval
        next_look = time.monotonic() + self.options.observe_interval
        while not self._stop.is_set():
            event = waiter.wait(max(0.0, min(1.0, next_scan - time.monotonic())))
            if self._stop.is_set():
                break
            if self.registrar is not None and time.monotonic() >= next_look:
                next_look = time.monotonic() + self.options.observe_interval
                if self._observe():  # drift, or a hand-made change: the control plane hears now
                    self.registrar.poke()
            if not event and time.monotonic() < next_scan:
                continue
            next_scan = time.monotonic() + interval
            try:
                topology = local.discover(self.fs)
                current = topology.structure_hash()
                if self._protection_changed(topology) and self.registrar is not None:
                    self.registrar.topology_changed()
                if current == self._hash and not event and not self._retry:
                    continue
                log.info("device graph changed (%s -> %s): converging", self._hash, current)
                self._hash = current
                with self.apply_lock:
                    self._retry = False
                    daemon.converge(self.fs, self.state_dir, ram_share=self.options.stripe_cache_ram_share)
            except HostBusyError as exc:
                # Settings stay as they are under a benchmark or an experiment; the next rescan tries again.
                log.info("re-apply postponed: %s", exc)
                self._retry = True
            except (local.AgentError, StateError) as exc:
                log.error("re-apply after a device change failed: %s", exc)
            except Exception:
                log.exception("device rescan failed; trying again at the next one")
            if self.registrar is not None:
                self._observe()
                self.registrar.poke()

    def stop(self) -> None:
        """Stop registering and watching, then the API (in-flight calls get ``grace`` s)."""
        self._stop.set()
        if self.registrar is not None:
            self.registrar.stop()
        self.service.close()  # no fio outlives the agent
        for thread in self._threads:
            thread.join(timeout=self.options.grace + 15)
            if thread.is_alive():
                log.warning("%s did not stop in time", thread.name)
        if self._server is not None:
            self._server.stop(self.options.grace).wait(self.options.grace + 5)
            self._server = None
        log.info("agent stopped")


@contextlib.contextmanager
def _signals(stop: threading.Event) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _handler(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    previous = {sig: signal.signal(sig, _handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run(fs: KernelFS, state_dir: Path, options: ServeOptions,
        stop: threading.Event | None = None) -> int:
    """Serve until ``stop`` is set or SIGTERM/SIGINT arrives; 0 on a clean stop."""
    stop = stop or threading.Event()
    heap.limit_arenas()  # before the agent's threads exist: they would each get an arena
    agent = Agent(fs, state_dir, options)
    with _signals(stop):
        try:
            agent.start()
            heap.trim()  # what discovery, enrolment and the first apply freed
            while not stop.wait(heap.TRIM_INTERVAL_S):
                heap.trim()
        finally:
            agent.stop()
    return 0
