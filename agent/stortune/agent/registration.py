"""Registering this agent with the control plane and keeping its lease.

Plain JSON over HTTP with the standard library, so the agent stays small::

    POST {server}/api/v1/agents/register
         {name, address, labels, facts, topology, topology_hash}
      -> {name, heartbeat_interval_s, lease_duration_s, topology_wanted}
    POST {server}/api/v1/agents/{name}/watch        {topology_hash, boot_id, observed_digest}
      -> held by the server up to watch_s, then {watch_s, topology_wanted, reconnect_after_s}
    POST {server}/api/v1/agents/{name}/heartbeat    {topology_hash, boot_id, observed_digest}
      -> {topology_wanted, heartbeat_interval_s}     (404: unknown agent, register again)
    PUT  {server}/api/v1/agents/{name}/topology     {topology, topology_hash}

The agent keeps a watch open: while the server holds it, the server keeps the agent's
lease without a request per heartbeat, and at the end of the hold the agent calls again.
What changes on the host (its values' digest, its devices) is reported at once with a
heartbeat from the thread that noticed it (``report()``). Settings the agent set back on its
own (``corrections``) go with the watches and heartbeats, to a server that says it takes them
(``accepts_corrections``), until it answers that it recorded them (``corrections_recorded``).
A server without the watch call (an older one) is sent paced heartbeats instead.

Every call carries ``Authorization: Bearer TOKEN``, the agents' bootstrap token
(``--token-file``); a 401 or 403 is retried with backoff like any failure, so
a token fixed on the server side takes effect without restarting the agent.

Every call also carries the host key (``X-Stortune-Host-Key``, ``hostkey``): the
first registration of the name pins it, and the control plane refuses calls for
an enrolled name without it (409 to a registration, 403 to a heartbeat or a
topology update). Such a refusal is logged once, with what to do (an admin
deletes the host, or the state directory is restored), and retried with a
backoff ten times longer, so a refused agent does not fill the audit log.

Heartbeats are small; the topology is sent only when its structure hash
changed or the server asks for it. Every failure is retried with exponential
backoff and full jitter (so a fleet that lost the server does not come back
in lock step), and logged once per change of state, not once per attempt.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import random
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from stortune.agent import local
from stortune.agent.journal import StateError
from stortune.agent.kernelfs import KernelFS
from stortune.api.agent import HOST_KEY_HEADER
from stortune.schemas import backoff
from stortune.schemas.corrections import CorrectionBatch
from stortune.schemas.topology import Topology

log = logging.getLogger("stortune.agent.registration")

DEFAULT_HEARTBEAT_S = 30.0
#: A watch's timeout before the server said how long it holds them, and the margin above that.
DEFAULT_HOLD_S = 600.0
WATCH_MARGIN_S = 30.0
MIN_HEARTBEAT_S = 0.1  # a server bug answering 0 must not turn into a busy loop


@dataclass(frozen=True)
class RegistrationConfig:
    server: str  # base URL, http(s)://host:port[/prefix]
    name: str
    address: str  # where the control plane reaches this agent's gRPC API
    labels: Mapping[str, str] = field(default_factory=dict)
    #: Upper bound on the heartbeat interval; the server's interval otherwise.
    heartbeat: float | None = None
    timeout: float = 10.0
    backoff_base: float = 1.0
    backoff_cap: float = 30.0
    agent_version: str = "0+unknown"
    #: The bearer token of role agent; never logged (repr=False).
    token: str | None = field(default=None, repr=False)
    #: This host's key (``hostkey``); never logged.
    host_key: str | None = field(default=None, repr=False)
    #: Where the key is kept, for the message that says what to do when it is refused.
    host_key_file: str = "STATE_DIR/host.key"
    #: The backoff cap while the control plane refuses this host's identity (None: 10 x backoff_cap).
    refused_backoff_cap: float | None = None


class RequestFailed(Exception):
    """The server did not accept a request; retry with backoff. ``status``: the HTTP status, if
    any; ``fields``: what the server's answer named as at fault (its Status causes)."""

    def __init__(self, message: str, status: int | None = None, fields: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.fields = fields

    @property
    def identity_refused(self) -> bool:
        """The control plane refused this host's key: the name is enrolled with another."""
        return self.status in (403, 409) and any(HOST_KEY_HEADER in f for f in self.fields)


class _Gone(Exception):
    """The server does not know this agent (404): register again."""


def _number(value: object) -> float | None:
    """A positive number from the server's answer, else None."""
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < 86_400:
        return float(value)
    return None


def backoff_delay(attempt: int, base: float, cap: float,
                  uniform: Callable[[float, float], float] = random.uniform) -> float:
    """Full jitter: uniform over [0, min(cap, base * 2**(attempt-1))], attempt >= 1."""
    return uniform(0.0, backoff.ceiling(attempt - 1, base, cap))


def host_facts(fs: KernelFS, agent_version: str) -> dict[str, Any]:
    info = local.host_info(fs)
    mem_bytes: int | None = None
    for line in (fs.read_proc("meminfo") or "").splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                mem_bytes = int(parts[1]) * 1024
            break
    return {
        "kernel": info.get("kernel", ""),
        "agent_version": agent_version,
        "boot_id": info.get("boot_id", ""),
        "hostname": info.get("hostname", ""),
        "cpu_count": os.cpu_count(),
        "mem_bytes": mem_bytes,
    }


def default_name(fs: KernelFS) -> str:
    return (local.host_info(fs).get("hostname") or socket.gethostname()).strip().lower()


def _reason(exc: BaseException) -> str:
    """A short, stable description of a transport failure."""
    if isinstance(exc, urllib.error.URLError) and isinstance(exc.reason, BaseException):
        return _reason(exc.reason)
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, ConnectionResetError):
        return "connection reset"
    if isinstance(exc, TimeoutError | socket.timeout):
        return "timed out"
    if isinstance(exc, socket.gaierror):
        return f"name resolution failed ({exc.strerror})"
    if isinstance(exc, ssl.SSLError):
        return f"TLS error ({exc.reason or exc})"
    if isinstance(exc, http.client.RemoteDisconnected):
        return "connection closed by the server"
    if isinstance(exc, urllib.error.URLError):
        return str(exc.reason)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _fields(body: bytes) -> tuple[str, ...]:
    """The fields a Status answer names in its causes; () for any other body."""
    try:
        data = json.loads(body)
        causes = data["details"]["causes"]
        return tuple(str(c["field"]) for c in causes if isinstance(c, dict) and "field" in c)
    except (ValueError, TypeError, KeyError):
        return ()


