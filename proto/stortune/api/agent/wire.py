"""Conversions between the agent API's wire messages and stortune's domain models.

This is the only module that imports the generated protobuf/gRPC code
(``stortune.api.agent.v1``); the agent's servicer (``stortune.agent.rpc``) and
the control plane's client (``stortune.server.agentclient``) go through it, so
a regenerated stub or a new field changes one file.

Documents travel as JSON of the pydantic models in ``stortune.schemas``.
Decoding validates them here, so a malformed message fails at the boundary
with the field it came in (``WireError``, or ``DocumentError`` for profiles,
whose messages carry the field path inside the document).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Final, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from stortune.api.agent import observed as observed_values
from stortune.api.agent.v1 import agent_pb2 as pb
from stortune.api.agent.v1 import agent_pb2_grpc as pb_grpc
from stortune.schemas import catalog
from stortune.schemas.documents import DocumentError, Problem, duplicate_names, parse_profile
from stortune.schemas.plan import Plan
from stortune.schemas.profile import StorageProfile
from stortune.schemas.topology import Topology, TunableState

if TYPE_CHECKING:
    import grpc
    import grpc.aio

    # Imported where a benchmark message is decoded: an idle agent does not hold these models.
    from stortune.schemas.analysis.probe import ProbeResult
    from stortune.schemas.bench.results import BenchmarkResult
    from stortune.schemas.bench.spec import BenchmarkSpec

# -- generated names the servicer and the client need -------------------------
AgentServiceServicer = pb_grpc.AgentServiceServicer
AgentServiceStub = pb_grpc.AgentServiceStub
add_AgentServiceServicer_to_server = pb_grpc.add_AgentServiceServicer_to_server
SERVICE_NAME: Final[str] = pb.DESCRIPTOR.services_by_name["AgentService"].full_name


def add_servicer(servicer: pb_grpc.AgentServiceServicer, server: grpc.Server) -> None:
    """Register an AgentService implementation on a (sync) grpc server."""
    pb_grpc.add_AgentServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]


def agent_stub(channel: grpc.Channel | grpc.aio.Channel) -> Any:
    """The generated client stub; its methods take and return the message classes below."""
    return pb_grpc.AgentServiceStub(channel)  # type: ignore[no-untyped-call]

# Message classes, for annotations in rpc.py and agentclient.py; their fields
# are read and written only below.
HostInfoMessage = pb.HostInfo
GetTopologyRequest = pb.GetTopologyRequest
GetTopologyResponse = pb.GetTopologyResponse
GetObservedRequest = pb.GetObservedRequest
GetObservedResponse = pb.GetObservedResponse
PlanRequest = pb.PlanRequest
PlanResponse = pb.PlanResponse
ApplyRequest = pb.ApplyRequest
ApplyResponse = pb.ApplyResponse
RestoreRequest = pb.RestoreRequest
RestoreResponse = pb.RestoreResponse
WatchBenchmarkRequest = pb.WatchBenchmarkRequest
BenchmarkProgressMessage = pb.BenchmarkProgress
StartBenchmarkRequest = pb.StartBenchmarkRequest
StartBenchmarkResponse = pb.StartBenchmarkResponse
CancelBenchmarkRequest = pb.CancelBenchmarkRequest
CancelBenchmarkResponse = pb.CancelBenchmarkResponse
GetBenchmarkResultRequest = pb.GetBenchmarkResultRequest
GetBenchmarkResultResponse = pb.GetBenchmarkResultResponse
StartProbeRequest = pb.StartProbeRequest
StartProbeResponse = pb.StartProbeResponse
GetProbeResultRequest = pb.GetProbeResultRequest
GetProbeResultResponse = pb.GetProbeResultResponse
ForgetBenchmarkRequest = pb.ForgetBenchmarkRequest
ForgetBenchmarkResponse = pb.ForgetBenchmarkResponse
CollectDiagnosticsRequest = pb.CollectDiagnosticsRequest
DiagnosticsChunkMessage = pb.DiagnosticsChunk

# -- domain side ---------------------------------------------------------------
#: {device name (or "host"): {tunable: state}}
Observed = dict[str, dict[str, TunableState]]
#: (device_id, tunable): what Restore can be limited to.
SettingKey = tuple[str, str]

BENCHMARK_STATES: Final = ("queued", "running", "done", "failed", "cancelled")
TERMINAL_BENCHMARK_STATES: Final = frozenset({"done", "failed", "cancelled"})

_OBSERVED: Final = TypeAdapter(Observed)
_M = TypeVar("_M", bound=BaseModel)


class WireError(ValueError):
    """A message whose content cannot be decoded; names the field."""


@dataclass(frozen=True)
class HostInfo:
    hostname: str
    kernel: str
    boot_id: str
    agent_version: str = ""
    agent_started_unix: int = 0


@dataclass(frozen=True)
class ApplyResult:
    ok: bool
    #: The agent's report (title, ok, rows, messages) as JSON data.
    report: dict[str, Any]
    #: Planned again after the apply: in sync unless ``ok`` is false or audit
    #: profiles report differences; rejections say what was skipped.
    plan: Plan
    #: profile name -> generation now implemented; empty when ``ok`` is false.
    applied_generations: dict[str, int]
    info: HostInfo
    request_id: str
    topology_hash: str
    #: The values after the apply (None from an agent older than this field).
    observation: Observation | None = None


@dataclass(frozen=True)
class RestoreResult:
    ok: bool
    report: dict[str, Any]
    info: HostInfo


@dataclass(frozen=True)
class BenchmarkProgress:
    run_id: str
    #: One of BENCHMARK_STATES; the agent checks it when publishing, a client
    #: keeps whatever a newer agent sends.
    state: str
    percent: float = 0.0
    read_bytes_per_s: float = 0.0
    write_bytes_per_s: float = 0.0
    read_iops: float = 0.0
    write_iops: float = 0.0
    eta_seconds: int = 0
    message: str = ""

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_BENCHMARK_STATES


@dataclass(frozen=True)
class BenchmarkOutcome:
    """What GetBenchmarkResult answers: the state, and once the run ended, its result."""

    progress: BenchmarkProgress
    result: BenchmarkResult | None
    #: fio's own files per step run, by path relative to the run (job.fio, fio.json, stderr.txt).
    raw_files: dict[str, str]
    info: HostInfo


# -- documents -------------------------------------------------------------------
def profile_to_json(profile: StorageProfile) -> str:
    return json.dumps(profile.document(), separators=(",", ":"))


def profiles_from_json(docs: Sequence[str], field: str = "profiles_json") -> list[StorageProfile]:
    """Validate every profile; all problems at once, each naming ``field[i]`` and the path inside."""
    profiles: list[StorageProfile] = []
    problems: list[Problem] = []
    for index, text in enumerate(docs):
        where = f"{field}[{index}]"
        try:
            data = json.loads(text)
        except ValueError as exc:
            problems.append(Problem(where, "", f"not valid JSON: {exc}"))
            continue
        try:
            profiles.append(parse_profile(data, where))
        except DocumentError as exc:
            problems.extend(exc.problems)
    problems.extend(duplicate_names(profiles, field))
    if problems:
        raise DocumentError(problems)
    return profiles


def _model_json(model: BaseModel) -> str:
    return model.model_dump_json()


def _decode(cls: type[_M], text: str, field: str) -> _M:
    try:
        return cls.model_validate_json(text)
    except ValidationError as exc:
        raise WireError(f"{field}: not a valid {cls.__name__}: {_first_error(exc)}") from None


def _first_error(exc: ValidationError) -> str:
    err = exc.errors(include_url=False)[0]
    loc = ".".join(str(p) for p in err["loc"])
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{loc}: {err['msg']}{more}" if loc else f"{err['msg']}{more}"


def _json_object(text: str, field: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise WireError(f"{field}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise WireError(f"{field}: expected a JSON object, got {type(data).__name__}")
    return data


# -- host info -------------------------------------------------------------------
def host_message(info: HostInfo) -> pb.HostInfo:
    return pb.HostInfo(hostname=info.hostname, kernel=info.kernel, boot_id=info.boot_id,
                       agent_version=info.agent_version,
                       agent_started_unix=info.agent_started_unix)


def host_from(msg: pb.HostInfo) -> HostInfo:
    return HostInfo(hostname=msg.hostname, kernel=msg.kernel, boot_id=msg.boot_id,
                    agent_version=msg.agent_version, agent_started_unix=msg.agent_started_unix)


# -- GetTopology -----------------------------------------------------------------
def topology_request() -> pb.GetTopologyRequest:
    return pb.GetTopologyRequest()


def topology_response(info: HostInfo, topology: Topology, topology_hash: str) -> pb.GetTopologyResponse:
    return pb.GetTopologyResponse(host=host_message(info), topology_json=_model_json(topology),
                                  topology_hash=topology_hash)


def topology_from(msg: pb.GetTopologyResponse) -> tuple[HostInfo, Topology, str]:
    return (host_from(msg.host), _decode(Topology, msg.topology_json, "topology_json"),
            msg.topology_hash)


# -- GetObserved -----------------------------------------------------------------
def observed_request() -> pb.GetObservedRequest:
    return pb.GetObservedRequest()


@dataclass(frozen=True)
class Observation:
    """GetObserved's answer, its values decoded on first use.

    ``digest`` hashes the values exactly as the agent encoded them: an unchanged
    digest is an unchanged set of values, which the control plane's drift check
    can tell without decoding and planning them again.
    """

    info: HostInfo
    topology_hash: str
    encoded: str = field(repr=False)
    digest: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "digest", observed_values.digest(self.encoded))

    @classmethod
    def of(cls, info: HostInfo, observed: Mapping[str, Mapping[str, TunableState]],
           topology_hash: str) -> Observation:
        return cls(info, topology_hash, observed_values.encode(observed))

    @cached_property
    def observed(self) -> Observed:
        """{device: {tunable: state}}; WireError when the agent sent something else."""
        try:
            return _OBSERVED.validate_json(self.encoded)
        except ValidationError as exc:
            raise WireError(f"observed_json: not a valid observed map: {_first_error(exc)}") from None


def observed_response(info: HostInfo, observed: Mapping[str, Mapping[str, TunableState]],
                      topology_hash: str) -> pb.GetObservedResponse:
    return pb.GetObservedResponse(host=host_message(info), observed_json=observed_values.encode(observed),
                                  topology_hash=topology_hash)


def observation_from(msg: pb.GetObservedResponse) -> Observation:
    """The answer as it came; its values are checked when first read (``Observation.observed``)."""
    return Observation(host_from(msg.host), msg.topology_hash, msg.observed_json)


# -- Plan ------------------------------------------------------------------------
def plan_request(profiles: Iterable[StorageProfile]) -> pb.PlanRequest:
    return pb.PlanRequest(profiles_json=[profile_to_json(p) for p in profiles])


def plan_request_profiles(msg: pb.PlanRequest) -> list[StorageProfile]:
    return profiles_from_json(list(msg.profiles_json))


def plan_response(info: HostInfo, plan: Plan, topology_hash: str) -> pb.PlanResponse:
    return pb.PlanResponse(host=host_message(info), plan_json=_model_json(plan),
                           topology_hash=topology_hash)


def plan_from(msg: pb.PlanResponse) -> tuple[HostInfo, Plan, str]:
    return host_from(msg.host), _decode(Plan, msg.plan_json, "plan_json"), msg.topology_hash


# -- Apply -----------------------------------------------------------------------
def apply_request(profiles: Iterable[StorageProfile], generations: Mapping[str, int],
                  request_id: str, *, ram_share: float | None = None) -> pb.ApplyRequest:
    """``ram_share``: the control plane's stripe-cache share of RAM (None: sent as unset)."""
    return pb.ApplyRequest(profiles_json=[profile_to_json(p) for p in profiles],
                           generations=dict(generations), request_id=request_id,
                           stripe_cache_ram_share=ram_share)


