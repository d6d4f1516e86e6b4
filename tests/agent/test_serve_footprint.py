"""What a serving agent holds while idle: the benchmark machinery and YAML only once asked for.

The idle agent's memory target (bench/agent_idle_rss.py) depends on it, and a
stray top-level import would undo it silently. A run a dead agent left behind
is still concluded at start, without waiting for a benchmark call.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from stortune.agent.bench.store import RunStore
from stortune.agent.serve import Agent, ServeOptions
from tests.fixtures.agent_host import build_host

ROOT = Path(__file__).resolve().parents[2]

_SERVE_AND_LIST_MODULES = """
import json, sys, tempfile
from pathlib import Path
from stortune.agent import cli
from stortune.agent.serve import Agent, ServeOptions
from tests.fixtures.agent_host import build_host

cli.build_parser()  # what `stortune-agent serve` builds first
work = Path(tempfile.mkdtemp(dir=sys.argv[1]))
host = build_host(work / "host")
agent = Agent(host.fs, work / "state",
              ServeOptions(listen="127.0.0.1:0", rescan_interval=3600, grace=1, insecure=True))
agent.start()
agent.stop()
print(json.dumps(sorted(sys.modules)))
"""

#: Loaded on the first benchmark call, or by the CLI's YAML input and output; never while idle.
#: Tuning experiments run in the one-shot CLI (`stortune-agent tune`) or on the control
#: plane, never in the daemon: neither the engine nor Optuna.
ON_DEMAND = ("yaml", "stortune.agent.bench.manager", "stortune.agent.bench.cli",
             "stortune.schemas.bench.spec", "stortune.schemas.bench.results",
             "stortune.agent.diagnostics", "cryptography", "optuna", "stortune.schemas.tuning",
             "stortune.agent.tune", "stortune.agent.tune_cli",
             # Metrics are the control plane's (server/stortune/server/metrics), never the daemon's.
             "prometheus_client",
             # The parser's bench arguments need the preset names and --bench-dir's check, not
             # the step models, the preset expansions or the file-target machinery.
             "stortune.schemas.bench.presets", "stortune.schemas.bench.steps", "stortune.agent.bench.files")


def test_an_idle_serving_agent_holds_no_benchmark_diagnostics_or_yaml_code(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", _SERVE_AND_LIST_MODULES, str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=True).stdout
    loaded = set(json.loads(out))
    assert "grpc" in loaded and "stortune.agent.rpc" in loaded  # it did serve
    assert sorted(m for m in ON_DEMAND if m in loaded) == []


_SERVE_MTLS_COUNTING_CONTEXTS = """
import ssl, sys, tempfile
from pathlib import Path
made = []
real_new = ssl.SSLContext.__new__
def counted(cls, *args, **kwargs):
    made.append(cls)
    return real_new(cls, *args, **kwargs)
ssl.SSLContext.__new__ = counted
from stortune.agent.serve import Agent, ServeOptions
from stortune.api.agent.tlsfiles import TLSFiles
from tests.fixtures.agent_host import build_host

work = Path(tempfile.mkdtemp(dir=sys.argv[1]))
agent = Agent(build_host(work / "host").fs, work / "state",
              ServeOptions(listen="127.0.0.1:0", rescan_interval=3600, grace=1, name="h1",
                           tls_files=TLSFiles.in_dir(Path(sys.argv[2]), "agent")))
agent.start()
agent.stop()
print(len(made))
"""


def test_an_agent_serving_mutual_tls_checks_its_files_without_keeping_openssl_state(tmp_path: Path) -> None:
    from stortune.api.agent import tls

    ca = tls.CertificateAuthority.create()
    key = tls.new_key()
    tls.TLSFiles.in_dir(tmp_path / "tls", "agent").write(key, ca.sign_agent(tls.make_csr(key, "h1"), "h1"),
                                                         ca.cert_pem)
    out = subprocess.run([sys.executable, "-c", _SERVE_MTLS_COUNTING_CONTEXTS, str(tmp_path),
                          str(tmp_path / "tls")], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         check=True).stdout
    assert out.strip() == "0", "the pair is checked by a child process (stortune.agent.tlscheck)"
    (bad := tmp_path / "bad").mkdir()
    for name in ("agent.crt", "ca.crt"):
        (bad / name).write_bytes((tmp_path / "tls" / name).read_bytes())
    (bad / "agent.key").write_bytes(tls.new_key())
    failed = subprocess.run([sys.executable, "-c", _SERVE_MTLS_COUNTING_CONTEXTS, str(tmp_path), str(bad)],
                            cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert failed.returncode != 0 and "does not belong to the key" in failed.stderr


def test_a_run_a_dead_agent_left_unfinished_is_concluded_when_serving_starts(tmp_path: Path) -> None:
    host = build_host(tmp_path / "host")
    state = tmp_path / "state"
    store = RunStore(state)
    store.create("crashed", {"apiVersion": "stortune/v1", "kind": "BenchmarkSpec",
                             "metadata": {"name": "before-the-crash"}, "spec": {}})
    assert store.unfinished() == ["crashed"]
    agent = Agent(host.fs, state, ServeOptions(listen="127.0.0.1:0", rescan_interval=3600, grace=1,
                                               insecure=True))
    agent.start()
    try:
        result = store.read_result("crashed")  # no benchmark call was needed
        assert result is not None and result.state == "failed" and result.name == "before-the-crash"
        assert store.unfinished() == []
    finally:
        agent.stop()