_AUTH_HINTS = {
    401: " (give the agents' bootstrap token: --token-file FILE or $STORTUNE_AGENT_TOKEN)",
    403: " (the token's role is not agent)",
}


def _excerpt(body: bytes) -> str:
    text = body.decode("utf-8", "replace").strip().replace("\n", " ")
    return text[:200] + ("..." if len(text) > 200 else "")


class Registrar:
    """Registers, heartbeats and sends topology updates until ``stop()``; never raises.

    ``discover`` returns a fresh topology (for register and topology updates);
    ``topology_hash`` returns the latest known structure hash cheaply (the
    device loop keeps it current). ``poke()`` asks for an early heartbeat,
    e.g. after a hot-plug; it is ignored while backing off.
    """

    def __init__(self, config: RegistrationConfig, *, facts: Callable[[], dict[str, Any]],
                 discover: Callable[[], Topology], topology_hash: Callable[[], str],
                 boot_id: str, uniform: Callable[[float, float], float] = random.uniform,
                 observed_digest: Callable[[], str | None] = lambda: None,
                 corrections: Callable[[], CorrectionBatch | None] = lambda: None,
                 recorded: Callable[[str, int], None] = lambda epoch, seq: None) -> None:
        if not config.server.startswith(("http://", "https://")):
            raise ValueError(f"server URL {config.server!r} must start with http:// or https://")
        self.config = config
        self._base = config.server.rstrip("/")
        self._facts = facts
        self._discover = discover
        self._topology_hash = topology_hash
        self._boot_id = boot_id
        self._uniform = uniform
        self._observed_digest = observed_digest
        self._corrections = corrections
        self._recorded = recorded
        #: The server takes the agent's own corrections (an older one refuses the field).
        self._takes_corrections = False
        self._opener = urllib.request.build_opener()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._poked = False
        self._state = "starting"
        #: The name the server registered us under; None until registered.
        self.name: str | None = None
        self.interval = config.heartbeat or DEFAULT_HEARTBEAT_S
        self.lease: float | None = None
        self._sent_hash: str | None = None
        #: Whether the server holds watches: None until the first one is tried.
        self.watching: bool | None = None
        #: How long the server held the last watch (the next one's timeout is kept above it).
        self._hold = DEFAULT_HOLD_S
        self._held = HeldCall()
        #: Reports from other threads and the loop's own calls are one at a time.
        self._calls = threading.Lock()

    # -- control --------------------------------------------------------------
    def stop(self) -> None:
        self._stopped.set()
        self._held.abort()
        self._wake.set()

    def poke(self) -> None:
        """Something changed on the host: report it now (from the caller's thread while a watch
        is held; else by an early heartbeat of the loop)."""
        if self.watching is not False and self.name is not None and self._state == "registered":
            self.report()
            return
        self._poked = True
        self._wake.set()

    def topology_changed(self) -> None:
        """The topology changed without its structure hash (the protected devices): send it with
        the next report, now."""
        self._sent_hash = None
        self.poke()

    def report(self) -> None:
        """A heartbeat now, with the current digests; never raises (the loop retries what fails)."""
        try:
            self._heartbeat()
        except (RequestFailed, _Gone) as exc:
            log.info("reporting a change to %s failed (%s); the watch loop tries again", self._base, exc)

    @property
    def state(self) -> str:
        return self._state

    def run(self) -> None:
        failures = 0
        delay = 0.0
        while self._sleep(delay):
            try:
                if self.name is None:
                    self._register()
                    after = self.interval if self.watching is False else 0.0
                elif self.watching is not False:
                    after = self._watch()
                else:
                    self._heartbeat()
                    after = self.interval
            except _Gone as exc:
                self.name = None
                self._transition("lost", logging.WARNING,
                                 f"control plane {self._base} {exc}: registering again")
                delay = 0.0
                continue
            except RequestFailed as exc:
                if self._stopped.is_set():  # the held watch was ended by stop()
                    return
                failures += 1
                if exc.identity_refused:
                    cap = self.config.refused_backoff_cap or 10 * self.config.backoff_cap
                    self._transition("refused", logging.ERROR, self._refused_message(cap))
                else:
                    cap = self.config.backoff_cap
                    self._transition("failing", logging.WARNING,
                                     f"control plane {self._base}: {exc}; retrying with backoff"
                                     f" (at most {cap:g} s apart)")
                delay = backoff_delay(failures, self.config.backoff_base, cap, self._uniform)
                log.debug("attempt %d failed (%s); next in %.2f s", failures, exc, delay)
                continue
            except Exception:
                # A bug here must not take the agent's API down with it.
                failures += 1
                delay = backoff_delay(failures, self.config.backoff_base, self.config.backoff_cap,
                                      self._uniform)
                log.exception("registration loop error; retrying in %.1f s", delay)
                continue
            if failures:
                log.info("control plane %s reachable again after %d failed attempt(s)",
                         self._base, failures)
            failures = 0
            delay = after

    def _sleep(self, delay: float) -> bool:
        """Wait ``delay`` s, less if poked while registered; False once stopped."""
        deadline = time.monotonic() + delay
        while not self._stopped.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            if self._wake.wait(remaining):
                self._wake.clear()
                if self._poked and self._state == "registered":
                    self._poked = False
                    return not self._stopped.is_set()
        return False

    def _refused_message(self, cap: float) -> str:
        name = self.name or self.config.name
        return (f"control plane {self._base} refuses this agent as {name!r}: that name is enrolled with "
                f"another host key. If this machine replaced the one enrolled as {name!r}, an admin "
                f"deletes the host (DELETE /api/v1/hosts/{name} on the control plane) and this agent enrolls "
                f"it at its next attempt; if it is the same machine, restore its state directory (the "
                f"key is {self.config.host_key_file}) and restart the agent. Retrying at most "
                f"{cap:g} s apart.")

    def _transition(self, state: str, level: int, message: str) -> None:
        if state != self._state:
            log.log(level, "%s", message)
        self._state = state

    # -- the three calls -------------------------------------------------------
    def _register(self) -> None:
        topology = self._discover()
        topology_hash = topology.structure_hash()
        body = {
            "name": self.config.name, "address": self.config.address,
            "labels": dict(self.config.labels), "facts": self._facts(),
            "topology": topology.model_dump(mode="json"), "topology_hash": topology_hash,
        }
        digest = self._observed_digest()
        if digest is not None:
            body["observed_digest"] = digest
        status, data = self._call("POST", "/api/v1/agents/register", body, "register")
        if status == 404:
            raise RequestFailed(f"register: HTTP 404 from {self._base}/api/v1/agents/register"
                          " (is --server the control plane's base URL?)")
        name = data.get("name")
        self.name = name if isinstance(name, str) and name else self.config.name
        self._sent_hash = topology_hash
        self._timing(data)
        self._settle(body, data)
        self._poked = False
        self._transition("registered", logging.INFO,
                         f"registered with {self._base} as {self.name!r} ({self.config.address});"
                         f" heartbeat every {self.interval:g} s")

    def _beat(self) -> dict[str, Any]:
        body: dict[str, Any] = {"topology_hash": self._topology_hash(), "boot_id": self._boot_id}
        digest = self._observed_digest()
        if digest is not None:
            body["observed_digest"] = digest
        if self._takes_corrections:
            try:
                batch = self._corrections()
            except StateError as exc:
                log.warning("the agent's corrections cannot be read, so they are not reported: %s", exc)
                batch = None
            if batch is not None:
                body["corrections"] = batch.model_dump(mode="json")
        return body

    def _settle(self, body: Mapping[str, Any], data: Mapping[str, Any]) -> None:
        """What the answer says of corrections: whether the server takes them, and up to which
        the ones sent are recorded (those are dropped; the others go with the next call)."""
        self._takes_corrections = data.get("accepts_corrections") is True
        sent, recorded = body.get("corrections"), data.get("corrections_recorded")
        if isinstance(sent, dict) and isinstance(recorded, int) and not isinstance(recorded, bool):
            try:
                self._recorded(str(sent["epoch"]), recorded)
            except StateError as exc:
                log.warning("the corrections the control plane recorded cannot be dropped: %s", exc)

    def _heartbeat(self) -> None:
        with self._calls:
            body = self._beat()
            status, data = self._call("POST", f"/api/v1/agents/{self._quoted()}/heartbeat", body,
                                      "heartbeat")
            if status == 404:
                raise _Gone("answered 404 to the heartbeat: it does not know this agent")
            self._timing(data)
            self._settle(body, data)
            self._transition("registered", logging.DEBUG, f"heartbeat accepted by {self._base}")
            if data.get("topology_wanted") is True or body["topology_hash"] != self._sent_hash:
                self._send_topology()

    def _watch(self) -> float:
        """One watch, held by the server; -> how long to wait before the next."""
        body = self._beat()
        started = time.monotonic()
        status, data = self._held.post(
            self._base, f"/api/v1/agents/{self._quoted()}/watch", body, what="watch",
            token=self.config.token, timeout=self._hold + WATCH_MARGIN_S,
            version=self.config.agent_version, host_key=self.config.host_key)
        if status == 404:
            # An unknown host (register again), or a server without watches: a heartbeat tells.
            self._heartbeat()
            self.watching = False
            log.info("control plane %s does not hold watches: heartbeat every %g s", self._base,
                     self.interval)
            return self.interval
        if not self.watching:
            log.info("watching control plane %s (held up to %g s)", self._base,
                     _number(data.get("watch_s")) or self._hold)
        self.watching = True
        self._timing(data)
        self._settle(body, data)
        self._transition("registered", logging.DEBUG, f"watch ended by {self._base}")
        hold = _number(data.get("watch_s"))
        if hold:
            self._hold = max(hold, MIN_HEARTBEAT_S)
        if data.get("topology_wanted") is True or body["topology_hash"] != self._sent_hash:
            with self._calls:
                self._send_topology()
        after = _number(data.get("reconnect_after_s")) or 0.0
        # A server answering at once every time (a bug, a proxy) must not make a busy loop.
        return max(after, 0.0 if time.monotonic() - started >= 1.0 else 1.0)

    def _send_topology(self) -> None:
        topology = self._discover()
        topology_hash = topology.structure_hash()
        status, _ = self._call("PUT", f"/api/v1/agents/{self._quoted()}/topology",
                               {"topology": topology.model_dump(mode="json"),
                                "topology_hash": topology_hash}, "topology update")
        if status == 404:
            raise _Gone("answered 404 to the topology update: it does not know this agent")
        self._sent_hash = topology_hash
        log.info("sent topology %s to %s", topology_hash, self._base)

    def _quoted(self) -> str:
        return urllib.parse.quote(self.name or self.config.name, safe="")

    def _timing(self, data: Mapping[str, Any]) -> None:
        interval = data.get("heartbeat_interval_s")
        lease = data.get("lease_duration_s")
        if isinstance(lease, int | float) and not isinstance(lease, bool) and lease > 0:
            self.lease = float(lease)
        if isinstance(interval, int | float) and not isinstance(interval, bool) and interval > 0:
            chosen = float(interval)
            if self.config.heartbeat:
                chosen = min(chosen, self.config.heartbeat)
            if self.lease:
                chosen = min(chosen, self.lease / 2)  # one lost heartbeat must not expire the lease
            self.interval = max(MIN_HEARTBEAT_S, chosen)

    def _call(self, method: str, path: str, body: Mapping[str, Any],
              what: str) -> tuple[int, dict[str, Any]]:
        return call_json(self._opener, self._base, method, path, body, what=what,
                         token=self.config.token, timeout=self.config.timeout,
                         version=self.config.agent_version, host_key=self.config.host_key)


