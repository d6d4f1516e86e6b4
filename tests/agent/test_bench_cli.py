"""stortune-agent bench: a preset on a real loop device, JSON output, a baseline, and bad input."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def agent(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stortune.agent.cli", *args], capture_output=True,
                          text=True, timeout=300, check=False, cwd=cwd)


def test_an_invalid_spec_names_the_field_and_runs_nothing(tmp_path: Path) -> None:
    spec = tmp_path / "b.yaml"
    spec.write_text("apiVersion: stortune/v1\nkind: BenchmarkSpec\nmetadata: {name: b}\n"
                    "spec: {target: {device: {name: [loop0]}}, workloads: [{preset: iometer-9k}]}\n")
    proc = agent("bench", "-f", str(spec), "--state-dir", str(tmp_path / "state"))
    assert proc.returncode == 1
    assert "spec.workloads[0].preset" in proc.stderr and "iozone-seq" in proc.stderr
    assert not (tmp_path / "state" / "bench").exists()
    proc = agent("bench", "--preset", "seq-1m", "--state-dir", str(tmp_path / "state"))
    assert (proc.returncode, proc.stderr.strip()) == (1, "error: --preset needs --target DEV|FILE")


@pytest.mark.root
@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed (Debian package fio)")
def test_a_preset_on_a_loop_device_prints_results_and_devices(loop_device: str, tmp_path: Path) -> None:
    state = str(tmp_path / "state")
    common = ("--target", loop_device, "--runtime", "1s", "--state-dir", state)
    refused = agent("bench", "--preset", "seq-64k", *common)
    assert refused.returncode == 1 and "allowDestructive is not true" in refused.stderr
    # A relative --state-dir, as the README's walk gives it: fio runs elsewhere, so it is made absolute.
    first = agent("bench", "--preset", "seq-64k", "--allow-destructive", "--target", loop_device,
                  "--runtime", "1s", "--state-dir", "state", "-o", "json", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    result = json.loads(first.stdout)
    assert result["state"] == "done" and [s["step"] for s in result["summaries"]] == [
        "seq-64k/read", "seq-64k/write"]
    baseline = tmp_path / "baseline.json"
    baseline.write_text(first.stdout)
    second = agent("bench", "--preset", "seq-64k", "--allow-destructive", *common,
                   "--baseline", str(baseline))
    assert second.returncode == 0, second.stderr
    out = second.stdout
    assert "seq-64k/read" in out and "devices (from /proc/diskstats)" in out and loop_device in out
    assert f"against {result['run_id']}" in out and "read_bandwidth" in out
    # The noise is the interval a change must leave, as everywhere (not one bound shown as "±").
    assert re.search(r"[-+]\d+\.\d%\.\.\+\d+\.\d%", out) and "±" not in out.split("against")[1]
    assert "stored in" in second.stderr
