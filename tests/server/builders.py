"""Documents, topologies and agent calls for the control-plane tests."""

from __future__ import annotations

import copy
from typing import Any

from stortune.api.agent import HOST_KEY_HEADER
from stortune.schemas.topology import Device, DeviceKind, Topology, TunableState

API = "/api/v1"


def host_key(name: str = "h1") -> str:
    """A host key as an agent makes one (43 urlsafe characters), fixed per host name."""
    return f"test-key-of-{name}-".ljust(43, "x")[:43]


def keyed(name: str = "h1") -> dict[str, str]:
    """The header that proves to be host ``name``'s agent."""
    return {HOST_KEY_HEADER: host_key(name)}


def profile_doc(
    name: str = "streaming",
    *,
    selector: dict[str, Any] | None = None,
    settings: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
    priority: int = 0,
    kinds: tuple[str, ...] = ("loop",),
) -> dict[str, Any]:
    return {
        "apiVersion": "stortune/v1",
        "kind": "StorageProfile",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "hostSelector": selector if selector is not None else {"matchLabels": {"role": "streamer"}},
            "priority": priority,
            "rules": [{"name": "loops", "match": {"kind": list(kinds)},
                       "settings": settings or {"read_ahead_kb": 4096}}],
        },
    }


def with_changes(doc: dict[str, Any], **spec: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    out["spec"].update(spec)
    return out


def loop_topology(hostname: str = "h1", read_ahead_kb: int = 128) -> Topology:
    """One scratch loop device, as discovery would report it."""
    loop = Device(
        name="loop0", kind=DeviceKind.LOOP, id="name:loop0", size_bytes=256 << 20, rotational=False,
        tunables={
            "read_ahead_kb": TunableState(supported=True, value=read_ahead_kb, raw=str(read_ahead_kb),
                                          writable=True),
            "scheduler": TunableState(supported=True, value="none", raw="[none] mq-deadline",
                                      writable=True, choices=["none", "mq-deadline"]),
        },
    )
    return Topology(hostname=hostname, kernel="6.1.0", devices=[loop])


def registration(
    name: str = "h1", *, labels: dict[str, str] | None = None, boot_id: str = "boot-1",
    topology: Topology | None = None, topology_hash: str = "",
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name, "address": f"{name}.example:7443", "labels": labels or {"role": "streamer"},
        "facts": {"kernel": "6.1.0", "agent_version": "0.1.0", "boot_id": boot_id},
        "topology_hash": topology_hash,
    }
    if topology is not None:
        body["topology"] = topology.model_dump(mode="json")
    return body
