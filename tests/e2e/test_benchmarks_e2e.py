"""Benchmarks end to end with real processes on 127.0.0.1: stortune-server under uvicorn, a
stortune-agent over gRPC (mutual TLS) on this machine's real loop devices, real fio with short
runtimes, driven with the stortune CLI.

A preset runs through server and agent and its results are stored and comparable; a destructive
spec on a device holding a filesystem, and a file target outside the agent's benchmark
directories, are refused with the reason; cancelling mid-run leaves no fio process behind.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.agent.procs import processes_with
from tests.e2e.test_control_plane_e2e import (
    Fleet,
    agent_proc,
    eventually,
    fleet,  # noqa: F401 - the fixture, used by name
)

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed (Debian package fio)"),
]


def spec(tmp: Path, name: str, device: str, workloads: str, *, repeats: int = 1) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(f"""apiVersion: stortune/v1
kind: BenchmarkSpec
metadata: {{name: {name}}}
spec:
  hostSelector: {{matchLabels: {{bench: e2e}}}}
  target: {{device: {{kind: [loop], name: [{device}]}}}}
  allowDestructive: true
  repeats: {repeats}
  workloads: {workloads}
""")
    return path


def queued_id(out: str) -> str:
    line = next(line for line in out.splitlines() if " queued on " in line)
    return line.split()[0].removeprefix("benchmarkrun/")


def run_doc(plane: Fleet, run_id: str) -> dict[str, Any]:
    with plane.api() as c:
        r = c.get(f"/api/v1/benchmarks/runs/{run_id}")
        r.raise_for_status()
        return dict(r.json())


def test_benchmarks_through_server_and_agent(fleet: Fleet,  # noqa: F811 - the fixture imported above
                                             loop_devices: Callable[[int], list[str]],
                                             tmp_path: Path) -> None:
    if shutil.which("mkfs.ext4") is None:
        pytest.skip("mkfs.ext4 is not installed (Debian package e2fsprogs)")
    dev, formatted = loop_devices(2)
    state = tmp_path / "benchhost-state"
    fleet.agents["benchhost"] = agent_proc(fleet, "benchhost", [], "bench=e2e")
    fleet.agents["benchhost"].start()
    eventually("the agent registered", lambda: fleet.condition("benchhost", "Reachable"))

    # -- a preset through server and agent, twice; results stored and comparable ------------------
    seq = spec(tmp_path, "seq", dev, "[{preset: seq-1m, runtime: 1s, size: 16M}]", repeats=2)
    ids = []
    for _ in range(2):
        done = fleet.cli("bench", "run", "-f", str(seq))
        assert done.returncode == 0, done.stdout + done.stderr
        ids.append(queued_id(done.stdout))
    first = run_doc(fleet, ids[0])
    status = first["status"]
    assert status["state"] == "done" and status["context"]["fioVersion"].startswith("fio-")
    result = status["result"]
    read = next(s for s in result["summaries"] if s["step"] == "seq-1m/read")["metrics"]["read_bandwidth"]
    assert read["n"] == 2 and read["mean"] > 0
    ra = int(Path(f"/sys/block/{dev}/queue/read_ahead_kb").read_text())
    assert result["context"]["settings"][dev]["read_ahead_kb"] == ra
    assert all(d["device"] == dev for r in result["runs"] for d in r["devices"])
    with fleet.api() as c:
        raw = c.get(f"/api/v1/benchmarks/runs/{ids[0]}/raw").json()["items"]
    outputs = [f for f in raw if f["path"].endswith("fio.json")]
    assert len(outputs) == 4 and all("jobs" in json.loads(f["text"][f["text"].index("{"):]) for f in outputs)
    # Stored on the control plane, forgotten on the agent.
    eventually("the agent forgot the stored runs",
               lambda: not any((state / "bench" / i).exists() for i in ids))

    compared = fleet.cli("bench", "compare", ids[0], ids[1], "-o", "json")
    assert compared.returncode in (0, 2), compared.stderr  # 2: a regression beyond the noise
    body = json.loads(compared.stdout)
    row = next(r for r in body["rows"] if r["step"] == "seq-1m/read" and r["metric"] == "read_bandwidth")
    assert row["a"]["n"] == row["b"]["n"] == 2 and row["verdict"] in ("better", "worse", "within noise")
    assert (compared.returncode == 2) == (body["summary"]["objectiveWorse"] > 0)
    chart = tmp_path / "threads.svg"
    assert fleet.cli("bench", "plot", ids[0], "-o", str(chart)).returncode == 0
    assert "seq-1m" in chart.read_text()

    # -- a destructive spec on a device holding a filesystem: refused with the reason --------------
    subprocess.run(["mkfs.ext4", "-q", "-F", f"/dev/{formatted}"], check=True, timeout=60)
    unsafe = spec(tmp_path, "unsafe", formatted, "[{preset: seq-1m, runtime: 1s}]")
    refused = fleet.cli("bench", "run", "-f", str(unsafe), "--host", "benchhost")
    assert refused.returncode == 1
    message = run_doc(fleet, queued_id(refused.stdout))["status"]["message"]
    assert message == (f"refused by the agent: refusing to write to /dev/{formatted}: {formatted} holds "
                       "ext4 (filesystem), signature at byte 1080")

    # -- a file target outside the agent's benchmark directories: refused with the reason ---------
    outside = tmp_path / "not-a-bench-dir"
    outside.mkdir()
    file_spec = tmp_path / "file.yaml"
    file_spec.write_text(f"""apiVersion: stortune/v1
kind: BenchmarkSpec
metadata: {{name: file}}
spec:
  hostSelector: {{matchLabels: {{bench: e2e}}}}
  target: {{file: {{path: {outside}/x.dat, size: 4M}}}}
  allowDestructive: true
  workloads: [{{preset: seq-64k, runtime: 1s}}]
""")
    refused = fleet.cli("bench", "run", "-f", str(file_spec), "--host", "benchhost")
    assert refused.returncode == 1
    why = (f"spec.target.file.path '{outside}/x.dat': is not inside a benchmark directory of this host"
           f" ({state}/bench-files); the host decides where benchmark files may be written:"
           " stortune-agent serve --bench-dir DIR")
    assert run_doc(fleet, queued_id(refused.stdout))["status"]["message"] == f"refused by the agent: {why}"
    assert why in refused.stdout + refused.stderr
    assert list(outside.iterdir()) == []

    # -- cancel mid-run: no fio process is left ------------------------------------------------------
    long_read = spec(tmp_path, "long", dev, "[{name: long, pattern: randread, blockSize: 4k, iodepth: 4, "
                                           "numjobs: 2, runtime: 5m}]")
    started = fleet.cli("bench", "run", "--no-wait", "-f", str(long_read), "--host", "benchhost")
    assert started.returncode == 0, started.stderr
    run_id = queued_id(started.stdout)
    where = str(state / "bench" / run_id)
    eventually("fio running", lambda: run_doc(fleet, run_id)["status"]["state"] == "running"
               and processes_with(where))
    eventually("progress reported", lambda: run_doc(fleet, run_id)["status"]["progress"].get("readIops"))
    cancelled = fleet.cli("bench", "cancel", run_id)
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    assert cancelled.stdout.rstrip().endswith("cancelled"), cancelled.stdout
    assert processes_with(where) == []
    assert run_doc(fleet, run_id)["status"]["result"]["state"] == "cancelled"
