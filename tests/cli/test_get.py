"""get, describe and label; output formats; terminal versus pipe; how the server is chosen."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from stortune.cli import render
from stortune.cli.client import Host, Profile
from stortune.cli.main import main
from tests.cli.conftest import ControlPlane, Run, profile_yaml


@pytest.fixture
def fleet(stortune: Run, control_plane: ControlPlane, tmp_path: Path) -> ControlPlane:
    control_plane.register("web-1", {"role": "streamer", "zone": "a"})
    control_plane.register("db-1", {"role": "database"}, topology=False)
    path = tmp_path / "profiles.yaml"
    path.write_text(profile_yaml("vod") + "---\n" + profile_yaml(
        "oltp", selector="{matchLabels: {role: database}}", labels="{tier: gold}"))
    assert stortune("apply", "-f", str(path)).code == 0
    return control_plane


def condition(control_plane: ControlPlane, host: str, type: str) -> dict[str, str]:
    """What the server says (the reconciler decides what, and may move it on as it learns)."""
    with control_plane.http() as http:
        found: dict[str, str] = next(c for c in http.get(f"/hosts/{host}").json()["status"]["conditions"]
                                     if c["type"] == type)
        return found


def test_get_hosts_table_json_yaml_and_name(stortune: Run, fleet: ControlPlane) -> None:
    table = stortune("get", "hosts")
    assert table.code == 0
    header, *rows = table.out.splitlines()
    assert header.split() == ["NAME", "READY", "REACHABLE", "APPLIED", "DRIFTED", "LABELS", "ADDRESS", "AGE"]
    assert [r.split()[0] for r in rows] == ["db-1", "web-1"]
    web = next(r for r in rows if r.startswith("web-1")).split()
    assert web[1] == condition(fleet, "web-1", "Ready")["status"]
    assert web[5:7] == ["role=streamer,zone=a", "127.0.0.1:9"]

    as_json = json.loads(stortune("get", "hosts", "-o", "json").out)
    assert as_json["kind"] == "HostList"
    assert [h["metadata"]["name"] for h in as_json["items"]] == ["db-1", "web-1"]
    one = yaml.safe_load(stortune("get", "host", "web-1", "-o", "yaml").out)
    assert one["kind"] == "Host"
    assert one["spec"]["address"] == "127.0.0.1:9"
    assert stortune("get", "hosts", "-l", "role=streamer", "-o", "name").out == "host/web-1\n"


def test_get_profiles_with_selector(stortune: Run, fleet: ControlPlane) -> None:
    table = stortune("get", "profiles")
    header, *rows = table.out.splitlines()
    assert header.split() == ["NAME", "PRIORITY", "MODE", "SELECTOR", "GENERATION", "AGE"]
    assert [r.split()[:5] for r in rows] == [["oltp", "10", "enforce", "role=database", "1"],
                                             ["vod", "10", "enforce", "role=streamer", "1"]]
    assert stortune("get", "sp", "-l", "tier=gold", "-o", "name").out == "storageprofile/oltp\n"
    assert json.loads(stortune("get", "profile", "vod", "-o", "json").out)["metadata"]["name"] == "vod"
    empty = stortune("get", "profiles", "-l", "tier in (silver)")
    assert (empty.code, empty.out, empty.err.strip()) == (0, "", "No resources found.")
    invalid = stortune("get", "profiles", "-l", "tier in silver")
    assert invalid.code == 1
    assert "labelSelector" in invalid.err


def test_get_events_filters(stortune: Run, fleet: ControlPlane) -> None:
    result = stortune("get", "events", "--profile", "vod")
    header, *rows = result.out.splitlines()
    assert header.split()[:5] == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT"]
    assert rows and all("storageprofile/vod" in r for r in rows)
    assert "Created" in rows[-1]
    hosts = json.loads(stortune("get", "events", "--host", "web-1", "--limit", "1", "-o", "json").out)
    assert len(hosts["items"]) == 1
    assert hosts["items"][0]["host"] == "web-1"
    misuse = stortune("get", "events", "web-1")
    assert misuse.code == 1
    assert "--host" in misuse.err


def test_not_found_and_bad_usage_exit_1(stortune: Run, fleet: ControlPlane) -> None:
    missing = stortune("get", "host", "nope")
    assert (missing.code, missing.out) == (1, "")
    assert 'Host "nope" not found' in missing.err
    weird = stortune("get", "profile", "a/b")
    assert weird.code == 1
    assert 'StorageProfile "a/b" not found' in weird.err
    assert stortune("get", "widgets").code == 1
    assert stortune("get", "hosts", "--limit", "3").code == 1


def test_describe_host(stortune: Run, fleet: ControlPlane) -> None:
    assert stortune("label", "host", "web-1", "tier=gold").code == 0
    result = stortune("describe", "host", "web-1")
    assert result.code == 0, result.err
    out = result.out
    assert out.startswith("Name:           web-1\n")
    assert "Address:        127.0.0.1:9" in out
    assert "role=streamer  (reported by agent)" in out
    assert "tier=gold  (set via API)" in out
    assert "  kernel:         6.1.0" in out
    assert "Last heartbeat: " in out and "Lease expires:  " in out
    ready = next(line for line in out.splitlines() if line.strip().startswith("Ready"))
    expected = condition(fleet, "web-1", "Ready")
    assert ready.split()[:3] == ["Ready", expected["status"], expected["reason"]]
    assert "Settings (desired vs observed):\n  <none reported yet>" in out
    events = out.split("Events:\n", 1)[1]
    assert "LabelsChanged" in events
    assert "Registered" in events


def host_with_settings() -> Host:
    """A host document as the API serves it once the reconciler has reported (models/hosts.py)."""
    since = "2025-03-01T12:00:00Z"
    setting: dict[str, Any] = {"device": "sda", "deviceId": "wwn:naa.6", "tunable": "read_ahead_kb",
                               "profile": "vod", "rule": "raid-volumes", "message": ""}
    return Host.parse({
        "apiVersion": "stortune/v1", "kind": "Host",
        "metadata": {"name": "web-1", "creationTimestamp": "2025-03-01T12:00:00Z", "labels": {"role": "x"}},
        "spec": {"labels": {}, "address": "web-1:7443"},
        "status": {
            "conditions": [
                {"type": t, "status": s, "reason": r, "message": "", "lastTransitionTime": since}
                for t, s, r in (("Ready", "False", "Drift"), ("Reachable", "True", "AgentResponded"),
                                ("Applied", "True", "Applied"), ("Drifted", "True", "Drift"))],
            "devices": [{**setting, "desired": 4096, "observed": 4096, "inSync": True, "mode": "enforce"},
                        {**setting, "tunable": "scheduler", "desired": "mq-deadline", "observed": "none",
                         "inSync": False, "drifted": True, "message": "changed outside stortune"}],
            "appliedGenerations": {"vod": 3}, "refusedGenerations": {"oltp": 2},
            "reportedLabels": {"role": "x"}, "facts": {},
            "registeredAt": "2025-03-01T12:00:00Z",
        },
    })


def test_profile_hosts_column_appears_once_the_reconciler_counts_them() -> None:
    def profile(name: str, status: dict[str, Any]) -> Profile:
        return Profile.parse({"metadata": {"name": name, "generation": 2},
                              "spec": {"priority": 5, "hostSelector": {"matchLabels": {"a": "b"}}},
                              "status": status})

    headers, rows = render.profile_rows([profile("new", {})])
    assert "HOSTS" not in headers
    headers, rows = render.profile_rows([
        profile("rolling", {"phase": "Failed",
                            "hosts": {"matched": 3, "applied": 1, "failed": 1, "pending": 1}}),
        profile("going", {"phase": "Deleting", "hosts": {"restoring": 2}}),
        profile("new", {}),
    ])
    column = headers.index("HOSTS")
    assert [r[column] for r in rows] == ["1/3 (1 failed)", "restoring 2", "-"]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_reconciler_status_is_shown_and_drift_is_highlighted(monkeypatch: pytest.MonkeyPatch) -> None:
    host = host_with_settings()
    plain = render.Output(io.StringIO(), io.StringIO())
    render.describe_host(plain, host, [])
    text = plain.out.getvalue()  # type: ignore[attr-defined]
    drift = next(line for line in text.splitlines() if "scheduler" in line)
    assert drift.split()[:7] == ["sda", "scheduler", "mq-deadline", "none", "NO", "(drifted)",
                                 "vod/raid-volumes"]
    assert "vod (generation 3)" in text
    assert "oltp (generation 2 refused by the agent)" in text
    _, rows = render.host_rows([host])
    assert [c if isinstance(c, str) else c.text for c in rows[0][1:5]] == ["False", "True", "True", "True"]

    monkeypatch.delenv("NO_COLOR", raising=False)
    tty = render.Output(Terminal(), Terminal())
    render.describe_host(tty, host, [])
    coloured = tty.out.getvalue()  # type: ignore[attr-defined]
    assert "\x1b[31m" in coloured  # the drifted row is red

    monkeypatch.setenv("NO_COLOR", "1")
    calm = render.Output(Terminal(), Terminal())
    render.describe_host(calm, host, [])
    assert "\x1b[31m" not in calm.out.getvalue()  # type: ignore[attr-defined]


def test_label_host_sets_overwrites_and_removes(stortune: Run, fleet: ControlPlane) -> None:
    def labels() -> dict[str, str]:
        with fleet.http() as http:
            spec: dict[str, str] = http.get("/hosts/web-1").json()["spec"]["labels"]
            return spec

    assert stortune("label", "host", "web-1", "tier=gold", "rack=r1").out == "host/web-1 labeled\n"
    assert labels() == {"tier": "gold", "rack": "r1"}
    refused = stortune("label", "host", "web-1", "tier=silver")
    assert refused.code == 1
    assert "--overwrite" in refused.err
    assert stortune("label", "host", "web-1", "tier=silver", "--overwrite").code == 0
    assert labels() == {"tier": "silver", "rack": "r1"}
    assert stortune("label", "hosts", "web-1", "rack-").out == "host/web-1 unlabeled\n"
    assert labels() == {"tier": "silver"}

    reported = stortune("label", "host", "web-1", "zone-")
    assert reported.code == 0
    assert "reported by the agent" in reported.err
    bad = stortune("label", "host", "web-1", "bad key=1")
    assert bad.code == 1
    assert labels() == {"tier": "silver"}
    assert stortune("label", "host", "ghost", "a=b").code == 1


def test_piped_output_has_no_escape_sequences_and_the_server_comes_from_the_env(
    fleet: ControlPlane, tmp_path: Path
) -> None:
    script = Path(sys.executable).with_name("stortune")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "stortune.cli"]
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env.update(STORTUNE_SERVER=fleet.url, STORTUNE_TOKEN=fleet.admin_token, TERM="xterm-256color",
               FORCE_COLOR="1")
    path = tmp_path / "changed.yaml"
    path.write_text(profile_yaml("vod", read_ahead_kb=8192))
    for args, code in ((["get", "hosts"], 0), (["describe", "host", "web-1"], 0),
                       (["diff", "-f", str(path)], 2), (["get", "host", "nope"], 1)):
        done = subprocess.run([*command, *args], capture_output=True, text=True, env=env, timeout=60,
                              check=False)
        assert done.returncode == code, (args, done.stderr)
        assert "\x1b" not in done.stdout + done.stderr, args
    assert "web-1" in subprocess.run([*command, "get", "hosts"], capture_output=True, text=True, env=env,
                                     timeout=60, check=True).stdout


def test_hostile_text_from_agents_reaches_no_terminal_as_control_sequences(
    stortune: Run, control_plane: ControlPlane,
) -> None:
    """What an agent reports (facts, values, its report's messages; a USB stick's INQUIRY model) is
    printed: an escape sequence in it would retitle the terminal, write the clipboard (OSC 52) or
    erase and rewrite the lines the operator reads. Shown escaped, on a terminal and piped."""
    hostile = "6.1\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2K\x1b[1A\rReady True\x9b31m\u202e"
    body: dict[str, Any] = {
        "name": "evil", "address": "127.0.0.1:9", "labels": {"role": "streamer"},
        "facts": {"kernel": hostile, "agent_version": hostile, "boot_id": "boot-1"},
    }
    with control_plane.http() as http:
        assert http.post("/agents/register", json=body).status_code == 200
    for args in (("describe", "host", "evil"), ("get", "hosts"), ("get", "events")):
        result = stortune(*args)
        assert result.code == 0, result.err
        shown = result.out + result.err
        assert not [c for c in shown if c not in "\n" and (ord(c) < 32 or 0x7f <= ord(c) < 0xa0
                                                            or c == "\u202e")], args
    assert "6.1\\x1b]52;c;cm0gLXJmIH4=\\x07" in stortune("describe", "host", "evil").out
    terminal = io.StringIO()
    terminal.isatty = lambda: True  # type: ignore[method-assign]
    out = render.Output(terminal, io.StringIO())
    out.line(hostile)
    out.table(["KERNEL"], [[hostile]])
    for sequence in ("\x1b]52", "\x07", "\x1b[2K", "\x1b[1A", "\r", "\x9b", "\u202e"):
        assert sequence not in terminal.getvalue(), sequence


def test_server_flag_beats_env_and_a_bad_url_is_an_error(
    stortune: Run, fleet: ControlPlane, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("STORTUNE_SERVER", "http://127.0.0.1:1")
    assert stortune("get", "hosts", "-o", "name").out == "host/db-1\nhost/web-1\n"
    # before the subcommand too
    assert main(["--server", fleet.url, "--token", fleet.admin_token, "get", "hosts", "-o", "name"]) == 0
    capsys.readouterr()
    assert main(["get", "hosts"]) == 1
    assert "cannot reach the control plane at http://127.0.0.1:1: " in capsys.readouterr().err
    monkeypatch.setenv("STORTUNE_SERVER", "127.0.0.1:8080")
    assert main(["get", "hosts"]) == 1
    assert "STORTUNE_SERVER '127.0.0.1:8080': expected an http:// or https:// URL" in capsys.readouterr().err


def test_help_documents_the_diff_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", "--help"]) == 0
    text = capsys.readouterr().out
    assert "0  in sync" in text
    assert "1  error" in text
    assert "2  differences found" in text
    assert main(["frobnicate"]) == 1  # usage errors are errors (1), never diff's 2


def test_hostile_describe_host_shows_the_protected_devices_escaped(
        stortune: Run, fleet: ControlPlane) -> None:
    """What the agent reports protected is shown with its reason; a reason is printable to the
    server (no C0 control) but may hold a bidirectional override, shown escaped."""
    from stortune.schemas.topology import Device, DeviceKind, Topology

    zram = Device(name="zram0", kind=DeviceKind.ZRAM, id="name:zram0")
    topology = Topology(hostname="swap-1", devices=[zram]).model_dump(mode="json")
    topology["protected"] = [{"name": "zram0", "id": "name:zram0",
                              "reason": "zram0 backs swap (/dev/zram0)\u202e"}]
    body = {"name": "swap-1", "address": "127.0.0.1:9", "labels": {}, "topology": topology,
            "facts": {"kernel": "6.1.0", "agent_version": "0.1.0", "boot_id": "boot-1"}}
    with fleet.http() as http:
        assert http.post("/agents/register", json=body).status_code == 200
    out = stortune("describe", "host", "swap-1").out
    section = out.split("Protected devices (no experiment, benchmark or probe; the agent decides):\n")[1]
    assert section.splitlines()[1].split(None, 1) == ["zram0", "zram0 backs swap (/dev/zram0)\\u202e"]
    assert "\u202e" not in out
    # an older agent's topology, and a host with none yet: not reported, which is not "none"
    for older in ("web-1", "db-1"):
        shown = stortune("describe", "host", older)
        assert shown.code == 0, shown.err
        assert "Protected devices (no experiment, benchmark or probe; the agent decides):\n"\
               "  <not reported by this host's agent>\n" in shown.out
