"""What the benchmark scripts share: a scratch loop device, and a stortune-agent serving its API.

* ``scratch_loop(size)``: a loop device over a file filled with real pages (in /dev/shm when there
  is one, so the device is as fast and as steady as memory and the figures measure the software,
  not a disk), always detached and removed at the end;
* ``serving_agent(workdir)``: ``stortune-agent serve --listen 127.0.0.1:PORT`` with mutual TLS (a
  throwaway CA, an agent certificate and the control plane's client certificate, as
  ``stortune-server`` issues them), and an ``AgentClient`` that talks to it like the control plane.

Root only (loop devices). Everything stays on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from stortune.api.agent import tls
from stortune.server.agentclient import AgentClients, GrpcAgentClient

BIN = Path(sys.executable).parent
TICK = os.sysconf("SC_CLK_TCK")


def require_root_and_fio() -> None:
    if os.geteuid() != 0:
        raise SystemExit("run as root: the benchmark needs a loop device")
    if shutil.which("fio") is None:
        raise SystemExit("fio is not installed (Debian package fio)")


@contextlib.contextmanager
def scratch_loop(size: int) -> Iterator[str]:
    where = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    image = Path(tempfile.mkstemp(prefix="stortune-bench-", suffix=".img", dir=where)[1])
    name = ""
    try:
        subprocess.run(["dd", "if=/dev/zero", f"of={image}", "bs=1M", f"count={size >> 20}", "status=none"],
                       check=True, timeout=120)
        name = Path(subprocess.run(["losetup", "--find", "--show", str(image)], check=True, timeout=30,
                                   capture_output=True, text=True).stdout.strip()).name
        yield name
    finally:
        if name:
            backing = Path(f"/sys/block/{name}/loop/backing_file")
            with contextlib.suppress(OSError):
                if os.path.realpath(backing.read_text().strip()) == os.path.realpath(image):
                    subprocess.run(["losetup", "-d", f"/dev/{name}"], check=False, timeout=30)
        image.unlink(missing_ok=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process's own threads (children, fio included, are not counted)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


@dataclass
class ServingAgent:
    proc: subprocess.Popen[bytes]
    address: str
    state_dir: Path
    client_files: tls.TLSFiles  # the control plane's key, certificate and the agents' CA

    def client(self) -> tuple[AgentClients, GrpcAgentClient]:
        """The agent's client as the control plane has it (close the factory when done)."""
        clients = AgentClients(tls=self.client_files)
        return clients, clients.for_address(self.address, "bench")


@contextlib.contextmanager
def serving_agent(workdir: Path) -> Iterator[ServingAgent]:
    ca = tls.CertificateAuthority.create()
    agent_files = tls.TLSFiles.in_dir(workdir / "agent-tls", "agent")
    key = tls.new_key()
    agent_files.write(key, ca.sign_agent(tls.make_csr(key, "bench"), "bench"), ca.cert_pem)
    pair = ca.issue_control_plane()
    client_files = tls.TLSFiles.in_dir(workdir / "control-plane-tls", "control-plane")
    client_files.write(pair.key_pem, pair.cert_pem, ca.cert_pem)
    port = free_port()
    state = workdir / "agent-state"
    log = (workdir / "agent.log").open("ab")
    proc = subprocess.Popen(
        [str(BIN / "stortune-agent"), "serve", "--listen", f"127.0.0.1:{port}", "--name", "bench",
         "--state-dir", str(state), "--rescan-interval", "30", "--tls-cert", str(agent_files.cert),
         "--tls-key", str(agent_files.key), "--tls-ca", str(agent_files.ca)],
        stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the agent did not start; see {workdir / 'agent.log'}")
            time.sleep(0.1)
        yield ServingAgent(proc, f"127.0.0.1:{port}", state, client_files)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
