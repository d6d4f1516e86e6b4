"""What agents send when they register, renew their lease and report their topology."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from stortune.schemas.corrections import CorrectionBatch
from stortune.schemas.endpoint import MAX_LENGTH, USAGE, check_endpoint
from stortune.schemas.topology import Topology
from stortune.server.models.common import Labels, Name, RequestModel

Hash = Annotated[str, Field(max_length=128)]
#: The digest of the values the agent reads now (stortune.api.agent.observed); hex.
ObservedDigest = Annotated[str | None, Field(
    default=None, pattern=r"^[0-9a-f]{32}$",
    description="Digest of the agent's current values (blake2b-128 of GetObserved's observed_json): "
                "when it differs from the last one reported, the control plane looks at the host. "
                "Left out by agents that do not report it; those are asked instead.")]
MAX_EXTRA_FACTS = 64
#: Printable and bounded: it is written into the log and the events (schemas/endpoint.py).
Endpoint = Annotated[str, AfterValidator(check_endpoint),
                     Field(json_schema_extra={"maxLength": MAX_LENGTH, "description": USAGE})]


class AgentFacts(RequestModel):
    """Facts about the host; the named ones are used, any other scalar is kept as reported."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={"additionalProperties": {"type": ["string", "integer", "boolean", "null"]}},
    )

    kernel: str | None = Field(default=None, max_length=256)
    agent_version: str | None = Field(default=None, max_length=64)
    boot_id: str | None = Field(default=None, max_length=64)
    hostname: str | None = Field(default=None, max_length=253)

    @model_validator(mode="after")
    def _extras_are_scalars(self) -> AgentFacts:
        extra = self.model_extra or {}
        if len(extra) > MAX_EXTRA_FACTS:
            raise ValueError(f"{len(extra)} facts besides the named ones; at most {MAX_EXTRA_FACTS}")
        # Floats are refused too: NaN and Infinity are not JSON a database stores.
        for key, value in extra.items():
            if len(key) > 128:
                raise ValueError(f"{key[:32]}...: fact names are at most 128 characters")
            if value is not None and not isinstance(value, str | int | bool):
                raise ValueError(
                    f"{key}: facts are strings, integers or booleans, got {type(value).__name__}")
            if isinstance(value, str) and len(value) > 1024:
                raise ValueError(f"{key}: fact values are at most 1024 characters")
        return self


class Registration(RequestModel):
    name: Name
    address: Endpoint = Field(description="Agent gRPC endpoint, host:port")
    labels: Labels = Field(default_factory=dict)
    facts: AgentFacts = Field(default_factory=AgentFacts)
    topology: Topology | None = Field(default=None, description="Omit when topology_hash is unchanged")
    topology_hash: Hash = ""
    observed_digest: ObservedDigest = None


#: Said in every answer to an agent: send corrections (an older server refuses the field).
AcceptsCorrections = Annotated[bool, Field(
    description="This server records the settings the agent set back on its own: send them with the "
                "heartbeats and watches (`corrections`)")]


class RegistrationAccepted(BaseModel):
    name: str
    heartbeat_interval_s: float
    lease_duration_s: float
    topology_wanted: bool = Field(description="Send it with PUT /agents/{name}/topology")
    accepts_corrections: AcceptsCorrections = True


class Heartbeat(RequestModel):
    topology_hash: Hash = ""
    boot_id: str = Field(default="", max_length=64)
    observed_digest: ObservedDigest = None
    corrections: CorrectionBatch | None = Field(
        default=None, description="Settings the agent set back on its own since the control plane last "
                                  "recorded them; each becomes a Drift and a Corrected event and is counted")


class HeartbeatAccepted(BaseModel):
    lease_expires: datetime
    topology_wanted: bool
    # The fleet's current pace (services/pacing.py): agents follow it from one heartbeat to the next.
    heartbeat_interval_s: float
    lease_duration_s: float
    accepts_corrections: AcceptsCorrections = True
    corrections_recorded: int | None = Field(
        default=None, description="The sent corrections are recorded up to this seq: the agent drops them."
                                  " None: none taken (more batches than the host's rate): send them later")


class WatchAccepted(HeartbeatAccepted):
    """The end of a watch: the lease was kept while it was held; call again at once."""

    watch_s: float = Field(description="How long the server held this call (at most); the next one "
                                       "may be held as long")
    reconnect_after_s: float = Field(
        default=0.0, description="Wait this long before the next watch (a server shutting down spreads "
                                 "its agents' reconnections)")


class TopologyUpload(RequestModel):
    topology: Topology
    topology_hash: Hash = Field(default="", description="Empty: the server hashes the topology")


class TopologyAccepted(BaseModel):
    name: str
    topology_hash: str
    changed: bool


class CertificateRequest(RequestModel):
    """A CSR for the name the agent registers under; the certificate says that name, whatever
    the CSR asks for."""

    name: Name
    csr: str = Field(min_length=64, max_length=16_384, description="PEM certificate signing request")


class CertificateIssued(BaseModel):
    name: str
    certificate: str = Field(description="PEM: the agent's certificate (DNS SAN = name)")
    ca: str = Field(description="PEM: the CA that signed it and the control plane's certificate")
    expires: datetime
