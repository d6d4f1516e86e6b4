"""Idle RSS of `stortune-agent serve` (target: under 60 MB).

Three ways the agent runs, each left to settle and then sampled (VmRSS, VmHWM,
PSS) for a while before it is stopped:

* standalone: no desired state, it only watches for device changes;
* serving the agent API with mutual TLS on 127.0.0.1, nobody calling;
* managed, as in production: registered with a `stortune-server` (SQLite, in a
  temp dir) that applied a profile to its devices (a fixture sysfs tree, so
  nothing on this machine is written) and checks it for drift every 5 s over
  mutual TLS, while the agent heartbeats;
* the same with a PERC behind a fake `perccli64` on the agent's tool path, so every
  discovery also asks the controller (`--controller-cache 5`).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

PROFILE = {
    "apiVersion": "stortune/v1", "kind": "StorageProfile", "metadata": {"name": "idle-rss"},
    "spec": {"hostSelector": {"matchLabels": {"bench": "idle-rss"}}, "rules": [
        {"name": "loops", "match": {"kind": ["loop"]},
         "settings": {"read_ahead_kb": 4096, "nr_requests": 64, "scheduler": "mq-deadline"}}]},
}


def status(pid: int) -> dict[str, int]:
    out = {}
    for name in ("status", "smaps_rollup"):
        for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM", "Pss", "Shared_Clean"):
                out[key] = int(rest.split()[0])  # kB
    return out


@contextmanager
def running(args: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def sample(label: str, proc: subprocess.Popen[bytes], settle: float = 4.0, seconds: int = 5) -> None:
    time.sleep(settle)
    if proc.poll() is not None:
        raise SystemExit(f"{label}: the agent exited with {proc.returncode}")
    samples = []
    for _ in range(seconds):
        samples.append(status(proc.pid))
        time.sleep(1)
    rss = max(s["VmRSS"] for s in samples) / 1024
    hwm = max(s["VmHWM"] for s in samples) / 1024
    pss = max(s["Pss"] for s in samples) / 1024
    shared = max(s["Shared_Clean"] for s in samples) / 1024
    # Judged in decimal MB (the stricter reading of the target).
    print(f"stortune-agent serve, {label}: idle RSS {rss:.1f} MiB = {rss * 1.048576:.1f} MB, "
          f"peak {hwm:.1f} MiB, PSS {pss:.1f} MiB ({shared:.1f} MiB of RSS are shared library pages) "
          f"(target < 60 MB) [{'ok' if rss * 1.048576 < 60 else 'OVER'}]", flush=True)


def agent_certificate(directory: Path) -> list[str]:
    """A CA and an agent certificate, as the control plane would issue them: the managed agent
    serves mutual TLS."""
    from stortune.api.agent import tls

    ca = tls.CertificateAuthority.create()
    files = tls.TLSFiles.in_dir(directory, "agent")
    key = tls.new_key()
    files.write(key, ca.sign_agent(tls.make_csr(key, "bench"), "bench"), ca.cert_pem)
    return ["--tls-cert", str(files.cert), "--tls-key", str(files.key), "--tls-ca", str(files.ca)]


def _call(url: str, token: str, body: dict[str, Any] | None = None) -> Any:
    request = urllib.request.Request(  # noqa: S310 - loopback only
        url, data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as resp:  # noqa: S310 - loopback only
        return json.loads(resp.read())


def _ready(base: str, token: str) -> bool:
    try:
        hosts = _call(f"{base}/api/v1/hosts", token)["items"]
    except OSError:
        return False
    return any(h["status"].get("appliedGenerations", {}).get("idle-rss") and any(
        c["type"] == "Ready" and c["status"] == "True" for c in h["status"]["conditions"]) for h in hosts)


def managed(work: Path, *, perc: bool = False) -> None:
    sys.path.insert(0, str(ROOT))
    from bench.fleet import free_port
    from tests.fixtures.sysfs_builder import SysfsBuilder

    b = SysfsBuilder(work / "host", hostname="idle-rss")
    b.loop(0, size=1 << 21, backing_file="/srv/idle-rss/a.img")
    b.loop(1, size=1 << 21, backing_file="/srv/idle-rss/b.img")
    fs = b.finish()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = [str(BIN / "stortune-server"), "--db", f"sqlite:///{work}/cp.db", "--state-dir",
              str(work / "server"), "--listen", f"127.0.0.1:{port}", "--reconcile-interval", "5"]
    with running(server):
        deadline = time.monotonic() + 60
        while not (work / "server/agent-bootstrap.token").exists() or not _up(base):
            if time.monotonic() > deadline:
                raise SystemExit("the control plane did not start")
            time.sleep(0.2)
        token = (work / "server/admin.token").read_text().strip()
        agent = [str(BIN / "stortune-agent"), "serve", "--sysfs", str(fs.sysfs), "--procfs", str(fs.procfs),
                 "--state-dir", str(work / "agent"), "--server", base, "--listen", "127.0.0.1:0",
                 "--token-file", str(work / "server/agent-bootstrap.token"), "--label", "bench=idle-rss"]
        label = "managed (registered, a profile applied, drift checks every 5 s)"
        if perc:
            from tests.fixtures.raid_fakes import fake_megaraid

            fake_megaraid(work / "bin", ("legacy",), name="perccli64")
            agent += ["--tool-path", str(work / "bin"), "--controller-cache", "5"]
            label = "managed, a PERC behind perccli64 asked every 5 s"
        with running(agent) as proc:
            _call(f"{base}/api/v1/profiles", token, PROFILE)
            while not _ready(base, token):
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("the agent did not become Ready with the profile applied")
                time.sleep(0.2)
            sample(label, proc, settle=6, seconds=15)


def _up(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/healthz", timeout=2):  # noqa: S310 - loopback only
            return True
    except OSError:
        return False


def main() -> int:
    agent = str(BIN / "stortune-agent")
    work = Path(tempfile.mkdtemp(prefix="stortune-bench-rss-"))
    try:
        with running([agent, "serve", "--state-dir", str(work / "a"), "--rescan-interval", "2"]) as proc:
            sample("standalone (hot-plug watch only)", proc)
        with running([agent, "serve", "--state-dir", str(work / "b"), "--rescan-interval", "2",
                      "--listen", "127.0.0.1:0", "--name", "bench",
                      *agent_certificate(work / "tls")]) as proc:
            sample("with the gRPC agent API (mutual TLS) on 127.0.0.1", proc)
        managed(work / "managed")
        managed(work / "managed-perc", perc=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
