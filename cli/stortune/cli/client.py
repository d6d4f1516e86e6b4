"""The control plane's REST API as the CLI uses it: one place that knows its URLs and JSON shapes.

Errors come back as Kubernetes-style Status bodies and are raised as the
exception hierarchy below. Documents are parsed tolerantly: a field the
server does not send (yet) reads as empty, because host status is filled in
by a reconciler that may be older or newer than this client.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import Any, ClassVar, Final, Generic, TypeVar
from urllib.parse import quote

import httpx

API: Final = "/api/v1"
DEFAULT_SERVER: Final = "http://127.0.0.1:8080"
DEFAULT_TIMEOUT: Final = 30.0
#: A diagnostics download waits for every storage tool of the host (each with its own timeout).
DIAGNOSTICS_TIMEOUT: Final = 900.0

JSON = dict[str, Any]
Value = int | str


# Errors -----------------------------------------------------------------------


class UsageError(Exception):
    """The command line asks for something that cannot be done as asked (exit 1, said once)."""


class ClientError(Exception):
    """Anything that kept a request from succeeding."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Unreachable(ClientError):
    """No HTTP answer at all: refused, timed out, name not resolved."""


@dataclass(frozen=True)
class Cause:
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


class StatusError(ClientError):
    """The server answered with an error status (a Status body when it is the control plane)."""

    def __init__(self, code: int, reason: str, message: str, causes: list[Cause] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.causes = causes or []


class NotFound(StatusError):
    pass


class Conflict(StatusError):
    """409: a stale resourceVersion, an object being deleted, or (AlreadyExists) a lost create race."""


class AlreadyExists(Conflict):
    pass


class Invalid(StatusError):
    """422: ``causes`` name each bad field by its path in the document."""


class Unauthorized(StatusError):
    """401: no token, or one the control plane does not accept (unknown, revoked, expired)."""


class Forbidden(StatusError):
    """403: the token is valid but its role may not do this."""


class TooManyRequests(StatusError):
    """429: this token's rate limit for the call is spent; ``retry_after`` seconds until it is not."""

    def __init__(self, code: int, reason: str, message: str, causes: list[Cause] | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(code, reason, message, causes)
        self.retry_after = retry_after


def _status_error(response: httpx.Response) -> StatusError:
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict) or body.get("kind") != "Status":
        # Not the control plane speaking (a proxy, a wrong URL): show what came back.
        text = response.text.strip().replace("\n", " ")[:200]
        return StatusError(response.status_code, response.reason_phrase,
                           f"{response.request.method} {response.request.url}: HTTP {response.status_code}"
                           + (f": {text}" if text else ""))
    details = _dict(body.get("details"))
    causes = [Cause(_str(c.get("field")), _str(c.get("message")))
              for c in _list(details.get("causes")) if isinstance(c, dict)]
    reason = _str(body.get("reason"))
    message = _str(body.get("message")) or f"HTTP {response.status_code}"
    code = response.status_code
    if code == 404:
        return NotFound(code, reason, message, causes)
    if code == 409:
        kind = AlreadyExists if reason == "AlreadyExists" else Conflict
        return kind(code, reason, message, causes)
    if code == 422:
        return Invalid(code, reason, message, causes)
    if code == 401:
        return Unauthorized(code, reason, message, causes)
    if code == 403:
        return Forbidden(code, reason, message, causes)
    if code == 429:
        retry = response.headers.get("retry-after", "")
        return TooManyRequests(code, reason, message, causes,
                               float(retry) if retry.isdigit() else None)
    return StatusError(code, reason, message, causes)


# Tolerant readers of JSON -----------------------------------------------------------


def _dict(value: Any) -> JSON:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _labels(value: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in _dict(value).items()}


def _value(value: Any) -> Value | None:
    return value if isinstance(value, int | str) and not isinstance(value, bool) else None


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


# Documents --------------------------------------------------------------------


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str
    last_transition: datetime | None

    @classmethod
    def parse(cls, data: JSON) -> Condition:
        return cls(_str(data.get("type")), _str(data.get("status")) or "Unknown", _str(data.get("reason")),
                   _str(data.get("message")), _time(data.get("lastTransitionTime")))


@dataclass(frozen=True)
class DeviceSetting:
    """One tunable on one device of a host: what the profiles want and what the agent saw."""

    device: str
    tunable: str
    desired: Value | None
    observed: Value | None
    in_sync: bool | None
    profile: str
    rule: str
    message: str
    mode: str  # enforce | audit; "" when not reported
    drifted: bool  # was in sync at this generation, then changed under us
    pending_reboot: bool = False  # configured in the RAID controller, in effect after a reboot

    @classmethod
    def parse(cls, data: JSON) -> DeviceSetting:
        in_sync = data.get("inSync")
        return cls(_str(data.get("device")), _str(data.get("tunable")), _value(data.get("desired")),
                   _value(data.get("observed")), in_sync if isinstance(in_sync, bool) else None,
                   _str(data.get("profile")), _str(data.get("rule")), _str(data.get("message")),
                   _str(data.get("mode")), data.get("drifted") is True,
                   data.get("pendingReboot") is True)


@dataclass(frozen=True)
class Host:
    name: str
    labels: dict[str, str]  # effective: what selectors see
    api_labels: dict[str, str]  # set through the API
    reported_labels: dict[str, str]  # sent by the agent
    address: str
    created: datetime | None
    conditions: list[Condition]
    devices: list[DeviceSetting]
    applied: dict[str, int]  # profile -> generation the host has applied
    refused: dict[str, int]  # profile -> generation the agent refused (not sent again until it changes)
    facts: dict[str, Any]
    raw: JSON = field(repr=False)

    @classmethod
    def parse(cls, data: JSON) -> Host:
        meta, spec, status = _dict(data.get("metadata")), _dict(data.get("spec")), _dict(data.get("status"))
        return cls(
            name=_str(meta.get("name")),
            labels=_labels(meta.get("labels")),
            api_labels=_labels(spec.get("labels")),
            reported_labels=_labels(status.get("reportedLabels")),
            address=_str(spec.get("address")),
            created=_time(meta.get("creationTimestamp")),
            conditions=[Condition.parse(c) for c in _list(status.get("conditions")) if isinstance(c, dict)],
            devices=[DeviceSetting.parse(d) for d in _list(status.get("devices")) if isinstance(d, dict)],
            applied={str(k): v for k, v in _dict(status.get("appliedGenerations")).items()
                     if isinstance(v, int)},
            refused={str(k): v for k, v in _dict(status.get("refusedGenerations")).items()
                     if isinstance(v, int)},
            facts=_dict(status.get("facts")),
            raw=data,
        )

    def condition(self, type: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type), None)