@dataclass(frozen=True)
class ApplyCall:
    """An ApplyRequest decoded on the agent."""

    profiles: list[StorageProfile]
    generations: dict[str, int]
    request_id: str
    #: The control plane's stripe-cache share of RAM; None from one that sends none (older).
    ram_share: float | None = None


def apply_call(msg: pb.ApplyRequest) -> ApplyCall:
    profiles = profiles_from_json(list(msg.profiles_json))
    names = {p.metadata.name for p in profiles}
    unknown = sorted(set(msg.generations) - names)
    if unknown:
        raise DocumentError([Problem("generations", name, "no profile of this name in profiles_json")
                             for name in unknown])
    return ApplyCall(profiles, dict(msg.generations), msg.request_id, _ram_share(msg))


def _ram_share(msg: pb.ApplyRequest) -> float | None:
    if not msg.HasField("stripe_cache_ram_share"):
        return None
    share = msg.stripe_cache_ram_share
    if not 0 < share <= 1:  # NaN fails too
        raise WireError(f"stripe_cache_ram_share: {share!r} is not a share of the host's RAM: give a"
                        " fraction more than 0 and at most 1, or leave it unset for the agent's own")
    return share


def apply_response(*, info: HostInfo, ok: bool, report: BaseModel, plan: Plan,
                   applied_generations: Mapping[str, int], request_id: str,
                   topology_hash: str,
                   observed: Mapping[str, Mapping[str, TunableState]] | None = None) -> pb.ApplyResponse:
    return pb.ApplyResponse(ok=ok, report_json=_model_json(report), plan_json=_model_json(plan),
                            applied_generations=dict(applied_generations), host=host_message(info),
                            request_id=request_id, topology_hash=topology_hash,
                            observed_json="" if observed is None else observed_values.encode(observed))


