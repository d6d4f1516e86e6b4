"""Hardware RAID controllers through the control plane and the agent.

The streaming-server case: a PowerEdge whose PERC ships its RAID5 volume in adaptive read-ahead
(fixture sysfs tree, fake perccli64 on the agent's tool path). A profile sets the OS read-ahead
to 4096 KiB and the controller to read-ahead; status shows both; an administrator's change of
the controller policy is drift, corrected in enforce mode; deleting the profile restores the
adaptive policy and the kernel's read-ahead. Then a ServeRAID whose read-ahead takes effect only
after a reboot: pendingReboot in status, not drift, until the reboot.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.e2e.test_control_plane_e2e import (
    Fleet,
    agent_proc,
    eventually,
    fleet,  # noqa: F401 - the fixture, used by name
)
from tests.fixtures.raid_fakes import FakeTool, fake_arcconf, fake_megaraid
from tests.fixtures.scenarios import perc_managed, serveraid_host

STREAMER = """apiVersion: stortune/v1
kind: StorageProfile
metadata: {name: vod-perc}
spec:
  hostSelector: {matchLabels: {role: streamer}}
  rules:
    - name: video
      match:
        kind: [disk]
        controller: {adapter: [perc], raidLevel: [raid5]}
      settings: {read_ahead_kb: 4096, controller_read_ahead: read-ahead}
"""

SERVERAID = """apiVersion: stortune/v1
kind: StorageProfile
metadata: {name: vod-serveraid}
spec:
  hostSelector: {matchLabels: {role: serveraid}}
  rules:
    - name: video
      match:
        kind: [disk]
        controller: {adapter: [arcconf]}
      settings: {controller_read_ahead: read-ahead}
"""


def setting(f: Fleet, host: str, device: str, tunable: str) -> dict[str, Any] | None:
    for row in f.host(host)["status"].get("devices", []):
        if row["device"] == device and row["tunable"] == tunable:
            return dict(row)
    return None


def read_policy(tool: FakeTool) -> str:
    """The PERC volume's read policy in storcli's flags: ADRA adaptive, NR none, R read-ahead."""
    flags = str(tool.state()["controllers"][0]["vall"]["/c0/v0"][0]["Cache"])
    return next(p for p in ("ADRA", "NR", "R") if flags.startswith(p))


def start_agent(f: Fleet, name: str, fs_root: Path, bin_dir: Path, label: str) -> None:
    roots = ["--sysfs", str(fs_root / "sys"), "--procfs", str(fs_root / "proc"),
             "--tool-path", str(bin_dir), "--tool-timeout", "20", "--controller-cache", "0"]
    f.agents[name] = agent_proc(f, name, roots, label)
    f.agents[name].start()


def test_perc_streamer_through_server_and_agent(fleet: Fleet,  # noqa: F811 - the fixture imported above
                                                tmp_path: Path) -> None:
    # A PERC H710 as it ships: its RAID5 volume in adaptive read-ahead; old firmware reports no
    # NAA id, so the volume is found by its SCSI target on the one megaraid_sas host.
    fs = perc_managed(tmp_path / "stream02", wwids=None)
    perc = fake_megaraid(tmp_path / "bin-perc", ("legacy",), name="perccli64")
    assert read_policy(perc) == "ADRA"
    ra = fs.sysfs / "class/block/sdb/queue/read_ahead_kb"
    ra.write_text("128\n")
    start_agent(fleet, "stream02", fs.sysfs.parent, perc.path.parent, "role=streamer")
    eventually("stream02 Reachable", lambda: fleet.is_("stream02", "Reachable"))
    with fleet.api() as c:
        topology = c.get("/api/v1/hosts/stream02/topology").json()
    sdb = next(d for d in topology["devices"] if d["name"] == "sdb")
    assert (sdb["controller"]["adapter"], sdb["controller"]["raid_level"]) == ("perc", "raid5")
    assert sdb["tunables"]["controller_read_ahead"]["value"] == "adaptive"

    profile = tmp_path / "vod.yaml"
    profile.write_text(STREAMER)
    applied = fleet.cli("apply", "-f", str(profile))
    assert applied.returncode == 0, applied.stderr
    eventually("vod-perc applied", lambda: fleet.converged("stream02", "vod-perc"))
    assert ra.read_text().strip() == "4096"
    assert read_policy(perc) == "R"
    rows = {t: setting(fleet, "stream02", "sdb", t) for t in ("read_ahead_kb", "controller_read_ahead")}
    assert all(r is not None and r["inSync"] for r in rows.values()), rows
    shown = fleet.cli("describe", "host", "stream02")
    assert "controller_read_ahead" in shown.stdout and "read-ahead" in shown.stdout, shown.stdout

    # An administrator puts the controller back to adaptive with perccli: drift, corrected.
    perc.set_by_hand(0, 0, "read_policy", "adaptive")
    eventually("the controller drift event", lambda: any(
        e["reason"] == "Drift" and "controller_read_ahead" in e["message"]
        for e in fleet.events("stream02")), timeout=90)
    eventually("read-ahead back on the controller", lambda: read_policy(perc) == "R")

    # Deleting the profile restores what was there before stortune: adaptive, 128 KiB.
    with fleet.api() as c:
        assert c.delete("/api/v1/profiles/vod-perc").is_success
    eventually("adaptive read-ahead restored", lambda: read_policy(perc) == "ADRA", timeout=90)
    eventually("kernel read-ahead restored", lambda: ra.read_text().strip() == "128")


def test_serveraid_read_ahead_waits_for_a_reboot_and_is_no_drift(
        fleet: Fleet, tmp_path: Path) -> None:  # noqa: F811 - the fixture imported above
    fs = serveraid_host(tmp_path / "x3650")
    arc = fake_arcconf(tmp_path / "bin-arc", ("serveraid8",))
    state = arc.state()
    state["controllers"][0]["lds"]["0"]["disk"] = "/dev/sdb (Disk0) (Bus: 0, Target: 0, Lun: 0)"
    arc.update(state)
    arc.set_by_hand(1, 0, "read_policy", "no-read-ahead")
    arc.reboot()  # read-ahead off and in effect before stortune starts
    start_agent(fleet, "x3650", fs.sysfs.parent, arc.path.parent, "role=serveraid")
    eventually("x3650 Reachable", lambda: fleet.is_("x3650", "Reachable"))
    profile = tmp_path / "serveraid.yaml"
    profile.write_text(SERVERAID)
    assert fleet.cli("apply", "-f", str(profile)).returncode == 0
    eventually("vod-serveraid applied", lambda: fleet.converged("x3650", "vod-serveraid"))
    row = eventually("pendingReboot in status", lambda: (
        r := setting(fleet, "x3650", "sdb", "controller_read_ahead")) and r["pendingReboot"] and r)
    assert row["inSync"] and not row["drifted"] and row["effective"] == "no-read-ahead"
    assert fleet.is_("x3650", "Drifted", "False") is not None
    shown = fleet.cli("describe", "host", "x3650")
    assert "pending reboot" in shown.stdout, shown.stdout
    arc.reboot()
    eventually("in effect after the reboot", lambda: (
        r := setting(fleet, "x3650", "sdb", "controller_read_ahead")) and not r["pendingReboot"]
        and r["inSync"])
