"""Idle RSS of `stortune-agent serve` on this machine (target: under 60 MB).

Starts the agent with an empty state directory (nothing to apply, so it only
watches for device changes), lets it settle, samples VmRSS/VmHWM a few times
and stops it: once standalone, once serving the agent API with mutual TLS.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def status(pid: int) -> dict[str, int]:
    out = {}
    for name in ("status", "smaps_rollup"):
        for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM", "Pss", "Shared_Clean"):
                out[key] = int(rest.split()[0])  # kB
    return out


def measure(label: str, extra: list[str]) -> None:
    agent = shutil.which("stortune-agent") or str(Path(sys.executable).parent / "stortune-agent")
    state = tempfile.mkdtemp(prefix="stortune-bench-")
    proc = subprocess.Popen([agent, "serve", "--state-dir", state, "--rescan-interval", "2", *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(4)  # start-up plus one or two rescans
        samples = []
        for _ in range(5):
            samples.append(status(proc.pid))
            time.sleep(1)
        rss = max(s["VmRSS"] for s in samples) / 1024
        hwm = max(s["VmHWM"] for s in samples) / 1024
        pss = max(s["Pss"] for s in samples) / 1024
        shared = max(s["Shared_Clean"] for s in samples) / 1024
        # Judged in decimal MB (the stricter reading of the target).
        print(f"stortune-agent serve, {label}: idle RSS {rss:.1f} MiB = {rss * 1.048576:.1f} MB, "
              f"peak {hwm:.1f} MiB, PSS {pss:.1f} MiB ({shared:.1f} MiB of RSS are shared library pages) "
              f"(target < 60 MB) [{'ok' if rss * 1.048576 < 60 else 'OVER'}]")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(state, ignore_errors=True)


def agent_certificate(directory: Path) -> list[str]:
    """A CA and an agent certificate, as the control plane would issue them: the managed agent
    serves mutual TLS."""
    from stortune.api.agent import tls

    ca = tls.CertificateAuthority.create()
    files = tls.TLSFiles.in_dir(directory, "agent")
    key = tls.new_key()
    files.write(key, ca.sign_agent(tls.make_csr(key, "bench"), "bench"), ca.cert_pem)
    return ["--tls-cert", str(files.cert), "--tls-key", str(files.key), "--tls-ca", str(files.ca)]


def main() -> int:
    measure("standalone (hot-plug watch only)", [])
    certs = Path(tempfile.mkdtemp(prefix="stortune-bench-tls-"))
    try:
        measure("with the gRPC agent API (mutual TLS) on 127.0.0.1",
                ["--listen", "127.0.0.1:0", "--name", "bench", *agent_certificate(certs)])
    finally:
        shutil.rmtree(certs, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