def apply_from(msg: pb.ApplyResponse) -> ApplyResult:
    info = host_from(msg.host)
    return ApplyResult(
        ok=msg.ok, report=_json_object(msg.report_json, "report_json"),
        plan=_decode(Plan, msg.plan_json, "plan_json"),
        applied_generations=dict(msg.applied_generations), info=info,
        request_id=msg.request_id, topology_hash=msg.topology_hash,
        observation=Observation(info, msg.topology_hash, msg.observed_json) if msg.observed_json else None,
    )


# -- Restore ---------------------------------------------------------------------
def restore_request(only: Collection[SettingKey] | None = None) -> pb.RestoreRequest:
    keys = [pb.SettingKey(device_id=d, tunable=t) for d, t in sorted(only or ())]
    if only is not None and not keys:
        # An empty list on the wire means "everything": refuse rather than widen the request.
        raise ValueError("restore(only=...) needs at least one key; pass None to restore everything")
    return pb.RestoreRequest(only=keys)


#: Longest device id accepted: a loop device's id carries its backing file's path (PATH_MAX).
MAX_DEVICE_ID = 4200


def restore_keys(msg: pb.RestoreRequest,
                 device_known: Callable[[str], bool] | None = None) -> set[SettingKey] | None:
    """None: restore every recorded original. Each key must name a tunable of the catalog and a
    device id ``device_known`` accepts (on the agent: a device there, or one with an original)."""
    keys: set[SettingKey] = set()
    for index, key in enumerate(msg.only):
        where = f"only[{index}]"
        if not key.device_id or not key.tunable:
            raise WireError(f"{where}: device_id and tunable are both required")
        if key.tunable not in catalog.CATALOG:
            raise WireError(f"{where}.tunable: {_shown(key.tunable)} is not a tunable of the catalog;"
                            f" known: {', '.join(sorted(catalog.CATALOG))}")
        if len(key.device_id) > MAX_DEVICE_ID or not key.device_id.isprintable():
            raise WireError(f"{where}.device_id: {_shown(key.device_id)} is not a device id (printable"
                            f" text of at most {MAX_DEVICE_ID} characters, such as wwn:... or"
                            " loop:/path)")
        if device_known is not None and not device_known(key.device_id):
            raise WireError(f"{where}.device_id: no device {_shown(key.device_id)} on this host, and no"
                            " recorded original for it")
        keys.add((key.device_id, key.tunable))
    return keys or None


