"""What was in effect during a run: the evidence that makes two results comparable.

Captured at the start (every tunable on the target and the devices beneath
it, host sysctls, topology hash, kernel, versions, the profile generations the
agent had applied) and checked again at the end: a setting that changed while
the benchmark ran is reported as a warning on the result.
"""

from __future__ import annotations

from pathlib import Path

from stortune.agent import local
from stortune.agent.bench.targets import ResolvedTarget
from stortune.agent.kernelfs import KernelFS
from stortune.schemas.bench.results import BeneathDevice, RunContext
from stortune.schemas.topology import HOST_TARGET, Topology

Settings = dict[str, dict[str, int | str | None]]


def settings_of(topology: Topology, devices: list[str]) -> Settings:
    """Supported tunables' values of ``devices`` and the host's sysctls."""
    out: Settings = {}
    for name in devices:
        dev = topology.device(name)
        if dev is not None:
            out[name] = {k: s.value for k, s in sorted(dev.tunables.items()) if s.supported}
    host = {k: s.value for k, s in sorted(topology.host_tunables.items()) if s.supported}
    if host:
        out[HOST_TARGET] = host
    return out


def capture(fs: KernelFS, topology: Topology, target: ResolvedTarget, state_dir: Path, *,
            agent_version: str | None, fio_version: str | None) -> RunContext:
    warnings: list[str] = []
    try:
        desired = local.saved_desired(state_dir)
    except local.AgentError as exc:
        desired = None
        warnings.append(f"applied profiles unknown: {exc}")
    info = local.host_info(fs)
    return RunContext(
        hostname=topology.hostname, kernel=topology.kernel, boot_id=info.get("boot_id") or None,
        agent_version=agent_version, fio_version=fio_version,
        topology_hash=topology.structure_hash(), target=target.info,
        devices=[BeneathDevice(device=b.device, relation=b.relation, above=b.above)
                 for b in target.beneath],
        settings=settings_of(topology, [b.device for b in target.beneath]),
        profiles=dict(desired.generations) if desired else {},
        warnings=warnings + (["the target's device was not found in the topology: no device"
                              " figures"] if not target.beneath else []),
    )


def changed(before: Settings, after: Settings) -> list[str]:
    """Human lines for every value that differs between two captures."""
    lines = []
    for device in sorted(set(before) | set(after)):
        old, new = before.get(device, {}), after.get(device, {})
        for name in sorted(set(old) | set(new)):
            if old.get(name) != new.get(name):
                lines.append(f"{device} {name} changed during the run: {old.get(name)!r} ->"
                             f" {new.get(name)!r}")
    return lines