def _headers(token: str | None, version: str, host_key: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "Accept": "application/json",
               "User-Agent": f"stortune-agent/{version}"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if host_key:
        headers[HOST_KEY_HEADER] = host_key
    return headers


def _decoded(status: int, raw: bytes, what: str, reason: str = "") -> tuple[int, dict[str, Any]]:
    """(status, JSON object) for 2xx and 404; RequestFailed for anything else."""
    if status == 404:
        return 404, {}
    if not 200 <= status < 300:
        fields = _fields(raw)
        hint = "" if HOST_KEY_HEADER in "".join(fields) else _AUTH_HINTS.get(status, "")
        shown = f"HTTP {status} {reason}".rstrip()
        raise RequestFailed(f"{what}: {shown}: {_excerpt(raw)}{hint}", status, fields)
    if not raw.strip():
        return status, {}
    try:
        data = json.loads(raw)
    except ValueError:
        raise RequestFailed(f"{what}: response is not JSON: {_excerpt(raw)}") from None
    if not isinstance(data, dict):
        raise RequestFailed(f"{what}: expected a JSON object, got {type(data).__name__}")
    return status, data


def call_json(opener: urllib.request.OpenerDirector, base: str, method: str, path: str,
              body: Mapping[str, Any], *, what: str, token: str | None, timeout: float,
              version: str, host_key: str | None = None) -> tuple[int, dict[str, Any]]:
    """(status, JSON object) for 2xx and 404; any other outcome raises RequestFailed."""
    # The scheme was checked by the caller: http(s) only, never file: or custom ones.
    request = urllib.request.Request(  # noqa: S310
        base + path, data=json.dumps(body).encode(), method=method,
        headers=_headers(token, version, host_key))
    try:
        with opener.open(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            raw = exc.read()
        return _decoded(exc.code, raw, what, exc.reason)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise RequestFailed(f"{what}: {_reason(exc)}") from None
    return _decoded(status, raw, what)


class HeldCall:
    """The connection of a call the server holds open (a watch), so ``abort()`` ends it at once
    from another thread: the agent stops promptly, not when the hold runs out."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None
        self._aborted = False

    def abort(self) -> None:
        with self._lock:
            self._aborted = True
            if self._conn is not None and self._conn.sock is not None:
                with contextlib.suppress(OSError):
                    self._conn.sock.shutdown(socket.SHUT_RDWR)

    def post(self, base: str, path: str, body: Mapping[str, Any], *, what: str, token: str | None,
             timeout: float, version: str, host_key: str | None) -> tuple[int, dict[str, Any]]:
        """As ``call_json`` with POST, over a connection of its own."""
        url = urllib.parse.urlsplit(base + path)
        host, port = url.hostname or "", url.port
        conn: http.client.HTTPConnection = (
            http.client.HTTPSConnection(host, port, timeout=timeout, context=ssl.create_default_context())
            if url.scheme == "https" else http.client.HTTPConnection(host, port, timeout=timeout))
        target = url.path + (f"?{url.query}" if url.query else "")
        try:
            with self._lock:
                if self._aborted:
                    raise RequestFailed(f"{what}: stopped")
                self._conn = conn
            conn.connect()
            conn.request("POST", target, body=json.dumps(body).encode(),
                         headers=_headers(token, version, host_key))
            response = conn.getresponse()
            status, reason, raw = response.status, response.reason, response.read()
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise RequestFailed(f"{what}: {'stopped' if self._aborted else _reason(exc)}") from None
        finally:
            with self._lock:
                self._conn = None
            conn.close()
        return _decoded(status, raw, what, reason)
