"""Hollow agents: thousands of simulated hosts in a few processes, as kubemark's hollow nodes.

    python bench/hollow.py --server URL[,URL...] --index I --procs P --hosts N --dir DIR --port PORT

This process runs hosts I, I+P, I+2P, ... of N (dealt out, so the control plane's
name-ordered work does not fall on one process at a time). Each host is real agent
code on a fixture of its own, only the serving machinery is shared:

* a fixture sysfs/procfs tree (two loop devices) under DIR/NAME, read and written
  through the agent's ``KernelFS`` exactly as on a real host;
* its own state directory with its own host key (``hostkey.load_or_create``) and,
  unless --insecure, its own key and certificate for its name, signed by the
  control plane from a CSR sent with the bootstrap token (the agent's enrolment
  call; the key and CSR are made in-process rather than by the agent's per-host
  child process, which would cost 10,000 Python starts);
* the agent's real ``AgentService`` (planner, executor, journal) behind its own gRPC
  server on its own loopback address, 127.1.X.Y:PORT (all of 127/8 is loopback on
  Linux): the control plane's 10,000 client connections then go to 10,000 distinct
  destinations and cannot run out of ephemeral ports;
* the agent's real ``Registrar``: the same register, heartbeat and topology REST
  calls, backoff and heartbeat pacing, with host ``i`` talking to server ``i % len(URLs)``.

Why this is cheap enough: the gRPC servers are ``grpc.aio`` servers on one event loop,
which share the process's completion queue (a sync ``grpc.server`` has a polling
thread each); their (synchronous) servicers run in one shared thread pool. 2,500 idle
servers take about 60 MB and no measurable CPU. The registrars are one thread each with
a small stack, asleep between heartbeats. What remains is the real cost of the work:
a GetObserved over a fixture tree is about 5 ms of CPU, which at 10,000 hosts and a
drift check every 30 s is most of a core on this 2-core machine; the fleet bench
reports the simulator's CPU next to the server's for that reason.

What differs from ``stortune-agent serve``: the service's calls get their gRPC context
through ``_AioContext`` (grpc.aio's context for synchronous handlers has no
``is_active()``; here the deadline stands for it). Not simulated: the agent's
``ControlPlaneOnly`` interceptor (a synchronous interceptor, which a grpc.aio server
cannot take; the servers still require a client certificate from the control plane's
CA), the hot-plug rescan loop (the topology hash is computed afresh at each heartbeat
instead) and the re-apply at start.
Prints "ready" once every host serves and its registrar runs; stops on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stortune.agent import hostkey, identity, local, mtls  # noqa: E402
from stortune.agent.kernelfs import KernelFS  # noqa: E402
from stortune.agent.registration import (  # noqa: E402
    Registrar,
    RegistrationConfig,
    RequestFailed,
    backoff_delay,
    host_facts,
)
from stortune.agent.rpc import AgentService, agent_version  # noqa: E402
from stortune.agent.serve import SERVER_OPTIONS  # noqa: E402
from stortune.api.agent import observed as observed_values  # noqa: E402
from stortune.api.agent import tls, wire  # noqa: E402
from stortune.api.agent.tlsfiles import TLSFiles, write_private  # noqa: E402
from tests.fixtures.sysfs_builder import SysfsBuilder  # noqa: E402

#: Hosts of one process being set up at once: their enrolment calls overlap the tree building.
SETUP_CONCURRENCY = 4
#: Registrars only sleep and make one HTTP call at a time: the default 8 MiB stack is waste.
REGISTRAR_STACK = 256 << 10


def host_name(index: int) -> str:
    return f"hollow-{index:05d}"


def address_of(index: int, port: int) -> str:
    """Host ``index``'s own loopback address: 250 hosts per /24 of 127.1.0.0/16."""
    if not 0 <= index < 250 * 256:
        raise ValueError(f"host index {index} out of range")
    return f"127.1.{index // 250}.{1 + index % 250}:{port}"


