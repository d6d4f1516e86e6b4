"""``stortune-agent diag``: collect, redact by default, and write the bundle and its mapping.

Both files are written 0600: the mapping turns tokens back into serials and
hostnames, and an unredacted bundle holds them in clear.
"""

from __future__ import annotations

import os
from pathlib import Path

from stortune.agent.diagnostics.collect import collect
from stortune.agent.kernelfs import KernelFS
from stortune.agent.local import host_info
from stortune.agent.tools import ToolRunner
from stortune.schemas.bundle import Bundle, pack
from stortune.schemas.redact import RedactionMapping, redact


def write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_TRUNC
        os.write(fd, data)
    finally:
        os.close(fd)


def mapping_path(output: Path) -> Path:
    return output.with_name(f"{output.name}.mapping.json")


def diagnose(fs: KernelFS, tools: ToolRunner, output: Path | None, *,
             redacted: bool = True) -> tuple[Bundle, Path, Path | None]:
    """Collect, redact unless told not to, write; -> (bundle as written, its path, mapping path)."""
    bundle = collect(fs, tools=tools)
    mapping: RedactionMapping | None = None
    if redacted:
        # the boot id is in no file the agent collects, but in what support may hold beside it
        boot_id = host_info(fs).get("boot_id")
        bundle, mapping = redact(bundle, known=[("bootid", boot_id)] if boot_id else [])
    target = output or Path(f"{bundle.root}.tar.gz")
    write_private(target, pack(bundle))
    if mapping is None:
        return bundle, target, None
    write_private(mapping_path(target), mapping.model_dump_json(indent=2).encode() + b"\n")
    return bundle, target, mapping_path(target)


def summary(bundle: Bundle, target: Path, mapping: Path | None) -> list[str]:
    info = bundle.info
    lines = [f"wrote {target}: {len(bundle.files)} files, {len(info.failed)} failed,"
             f" {len(info.missing)} tools not installed (see manifest.json)"]
    lines += [f"  failed: {f.what}: {f.reason}" for f in info.failed]
    lines += [f"  not installed: {m.tool}" for m in info.missing]
    if info.redaction is None:
        lines.append("NOT redacted: hostnames, addresses, serials, WWNs, filesystem UUIDs, labels and"
                     " mountpoints are in clear text")
    else:
        masked = ", ".join(f"{kind} {m.values}" for kind, m in info.redaction.masked.items()) or "nothing"
        lines.append(f"redacted ({masked})")
        lines += [f"  not redacted (binary): {p}" for p in info.redaction.not_redacted]
        lines.append(f"token -> real value mapping: {mapping} (mode 0600): keep it, do not send it")
    return lines