def _shown(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def restore_response(info: HostInfo, ok: bool, report: BaseModel) -> pb.RestoreResponse:
    return pb.RestoreResponse(ok=ok, report_json=_model_json(report), host=host_message(info))


def restore_from(msg: pb.RestoreResponse) -> RestoreResult:
    return RestoreResult(ok=msg.ok, report=_json_object(msg.report_json, "report_json"),
                         info=host_from(msg.host))


# -- WatchBenchmark --------------------------------------------------------------
def watch_request(run_id: str) -> pb.WatchBenchmarkRequest:
    return pb.WatchBenchmarkRequest(run_id=run_id)


def _required(value: str, field: str) -> str:
    """An id field the call cannot do without (proto3 sends a missing string as '')."""
    if not value:
        raise WireError(f"{field}: required")
    return value


def watch_run_id(msg: pb.WatchBenchmarkRequest) -> str:
    return _required(msg.run_id, "run_id")


def progress_message(progress: BenchmarkProgress) -> pb.BenchmarkProgress:
    return pb.BenchmarkProgress(
        run_id=progress.run_id, state=progress.state, percent=progress.percent,
        read_bytes_per_s=progress.read_bytes_per_s, write_bytes_per_s=progress.write_bytes_per_s,
        read_iops=progress.read_iops, write_iops=progress.write_iops,
        eta_seconds=progress.eta_seconds, message=progress.message,
    )


def progress_from(msg: pb.BenchmarkProgress) -> BenchmarkProgress:
    return BenchmarkProgress(
        run_id=msg.run_id, state=msg.state, percent=msg.percent,
        read_bytes_per_s=msg.read_bytes_per_s, write_bytes_per_s=msg.write_bytes_per_s,
        read_iops=msg.read_iops, write_iops=msg.write_iops, eta_seconds=msg.eta_seconds,
        message=msg.message,
    )


# -- StartBenchmark / CancelBenchmark / GetBenchmarkResult / ForgetBenchmark -------------
def _run_id(msg: Any) -> str:
    return _required(str(msg.run_id), "run_id")


def start_request(run_id: str, spec: BenchmarkSpec) -> pb.StartBenchmarkRequest:
    return pb.StartBenchmarkRequest(run_id=run_id,
                                    spec_json=json.dumps(spec.document(), separators=(",", ":")))


def start_call(msg: pb.StartBenchmarkRequest) -> tuple[str, BenchmarkSpec]:
    """(run id, spec); a DocumentError names ``spec_json`` and the path inside the spec."""
    from stortune.schemas.bench.spec import parse_benchmark

    run_id = _run_id(msg)
    try:
        data = json.loads(msg.spec_json)
    except ValueError as exc:
        raise DocumentError([Problem("spec_json", "", f"not valid JSON: {exc}")]) from None
    return run_id, parse_benchmark(data, "spec_json")


def start_response(info: HostInfo, progress: BenchmarkProgress) -> pb.StartBenchmarkResponse:
    return pb.StartBenchmarkResponse(host=host_message(info), run_id=progress.run_id,
                                     progress=progress_message(progress))


def start_from(msg: pb.StartBenchmarkResponse) -> tuple[HostInfo, BenchmarkProgress]:
    return host_from(msg.host), progress_from(msg.progress)


def cancel_request(run_id: str) -> pb.CancelBenchmarkRequest:
    return pb.CancelBenchmarkRequest(run_id=run_id)


def cancel_run_id(msg: pb.CancelBenchmarkRequest) -> str:
    return _run_id(msg)


def cancel_response(cancelled: bool, progress: BenchmarkProgress) -> pb.CancelBenchmarkResponse:
    return pb.CancelBenchmarkResponse(run_id=progress.run_id, cancelled=cancelled,
                                      progress=progress_message(progress))


def cancel_from(msg: pb.CancelBenchmarkResponse) -> tuple[bool, BenchmarkProgress]:
    return msg.cancelled, progress_from(msg.progress)


def result_request(run_id: str) -> pb.GetBenchmarkResultRequest:
    return pb.GetBenchmarkResultRequest(run_id=run_id)


def result_run_id(msg: pb.GetBenchmarkResultRequest) -> str:
    return _run_id(msg)


def result_response(outcome: BenchmarkOutcome) -> pb.GetBenchmarkResultResponse:
    return pb.GetBenchmarkResultResponse(
        host=host_message(outcome.info), progress=progress_message(outcome.progress),
        result_json=outcome.result.model_dump_json() if outcome.result is not None else "",
        raw_files=outcome.raw_files)


def result_from(msg: pb.GetBenchmarkResultResponse) -> BenchmarkOutcome:
    from stortune.schemas.bench.results import BenchmarkResult

    result = _decode(BenchmarkResult, msg.result_json, "result_json") if msg.result_json else None
    return BenchmarkOutcome(progress=progress_from(msg.progress), result=result,
                            raw_files=dict(msg.raw_files), info=host_from(msg.host))


def forget_request(run_id: str) -> pb.ForgetBenchmarkRequest:
    return pb.ForgetBenchmarkRequest(run_id=run_id)


def forget_run_id(msg: pb.ForgetBenchmarkRequest) -> str:
    return _run_id(msg)


def forget_response(forgotten: bool) -> pb.ForgetBenchmarkResponse:
    return pb.ForgetBenchmarkResponse(forgotten=forgotten)


def forget_from(msg: pb.ForgetBenchmarkResponse) -> bool:
    return bool(msg.forgotten)


# -- StartProbe / GetProbeResult ------------------------------------------------------
def probe_request(probe_id: str, device: str | None) -> pb.StartProbeRequest:
    return pb.StartProbeRequest(probe_id=probe_id, device=device or "")


def probe_call(msg: pb.StartProbeRequest) -> tuple[str, str | None]:
    """(probe id, device or None for every disk); the agent checks the device itself."""
    return _required(msg.probe_id, "probe_id"), msg.device or None


def probe_response(info: HostInfo, progress: BenchmarkProgress) -> pb.StartProbeResponse:
    return pb.StartProbeResponse(host=host_message(info), progress=progress_message(progress))


def probe_from(msg: pb.StartProbeResponse) -> tuple[HostInfo, BenchmarkProgress]:
    return host_from(msg.host), progress_from(msg.progress)


def probe_result_request(probe_id: str) -> pb.GetProbeResultRequest:
    return pb.GetProbeResultRequest(probe_id=probe_id)


def probe_result_id(msg: pb.GetProbeResultRequest) -> str:
    return _required(msg.probe_id, "probe_id")


def probe_result_response(info: HostInfo, progress: BenchmarkProgress,
                          result: ProbeResult | None) -> pb.GetProbeResultResponse:
    return pb.GetProbeResultResponse(
        host=host_message(info), progress=progress_message(progress),
        result_json=result.model_dump_json() if result is not None else "")


def probe_result_from(msg: pb.GetProbeResultResponse) -> tuple[BenchmarkProgress, ProbeResult | None]:
    from stortune.schemas.analysis.probe import ProbeResult

    result = _decode(ProbeResult, msg.result_json, "result_json") if msg.result_json else None
    return progress_from(msg.progress), result


# -- CollectDiagnostics ----------------------------------------------------------------
#: Well under gRPC's default 4 MiB message limit.
DIAGNOSTICS_CHUNK = 1 << 20


def diagnostics_request(command_timeout_s: float = 0.0) -> pb.CollectDiagnosticsRequest:
    return pb.CollectDiagnosticsRequest(command_timeout_s=command_timeout_s)


def diagnostics_timeout(msg: pb.CollectDiagnosticsRequest) -> float | None:
    """The per-command timeout asked for, or None for the agent's default."""
    if msg.command_timeout_s < 0:
        raise WireError("command_timeout_s: must not be negative")
    return msg.command_timeout_s or None


def diagnostics_chunks(data: bytes) -> Iterable[pb.DiagnosticsChunk]:
    for start in range(0, max(len(data), 1), DIAGNOSTICS_CHUNK):
        yield pb.DiagnosticsChunk(data=data[start:start + DIAGNOSTICS_CHUNK])


def diagnostics_data(msg: pb.DiagnosticsChunk) -> bytes:
    return bytes(msg.data)
