"""The one settings object of the control plane."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

DEFAULT_STATE_DIR = Path("/var/lib/stortune-server")
DEFAULT_LISTEN = "127.0.0.1:8080"


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
    reconcile_interval_s: float = Field(default=30, gt=0)
    lease_duration_s: float = Field(default=15, gt=0)
    heartbeat_interval_s: float = Field(default=5, gt=0)

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