def build_fixture(directory: Path, name: str) -> KernelFS:
    """A small host: two loop devices with their own backing files (fleet.py's real agents too)."""
    builder = SysfsBuilder(directory, hostname=name)
    builder.loop(0, size=1 << 21, backing_file=f"/srv/{name}/a.img")
    builder.loop(1, size=1 << 21, backing_file=f"/srv/{name}/b.img")
    return builder.finish()


class _AioContext:
    """A grpc.aio server hands a synchronous servicer a context without ``is_active()``, which
    the agent's service asks before it applies (a caller that gave up must not be acted for).
    Here it means "the deadline has not passed": a cancellation is not visible in that context."""

    def __init__(self, context: Any) -> None:
        self._context = context

    def is_active(self) -> bool:
        remaining = self._context.time_remaining()
        return remaining is None or remaining > 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


class _AioServicer:
    """The agent's real ``AgentService`` with each RPC's context wrapped in ``_AioContext``."""

    def __init__(self, service: AgentService) -> None:
        self._service = service

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._service, name)
        if not name[:1].isupper():  # RPC methods are the capitalised ones
            return method

        def call(request: Any, context: Any) -> Any:
            return method(request, _AioContext(context))

        return call


@dataclass(frozen=True)
class HollowOptions:
    servers: tuple[str, ...]
    index: int
    procs: int
    hosts: int
    directory: Path
    port: int
    token: str
    labels: tuple[tuple[str, str], ...] = (("role", "fleet"),)
    insecure: bool = False
    #: Seconds between two reads of a host's values (stortune-agent serve --observe-interval).
    observe_interval: float = 60.0


@dataclass
class HollowHost:
    index: int
    name: str
    fs: KernelFS
    state_dir: Path
    server: grpc.aio.Server
    registrar: Registrar
    #: The digest of its values last read, as the agent reports it.
    digest: str | None = None

    def observe(self) -> bool:
        """Read the values as the agent's observe loop does; -> whether their digest changed."""
        values, _ = local.observed(self.fs, self.state_dir)
        digest = observed_values.digest(observed_values.encode(values))
        changed, self.digest = digest != self.digest, digest
        return changed


def _enroll(options: HollowOptions, name: str, server_url: str, state_dir: Path, key: str) -> TLSFiles:
    """This host's certificate, as the agent obtains it (``identity.enroll``): a CSR for its name
    with the bootstrap token and its host key, retried with backoff until the control plane
    signs it, or refuses for good."""
    files = identity.own_files(state_dir)
    write_private(files.key, tls.new_key())
    csr = tls.make_csr(files.key.read_bytes(), name)
    enrollment = identity.Enrollment(server=server_url, name=name, token=options.token, host_key=key,
                                     version=agent_version())
    attempt = 0
    while True:
        try:
            cert, ca = identity.request_certificate(enrollment, csr)
            break
        except RequestFailed as exc:
            if exc.status in (401, 403, 409, 422):
                raise
            attempt += 1
            time.sleep(backoff_delay(attempt, enrollment.backoff_base, enrollment.backoff_cap))
    write_private(files.cert, cert, 0o644)
    write_private(files.ca, ca, 0o644)
    return files


def _prepare(options: HollowOptions, index: int) -> tuple[KernelFS, Path, str, TLSFiles | None]:
    """The blocking part of a host's start: its tree, key and certificate."""
    name = host_name(index)
    fs = build_fixture(options.directory / name, name)
    state_dir = options.directory / name / "state"
    key = hostkey.load_or_create(state_dir)
    server_url = options.servers[index % len(options.servers)]
    files = None if options.insecure else _enroll(options, name, server_url, state_dir, key)
    return fs, state_dir, key, files


