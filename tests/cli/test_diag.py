"""`stortune diag HOST`: CLI -> REST -> control plane -> gRPC -> a real agent on a fixture PERC
streamer (its tools are scripts printing captured-style output) and back, redacted."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from stortune.agent.discovery import discover
from stortune.agent.serve import Agent, ServeOptions
from tests.agent.test_diagnostics import archive, check_complete, sensitive_values, spellings
from tests.cli.conftest import ControlPlane, Run
from tests.fixtures.diag_hosts import PERC_STREAMER, build

HOST = "stream01"


@pytest.fixture
def streamer(tmp_path: Path, control_plane: ControlPlane) -> Iterator[set[str]]:
    """The streamer's agent serving on loopback and registered; -> its sensitive values."""
    fs, bin_dir = build(PERC_STREAMER, tmp_path / "host")
    agent = Agent(fs, tmp_path / "agent-state",
                  ServeOptions(listen="127.0.0.1:0", rescan_interval=3600, grace=1, tool_path=str(bin_dir),
                               insecure=True))
    agent.start()
    try:
        topology = discover(fs)
        with control_plane.http() as http:
            registered = http.post("/agents/register", json={
                "name": HOST, "address": agent.address, "labels": {"role": "streamer"},
                "facts": {"kernel": "6.1.0"}, "topology": topology.model_dump(mode="json"),
                "topology_hash": topology.structure_hash()})
            assert registered.status_code == 200, registered.text
        yield sensitive_values(PERC_STREAMER, topology) | {HOST}
    finally:
        agent.stop()


def test_support_downloads_a_redacted_bundle(stortune: Run, control_plane: ControlPlane, streamer: set[str],
                                             tmp_path: Path) -> None:
    support = control_plane.issue("support", hosts="role=streamer", expires_in="72h")
    target = tmp_path / "bundle.tar.gz"

    got = stortune("diag", HOST, "-o", str(target), token=support)

    assert got.code == 0, got.err
    assert f"{target}: diagnostics of {HOST}" in got.out and "redacted" in got.out
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    data = target.read_bytes()
    manifest = check_complete(data)
    assert any(c["path"] == "control-plane/settings.json" for c in manifest["collected"])
    assert any(c["path"].startswith("commands/perccli") for c in manifest["collected"])
    text = "\n".join(f"{n}\n{b.decode('utf-8', 'replace')}" for n, b in archive(data).items()).lower()
    assert [v for v in streamer if any(form in text for form in spellings(v))] == []


def test_no_redact_is_for_admins_only(stortune: Run, control_plane: ControlPlane, streamer: set[str],
                                      tmp_path: Path) -> None:
    support = control_plane.issue("support", hosts="role=streamer", expires_in="72h")
    refused = stortune("diag", HOST, "--no-redact", "-o", str(tmp_path / "x.tar.gz"), token=support)
    assert refused.code == 1 and "forbidden" in refused.err
    assert not (tmp_path / "x.tar.gz").exists()

    clear = stortune("diag", HOST, "--no-redact", "-o", str(tmp_path / "clear.tar.gz"))
    assert clear.code == 0 and "not redacted" in clear.out
    assert HOST.encode() in b"".join(archive((tmp_path / "clear.tar.gz").read_bytes()).values())


def test_an_unknown_host_says_so(stortune: Run, control_plane: ControlPlane, tmp_path: Path) -> None:
    missing = stortune("diag", "nowhere", "-o", str(tmp_path / "n.tar.gz"))
    assert missing.code == 1 and '"nowhere" not found' in missing.err