@dataclass(frozen=True)
class Profile:
    name: str
    resource_version: str | None
    generation: int | None
    labels: dict[str, str]
    annotations: dict[str, str]
    spec: JSON
    status: JSON
    created: datetime | None
    deleting: bool
    raw: JSON = field(repr=False)

    @classmethod
    def parse(cls, data: JSON) -> Profile:
        meta = _dict(data.get("metadata"))
        generation = meta.get("generation")
        return cls(
            name=_str(meta.get("name")),
            resource_version=_str(meta.get("resourceVersion")) or None,
            generation=generation if isinstance(generation, int) else None,
            labels=_labels(meta.get("labels")),
            annotations=_labels(meta.get("annotations")),
            spec=_dict(data.get("spec")),
            status=_dict(data.get("status")),
            created=_time(meta.get("creationTimestamp")),
            deleting=meta.get("deletionTimestamp") is not None,
            raw=data,
        )


@dataclass(frozen=True)
class Lease:
    """A host agent's lease: its last heartbeat and when it runs out."""

    renewed: datetime | None
    expires: datetime | None
    expired: bool

    @classmethod
    def parse(cls, data: JSON) -> Lease:
        return cls(_time(data.get("renewTime")), _time(data.get("expireTime")), data.get("expired") is True)


@dataclass(frozen=True)
class Protected:
    """A device the host's agent refuses to experiments, benchmarks and probes, and why."""

    device: str
    id: str
    reason: str

    @classmethod
    def of_topology(cls, data: Any) -> list[Protected] | None:
        """From a reported topology; None: none reported yet, or an agent too old to report them."""
        entries = _dict(data).get("protected")
        if not isinstance(entries, list):
            return None
        return [cls(_str(e.get("name")), _str(e.get("id")), _str(e.get("reason")))
                for e in entries if isinstance(e, dict)]