async def _start_host(options: HollowOptions, index: int, blocking: ThreadPoolExecutor,
                      handlers: ThreadPoolExecutor) -> HollowHost:
    loop = asyncio.get_running_loop()
    fs, state_dir, key, files = await loop.run_in_executor(blocking, _prepare, options, index)
    name = host_name(index)
    service = AgentService(fs, state_dir)
    server = grpc.aio.server(migration_thread_pool=handlers, options=SERVER_OPTIONS)
    # The generated registration takes a grpc.aio server as well; the wrapper is typed for sync ones.
    wire.add_AgentServiceServicer_to_server(_AioServicer(service), server)  # type: ignore[no-untyped-call]
    address = address_of(index, options.port)
    if files is None:
        bound = server.add_insecure_port(address)
    else:
        bound = server.add_secure_port(address, mtls.server_credentials(files))
    if bound != options.port:
        raise RuntimeError(f"{name}: cannot listen on {address}")
    await server.start()
    version = agent_version()
    config = RegistrationConfig(
        server=options.servers[index % len(options.servers)], name=name, address=address,
        labels=dict(options.labels), agent_version=version, token=options.token, host_key=key,
        host_key_file=str(hostkey.path_in(state_dir)))
    host: HollowHost | None = None
    registrar = Registrar(config, facts=lambda: host_facts(fs, version),
                          discover=lambda: local.discover(fs, state_dir),
                          topology_hash=lambda: local.discover(fs).structure_hash(),
                          boot_id=local.host_info(fs).get("boot_id", ""),
                          observed_digest=lambda: host.digest if host is not None else None)
    host = HollowHost(index, name, fs, state_dir, server, registrar)
    await loop.run_in_executor(blocking, host.observe)
    threading.Thread(target=registrar.run, name=f"registrar-{name}", daemon=True).start()
    return host


def observe_all(hosts: list[HollowHost], interval: float, stop: threading.Event) -> None:
    """The agents' observe loops in one thread: each host read every ``interval`` seconds, the
    reads spread evenly; a changed digest is reported at once, as the agent does."""
    while not stop.is_set():
        started = time.monotonic()
        for turn, host in enumerate(list(hosts)):
            if stop.wait(max(0.0, started + turn * interval / max(1, len(hosts)) - time.monotonic())):
                return
            try:
                if host.observe():
                    host.registrar.poke()
            except Exception:  # a host's tree being written by an apply: read again next round
                logging.getLogger("hollow").debug("observing %s failed", host.name, exc_info=True)
        stop.wait(max(0.0, started + interval - time.monotonic()))


async def serve(options: HollowOptions, stop: asyncio.Event) -> None:
    """Start this process's hosts, say "ready", serve until ``stop``, then stop them all."""
    threading.stack_size(REGISTRAR_STACK)
    blocking = ThreadPoolExecutor(SETUP_CONCURRENCY, thread_name_prefix="hollow-setup")
    handlers = ThreadPoolExecutor(8, thread_name_prefix="hollow-rpc")
    gate = asyncio.Semaphore(SETUP_CONCURRENCY)
    hosts: list[HollowHost] = []

    async def one(index: int) -> None:
        async with gate:
            if not stop.is_set():
                hosts.append(await _start_host(options, index, blocking, handlers))

    observing = threading.Event()
    try:
        await asyncio.gather(*(one(i) for i in range(options.index, options.hosts, options.procs)))
        threading.Thread(target=observe_all, args=(hosts, options.observe_interval, observing),
                         name="hollow-observe", daemon=True).start()
        print("ready", flush=True)
        await stop.wait()
    finally:
        observing.set()
        for host in hosts:
            host.registrar.stop()
        await asyncio.gather(*(host.server.stop(1) for host in hosts), return_exceptions=True)
        blocking.shutdown(cancel_futures=True)
        handlers.shutdown(cancel_futures=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", required=True, help="control-plane base URL(s), comma-separated")
    ap.add_argument("--index", type=int, default=0)
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument("--hosts", type=int, required=True)
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--port", type=int, required=True, help="the gRPC port on every host's address")
    ap.add_argument("--insecure", action="store_true", help="plaintext gRPC (server run with --insecure)")
    ap.add_argument("--observe-interval", type=float, default=60.0,
                    help="seconds between two reads of a host's values, to report a change (the agent's"
                         " default is 10; the simulator reads thousands of hosts on two cores)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    options = HollowOptions(servers=tuple(args.server.split(",")), index=args.index, procs=args.procs,
                            hosts=args.hosts, directory=args.dir, port=args.port,
                            token=os.environ["STORTUNE_AGENT_TOKEN"], insecure=args.insecure,
                            observe_interval=args.observe_interval)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(options, stop)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