@dataclass(frozen=True)
class Event:
    type: str
    reason: str
    message: str
    object_kind: str
    object_name: str
    last_seen: datetime | None
    count: int
    raw: JSON = field(repr=False)

    @classmethod
    def parse(cls, data: JSON) -> Event:
        involved = _dict(data.get("involvedObject"))
        count = data.get("count")
        return cls(_str(data.get("type")), _str(data.get("reason")), _str(data.get("message")),
                   _str(involved.get("kind")), _str(involved.get("name")),
                   _time(data.get("lastTimestamp")), count if isinstance(count, int) else 1, data)


@dataclass(frozen=True)
class Source:
    profile: str
    rule: str
    mode: str  # enforce | audit: audit changes are reported, never made

    @classmethod
    def parse(cls, data: Any) -> Source:
        src = _dict(data)
        return cls(_str(src.get("profile")), _str(src.get("rule")), _str(src.get("mode")) or "enforce")


@dataclass(frozen=True)
class PlannedChange:
    device: str
    tunable: str
    current: Value | None
    desired: Value | None
    source: Source

    @classmethod
    def parse(cls, data: JSON) -> PlannedChange:
        return cls(_str(data.get("device")), _str(data.get("tunable")), _value(data.get("current")),
                   _value(data.get("desired")), Source.parse(data.get("source")))


@dataclass(frozen=True)
class PlannedRestoration:
    """A value no profile wants any more, put back: to its original, or to what a change still
    wanted left (``cause``, e.g. the scheduler for nr_requests)."""

    device: str
    tunable: str
    current: Value | None
    desired: Value | None
    to: str  # original | cause
    cause: str

    @classmethod
    def parse(cls, data: JSON) -> PlannedRestoration:
        return cls(_str(data.get("device")), _str(data.get("tunable")), _value(data.get("current")),
                   _value(data.get("desired")), _str(data.get("to")) or "original", _str(data.get("cause")))


@dataclass(frozen=True)
class PlannedRejection:
    device: str
    tunable: str
    value: Value | None
    reason: str
    fatal: bool  # True: an error, this setting (and what depends on it) is not set; False: skipped
    source: Source

    @classmethod
    def parse(cls, data: JSON) -> PlannedRejection:
        return cls(_str(data.get("device")), _str(data.get("tunable")), _value(data.get("value")),
                   _str(data.get("reason")), data.get("fatal") is True, Source.parse(data.get("source")))


@dataclass(frozen=True)
class HostPlan:
    """What one host would do if the dry run's documents were stored (with the other profiles on it)."""

    host: str
    topology_reported: bool
    changes: list[PlannedChange]
    rejections: list[PlannedRejection]
    restorations: list[PlannedRestoration] = field(default_factory=list)

    @classmethod
    def parse_all(cls, plans: Any) -> list[HostPlan]:
        """A dry run's ``plans``: {host: plan}, by host name."""
        out = []
        for host, raw in sorted(_dict(plans).items()):
            p = _dict(raw)
            out.append(cls(
                host, p.get("topologyReported") is not False,
                [PlannedChange.parse(c) for c in _list(p.get("changes")) if isinstance(c, dict)],
                [PlannedRejection.parse(r) for r in _list(p.get("rejections")) if isinstance(r, dict)],
                [PlannedRestoration.parse(r) for r in _list(p.get("restorations")) if isinstance(r, dict)],
            ))
        return out


@dataclass(frozen=True)
class DryRun:
    object: Profile
    plans: list[HostPlan]  # by host name

    @classmethod
    def parse(cls, data: JSON) -> DryRun:
        return cls(Profile.parse(_dict(data.get("object"))), HostPlan.parse_all(data.get("plans")))


@dataclass(frozen=True)
class Token:
    """An API token as listed: never its secret."""

    id: str
    name: str
    role: str
    hosts: str  # the support token's selector; "" for the others
    created: datetime | None
    expires: datetime | None
    last_used: datetime | None
    revoked: datetime | None
    raw: JSON = field(repr=False)

    @classmethod
    def parse(cls, data: JSON) -> Token:
        return cls(_str(data.get("id")), _str(data.get("name")), _str(data.get("role")),
                   _str(data.get("hostSelector")), _time(data.get("createdAt")), _time(data.get("expiresAt")),
                   _time(data.get("lastUsedAt")), _time(data.get("revokedAt")),
                   {k: v for k, v in data.items() if k != "token"})


@dataclass(frozen=True)
class Deleted:
    object: Profile
    pending: bool  # 202: the finalizer waits for hosts to restore the profile's settings


@dataclass(frozen=True)
class BenchmarkRun:
    """A benchmark run as the control plane shows it; ``result`` only when fetched alone."""

    id: str
    name: str  # the BenchmarkSpec's metadata.name
    host: str
    state: str  # queued | running | done | failed | cancelled
    message: str
    progress: JSON  # percent, readBytesPerSecond, writeBytesPerSecond, readIops, writeIops, message
    created: datetime | None
    started: datetime | None
    finished: datetime | None
    cancel_requested: bool
    passed: bool | None  # the thresholds' verdict; None without thresholds
    requested_by: str
    schedule: str
    context: JSON  # kernel, fioVersion, topologyHash, profiles
    result: JSON | None
    raw: JSON = field(repr=False)

    ENDED: ClassVar[frozenset[str]] = frozenset({"done", "failed", "cancelled"})

    @classmethod
    def parse(cls, data: JSON) -> BenchmarkRun:
        meta, spec, status = _dict(data.get("metadata")), _dict(data.get("spec")), _dict(data.get("status"))
        benchmark = _dict(spec.get("benchmark"))
        passed = status.get("passed")
        result = status.get("result")
        return cls(
            id=_str(meta.get("name")), name=_str(_dict(benchmark.get("metadata")).get("name")),
            host=_str(spec.get("host")), state=_str(status.get("state")) or "unknown",
            message=_str(status.get("message")), progress=_dict(status.get("progress")),
            created=_time(meta.get("creationTimestamp")), started=_time(status.get("startedAt")),
            finished=_time(status.get("finishedAt")), cancel_requested=status.get("cancelRequested") is True,
            passed=passed if isinstance(passed, bool) else None, requested_by=_str(spec.get("requestedBy")),
            schedule=_str(spec.get("schedule")), context=_dict(status.get("context")),
            result=result if isinstance(result, dict) else None, raw=data,
        )

    @property
    def ended(self) -> bool:
        return self.state in self.ENDED


T = TypeVar("T")


@dataclass(frozen=True)
class Listing(Generic[T]):
    items: list[T]
    raw: JSON = field(repr=False)


# The client -------------------------------------------------------------------


class Client:
    """A synchronous client of one control plane. Use as a context manager, or call close().

    ``token`` is sent as ``Authorization: Bearer``. A call refused with 429 (a rate-limited
    dry run, say) is retried after the server's Retry-After, at most ``RATE_LIMIT_RETRIES``
    times and only when that is at most ``MAX_RETRY_AFTER`` seconds.
    """

    RATE_LIMIT_RETRIES: Final = 3
    MAX_RETRY_AFTER: Final = 60.0
    #: A watch's read timeout beyond its own length (the server ends it at that length).
    WATCH_SLACK: Final = 30.0

    def __init__(self, server: str = DEFAULT_SERVER, *, token: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT, transport: httpx.BaseTransport | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.server = server.rstrip("/")
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(base_url=self.server + API, transport=transport,
                                  timeout=httpx.Timeout(timeout, connect=min(timeout, 5.0)),
                                  headers=headers)
        self._sleep = sleep

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, *, params: Mapping[str, str | int] | None = None,
                 body: JSON | None = None, timeout: float | None = None) -> httpx.Response:
        for _ in range(self.RATE_LIMIT_RETRIES):
            try:
                return self._request_once(method, path, params=params, body=body, timeout=timeout)
            except TooManyRequests as exc:
                if exc.retry_after is None or exc.retry_after > self.MAX_RETRY_AFTER:
                    raise
                self._sleep(exc.retry_after)
        return self._request_once(method, path, params=params, body=body, timeout=timeout)

    def _request_once(self, method: str, path: str, *, params: Mapping[str, str | int] | None,
                      body: JSON | None, timeout: float | None = None) -> httpx.Response:
        # None: the client's own timeout; a slow call (diagnostics) gives its own.
        limit: Any = httpx.USE_CLIENT_DEFAULT if timeout is None else httpx.Timeout(timeout, connect=5.0)
        with self._reaching():
            response = self._http.request(method, path, params=params, json=body, timeout=limit)
        if response.is_error:
            raise _status_error(response)
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> JSON:
        return _object(self._request(method, path, **kwargs))


    # Profiles

    def list_profiles(self, selector: str | None = None) -> Listing[Profile]:
        data = self._json("GET", "/profiles", params=_selector(selector))
        return Listing([Profile.parse(i) for i in _list(data.get("items")) if isinstance(i, dict)], data)

    def get_profile(self, name: str) -> Profile:
        with _naming("StorageProfile", name):
            return Profile.parse(self._json("GET", _path("profiles", name)))

    def create_profile(self, document: JSON) -> Profile:
        return Profile.parse(self._json("POST", "/profiles", body=document))

    def replace_profile(self, name: str, document: JSON) -> Profile:
        return Profile.parse(self._json("PUT", _path("profiles", name), body=document))

    def preview_create(self, document: JSON) -> DryRun:
        return DryRun.parse(self._json("POST", "/profiles", params=_DRY_RUN, body=document))

    def preview_replace(self, name: str, document: JSON) -> DryRun:
        return DryRun.parse(self._json("PUT", _path("profiles", name), params=_DRY_RUN, body=document))

    def plan(self, documents: list[JSON], delete: list[str]) -> list[HostPlan]:
        """What the hosts would do once ``documents`` were stored and ``delete`` deleted, all at once."""
        data = self._json("POST", "/plans", body={"apiVersion": "stortune/v1", "kind": "PlanRequest",
                                                  "profiles": documents, "delete": delete})
        return HostPlan.parse_all(data.get("plans"))

    def delete_profile(self, name: str) -> Deleted:
        response = self._request("DELETE", _path("profiles", name))
        return Deleted(Profile.parse(_object(response)), pending=response.status_code == 202)

    # Hosts

    def list_hosts(self, selector: str | None = None) -> Listing[Host]:
        data = self._json("GET", "/hosts", params=_selector(selector))
        return Listing([Host.parse(i) for i in _list(data.get("items")) if isinstance(i, dict)], data)

    def get_host(self, name: str) -> Host:
        with _naming("Host", name):
            return Host.parse(self._json("GET", _path("hosts", name)))

    def get_host_analysis(self, name: str, *, runs: int | None = None) -> JSON:
        """Layer ceilings, checks, slow members and path balance of one host."""
        with _naming("Host", name):
            return self._json("GET", _path("hosts", name, "analysis"),
                              params={"runs": runs} if runs is not None else None)

    # Probes

    def start_probe(self, host: str, *, device: str | None) -> JSON:
        """Start a probe (the caller has the user's consent: the body says so)."""
        body: JSON = {"consent": True, **({"device": device} if device else {})}
        with _naming("Host", host):
            return self._json("POST", _path("hosts", host, "probes"), body=body)

    def list_probes(self, host: str) -> JSON:
        with _naming("Host", host):
            return self._json("GET", _path("hosts", host, "probes"))

    def get_probe(self, host: str, probe_id: str) -> JSON:
        return self._json("GET", _path("hosts", host, "probes", probe_id))

    def cancel_probe(self, host: str, probe_id: str) -> JSON:
        return self._json("POST", _path("hosts", host, "probes", probe_id, "cancel"))

    def download_diagnostics(self, name: str, *, redact: bool = True, tool_timeout: float = 0,
                             timeout: float = DIAGNOSTICS_TIMEOUT) -> tuple[bytes, str | None]:
        """(tar.gz, the file name the server suggests); collecting runs every storage tool
        of the host, hence its own, longer timeout."""
        params: dict[str, str | int] = {"redact": "true" if redact else "false"}
        if tool_timeout:
            params["timeout"] = str(tool_timeout)
        with _naming("Host", name):
            response = self._request("GET", _path("hosts", name, "diagnostics"), params=params,
                                     timeout=timeout)
        match = re.search(r'filename="([^"/\\]+)"', response.headers.get("content-disposition", ""))
        return response.content, match.group(1) if match else None

    def get_host_protected(self, name: str) -> list[Protected] | None:
        """The devices the host's agent protects, from the topology it last reported."""
        with _naming("Host", name):
            response = self._request("GET", _path("hosts", name, "topology"))
        try:
            return Protected.of_topology(response.json())  # null: no topology reported yet
        except ValueError:
            return None

    def get_host_lease(self, name: str) -> Lease:
        with _naming("Host", name):
            return Lease.parse(self._json("GET", _path("hosts", name, "lease")))

    def merge_host_labels(self, name: str, labels: Mapping[str, str | None]) -> Host:
        """Set the API labels given; a None value removes one."""
        return Host.parse(self._json("PATCH", _path("hosts", name, "labels"), body={"labels": dict(labels)}))

    # Rollouts

    def get_rollout(self, profile: str, *, limit: int | None = None) -> JSON:
        """The profile's rollout status; NotFound when the profile does not exist or has none."""
        with _naming("StorageProfile", profile):
            return self._json("GET", _path("profiles", profile, "rollout"),
                              params={"limit": limit} if limit is not None else None)

    def steer_rollout(self, profile: str, command: str) -> JSON:
        """pause, resume or undo; the status with the command pending."""
        with _naming("StorageProfile", profile):
            return self._json("POST", _path("profiles", profile, "rollout", command))

    def watch_rollout(self, profile: str, *, seconds: int, limit: int | None = None) -> Iterator[JSON]:
        """The watch's lines as they come ({"type": "status", ...}, then {"type": "end", ...}).
        The server sends nothing while nothing changes: the read timeout is the watch's own."""
        params: dict[str, str | int] = {"watch": "true", "timeoutSeconds": seconds}
        if limit is not None:
            params["limit"] = limit
        timeout = httpx.Timeout(seconds + self.WATCH_SLACK, connect=5.0)
        with self._reaching(), _naming("StorageProfile", profile), \
                self._http.stream("GET", _path("profiles", profile, "rollout"), params=params,
                                  timeout=timeout) as response:
            if response.is_error:
                response.read()
                raise _status_error(response)
            for line in response.iter_lines():
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    raise ClientError(f"the rollout watch of {profile} sent a line that is not JSON: "
                                      f"{line[:80]!r}") from None
                if isinstance(event, dict):
                    yield event

    @contextmanager
    def _reaching(self) -> Iterator[None]:
        """A transport failure as Unreachable naming the control plane (a call, or a watch's lines)."""
        try:
            yield
        except httpx.TimeoutException as exc:
            raise Unreachable(f"cannot reach the control plane at {self.server}: timed out "
                              f"({type(exc).__name__})") from None
        except httpx.TransportError as exc:
            raise Unreachable(f"cannot reach the control plane at {self.server}: "
                              f"{exc or type(exc).__name__}") from None

    # Events

    def list_events(self, *, host: str | None = None, profile: str | None = None,
                    limit: int | None = None) -> Listing[Event]:
        params: dict[str, str | int] = {}
        if host:
            params["host"] = host
        if profile:
            params["profile"] = profile
        if limit is not None:
            params["limit"] = limit
        data = self._json("GET", "/events", params=params)
        return Listing([Event.parse(i) for i in _list(data.get("items")) if isinstance(i, dict)], data)


    # Tokens

    def create_token(self, role: str, *, name: str | None = None, description: str = "",
                     hosts: str | None = None, expires: str | None = None) -> tuple[Token, str]:
        """Issue a token; returns it and its secret (shown this once)."""
        body: JSON = {"role": role, "description": description}
        for key, value in (("name", name), ("hostSelector", hosts), ("expiresIn", expires)):
            if value is not None:
                body[key] = value
        data = self._json("POST", "/tokens", body=body)
        return Token.parse(data), _str(data.get("token"))

    def list_tokens(self) -> Listing[Token]:
        data = self._json("GET", "/tokens")
        return Listing([Token.parse(i) for i in _list(data.get("items")) if isinstance(i, dict)], data)

    def revoke_token(self, token_id: str) -> Token:
        with _naming("ApiToken", token_id):
            return Token.parse(self._json("DELETE", _path("tokens", token_id)))

    # Audit log

    def list_audit(self, *, token: str | None = None, method: str | None = None,
                   resource: str | None = None, since: str | None = None,
                   limit: int | None = None) -> JSON:
        """Audit records, newest first (admins); ``since`` goes as given, the server checks it."""
        given: dict[str, str | int | None] = {"token": token, "method": method, "resource": resource,
                                              "since": since, "limit": limit}
        return self._json("GET", "/audit", params={k: v for k, v in given.items() if v is not None})

    # Benchmarks

    def start_benchmarks(self, document: JSON, *, host: str | None = None) -> Listing[BenchmarkRun]:
        """Queue the BenchmarkSpec on every host its selector matches (or on ``host``)."""
        data = self._json("POST", "/benchmarks/runs", params={"host": host} if host else None, body=document)
        return Listing([BenchmarkRun.parse(i) for i in _list(data.get("items")) if isinstance(i, dict)], data)

    def preview_benchmarks(self, document: JSON, *, host: str | None = None) -> JSON:
        """The hosts and each one's expanded steps; nothing is queued."""
        params: dict[str, str | int] = {**_DRY_RUN, **({"host": host} if host else {})}
        return self._json("POST", "/benchmarks/runs", params=params, body=document)

    def list_benchmark_runs(self, *, host: str | None = None, name: str | None = None,
                            state: str | None = None, schedule: str | None = None,
                            limit: int | None = None) -> Listing[BenchmarkRun]:
        params: dict[str, str | int] = {k: v for k, v in (("host", host), ("name", name), ("state", state),
                                                           ("schedule", schedule), ("limit", limit))
                                        if v is not None}
        data = self._json("GET", "/benchmarks/runs", params=params)
        return Listing([BenchmarkRun.parse(i) for i in _list(data.get("items")) if isinstance(i, dict)], data)

    def get_benchmark_run(self, run_id: str) -> BenchmarkRun:
        with _naming("BenchmarkRun", run_id):
            return BenchmarkRun.parse(self._json("GET", _path("benchmarks", "runs", run_id)))

    def cancel_benchmark_run(self, run_id: str) -> BenchmarkRun:
        with _naming("BenchmarkRun", run_id):
            return BenchmarkRun.parse(self._json("POST", _path("benchmarks", "runs", run_id, "cancel")))

    def benchmark_judgement(self, run_id: str) -> JSON:
        with _naming("BenchmarkRun", run_id):
            return self._json("GET", _path("benchmarks", "runs", run_id, "judgement"))

    def compare_benchmarks(self, a: str, b: str) -> JSON:
        return self._json("GET", "/benchmarks/compare", params={"a": a, "b": b})

    def benchmark_plot(self, run_id: str, *, kind: str, fmt: str) -> bytes:
        with _naming("BenchmarkRun", run_id):
            return self._request("GET", _path("benchmarks", "runs", run_id, "plot"),
                                 params={"kind": kind, "format": fmt}).content

    def comparison_plot(self, a: str, b: str, *, fmt: str, metric: str = "bandwidth") -> bytes:
        return self._request("GET", "/benchmarks/compare/plot",
                             params={"a": a, "b": b, "format": fmt, "metric": metric}).content

    def set_baseline(self, name: str, run_id: str, *, hosts: str | None = None,
                     description: str = "") -> JSON:
        body: JSON = {"run": run_id, "description": description}
        if hosts is not None:
            body["hostSelector"] = hosts
        return self._json("PUT", _path("benchmarks", "baselines", name), body=body)

    def get_baseline(self, name: str) -> JSON:
        with _naming("BenchmarkBaseline", name):
            return self._json("GET", _path("benchmarks", "baselines", name))

    def list_baselines(self) -> JSON:
        return self._json("GET", "/benchmarks/baselines")

    def delete_baseline(self, name: str) -> JSON:
        with _naming("BenchmarkBaseline", name):
            return self._json("DELETE", _path("benchmarks", "baselines", name))

    def create_schedule(self, document: JSON) -> JSON:
        return self._json("POST", "/benchmarks/schedules", body=document)

    def list_schedules(self) -> JSON:
        return self._json("GET", "/benchmarks/schedules")

    def delete_schedule(self, name: str) -> JSON:
        with _naming("BenchmarkSchedule", name):
            return self._json("DELETE", _path("benchmarks", "schedules", name))

    # Tuning experiments

    def start_experiment(self, document: JSON) -> JSON:
        """Queue a TuningExperiment on the hosts its selector matches; the experiment document."""
        return self._json("POST", "/experiments", body=document)

    def preview_experiment(self, document: JSON) -> JSON:
        """The hosts, each one's device and trial plan; nothing runs."""
        return self._json("POST", "/experiments", params=_DRY_RUN, body=document)

    def list_experiments(self, *, name: str | None = None, state: str | None = None,
                         limit: int | None = None) -> JSON:
        params: dict[str, str | int] = {k: v for k, v in (("name", name), ("state", state), ("limit", limit))
                                        if v is not None}
        return self._json("GET", "/experiments", params=params)

    def get_experiment(self, experiment_id: str) -> JSON:
        with _naming("TuningExperiment", experiment_id):
            return self._json("GET", _path("experiments", experiment_id))

    def cancel_experiment(self, experiment_id: str) -> JSON:
        with _naming("TuningExperiment", experiment_id):
            return self._json("POST", _path("experiments", experiment_id, "cancel"))

    def experiment_chart(self, experiment_id: str, *, kind: str, fmt: str) -> bytes:
        with _naming("TuningExperiment", experiment_id):
            path = _path("experiments", experiment_id, "charts", f"{kind}.{fmt}")
            return self._request("GET", path).content

    def experiment_profile(self, experiment_id: str) -> str:
        """The recommended StorageProfile, as YAML."""
        with _naming("TuningExperiment", experiment_id):
            return self._request("GET", _path("experiments", experiment_id, "profile"),
                                 params={"format": "yaml"}).text


_DRY_RUN: Final = {"dryRun": "All"}


@contextmanager
def _naming(kind: str, name: str) -> Iterator[None]:
    # A name that cannot exist (a/b) misses every route: the server's 404 then says only "Not Found".
    try:
        yield
    except NotFound as exc:
        if name not in exc.message:
            raise NotFound(exc.code, exc.reason, f'{kind} "{name}" not found', exc.causes) from None
        raise


def _path(*parts: str) -> str:
    # Names come from the command line: quoted, so "a/b" or "x?y" stay one path segment.
    return "/" + "/".join(quote(p, safe="") for p in parts)


def _object(response: httpx.Response) -> JSON:
    try:
        data = response.json()
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise ClientError(f"{response.request.method} {response.request.url}: expected a JSON object "
                          f"from the control plane, got {response.headers.get('content-type', 'nothing')}")
    return data


def _selector(selector: str | None) -> dict[str, str | int]:
    return {"labelSelector": selector} if selector else {}
