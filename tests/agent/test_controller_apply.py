"""Controller tunables through the whole agent: discovery maps the PERC's volumes onto the
fixture host's disks, apply writes sysfs and the controller in one transaction (through the
stateful fake perccli64), restore puts both back; hostile cases first: a failing controller
write rolls back the apply, a hanging tool costs only its controllers, a crash is recovered
even after a reboot (controller values survive one), write-back without a battery never runs.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from stortune.agent import local
from stortune.agent.controllers.access import ControllerAccess
from stortune.agent.kernelfs import KernelFS
from stortune.agent.tools import ToolRunner
from stortune.schemas.documents import parse_profile
from stortune.schemas.profile import StorageProfile
from tests.fixtures.diag_hosts import write_script
from tests.fixtures.raid_fakes import FakeTool, fake_megaraid
from tests.fixtures.scenarios import perc_managed

BIN = Path(sys.executable).parent


@dataclasses.dataclass
class Host:
    fs: KernelFS
    tool: FakeTool
    bin: Path
    state: Path

    def ra(self, disk: str = "sdb") -> int:
        return int((self.fs.sysfs / "class/block" / disk / "queue/read_ahead_kb").read_text())

    def policy(self, vd: int = 0) -> dict[str, object]:
        """What the fake controller holds for ``vd``, as discovery normalises it."""
        inv = self.fs.controllers.inventory(fresh=True) if self.fs.controllers else None
        assert inv is not None and not inv.errors, inv
        found = next(v for c in inv.controllers for v in c.virtual_drives if v.id == vd)
        return {"read": found.read_policy, "write": found.write_policy, "drive": found.drive_cache}


def make_host(tmp_path: Path, *, timeout: float = 10.0) -> Host:
    fs = perc_managed(tmp_path / "host")
    tool = fake_megaraid(tmp_path / "bin", ("modern",), name="perccli64")
    access = ControllerAccess(ToolRunner([str(tmp_path / "bin")], timeout=timeout), ttl=0)
    return Host(dataclasses.replace(fs, controllers=access), tool, tmp_path / "bin", tmp_path / "state")


def document(settings: dict[str, object]) -> dict[str, object]:
    return {
        "apiVersion": "stortune/v1", "kind": "StorageProfile", "metadata": {"name": "vod"},
        "spec": {"rules": [{"name": "video", "match": {"kind": ["disk"], "controller": {
            "adapter": ["perc"], "raidLevel": ["raid5"]}}, "settings": settings}]},
    }


def profile(settings: dict[str, object]) -> StorageProfile:
    return parse_profile(document(settings))


def set_commands(tool: FakeTool) -> list[str]:
    return [" ".join(c) for c in tool.calls() if " set " in f" {' '.join(c)} "]


# -- hostile first --------------------------------------------------------------------------

def test_hostile_a_controller_write_failing_midway_rolls_back_this_apply(tmp_path: Path) -> None:
    host = make_host(tmp_path)
    before = host.policy()
    host.tool.fault("wrcache", message="firmware says no")
    report = local.apply(host.fs, [profile({"read_ahead_kb": 4096, "controller_read_ahead": "no-read-ahead",
                                            "controller_write_cache": "write-through"})], host.state)
    # Rolled back, then applied again without the refused setting: an error on it alone.
    assert report.ok, report.messages
    rows = {r.tunable: r for r in report.rows}
    assert rows["controller_write_cache"].status == "rejected"
    assert "firmware says no" in rows["controller_write_cache"].message
    assert "tried again at the next apply" in rows["controller_write_cache"].message  # not remembered
    assert rows["read_ahead_kb"].status == rows["controller_read_ahead"].status == "applied"
    assert host.ra() == 4096 and host.policy()["write"] == before["write"]
    # the read-ahead was written, then written back, then written again: one refused wrcache
    assert [c.split()[-2].split("=")[0] for c in set_commands(host.tool)] == [
        "rdcache", "wrcache", "rdcache", "rdcache"]


def test_hostile_a_hanging_tool_costs_its_controllers_only(tmp_path: Path) -> None:
    host = make_host(tmp_path, timeout=1.0)
    write_script(host.bin / "perccli64", "sleep 30")  # every call hangs, not only writes
    topo = local.discover(host.fs)
    assert topo.controllers is not None and topo.controllers.errors
    assert "did not finish within 1 s" in topo.controllers.errors[0].message
    assert all(d.controller is None for d in topo.devices)
    report = local.apply(host.fs, [parse_profile({
        "apiVersion": "stortune/v1", "kind": "StorageProfile", "metadata": {"name": "disks"},
        "spec": {"rules": [{"name": "all", "match": {"kind": ["disk"]},
                            "settings": {"read_ahead_kb": 1024, "controller_read_ahead": "read-ahead"}}]},
    })], host.state)
    assert report.ok, report
    assert host.ra() == 1024
    skipped = [r for r in report.rows if r.tunable == "controller_read_ahead"]
    assert all(r.status != "applied" for r in skipped)


def test_hostile_write_back_without_a_battery_never_reaches_the_tool(tmp_path: Path) -> None:
    host = make_host(tmp_path)
    host.tool.fail_battery(0)
    report = local.apply(host.fs, [profile({"controller_write_cache": "write-back"})], host.state)
    # An error on that setting: reported, never sent to the tool (nothing else was asked for).
    assert [r.tunable for r in report.rejected] == ["controller_write_cache"]
    assert any("always-write-back" in m for m in report.messages)
    assert set_commands(host.tool) == []


CRASH = """
import dataclasses, sys
from stortune.agent import local
from stortune.agent.controllers.access import ControllerAccess
from stortune.agent.kernelfs import KernelFS
from stortune.agent.tools import ToolRunner
from stortune.schemas.documents import parse_profile
import json
sysfs, procfs, tools, state, doc = sys.argv[1:]
fs = KernelFS.at(sysfs, procfs, controllers=ControllerAccess(ToolRunner([tools], timeout=600), ttl=0))
local.apply(fs, [parse_profile(json.loads(doc))], __import__("pathlib").Path(state))
"""


def test_hostile_a_crash_mid_apply_is_recovered_even_after_a_reboot(tmp_path: Path) -> None:
    """Killed while the controller's write cache is being written, after its read-ahead was:
    the reboot reset sysfs, not the controller, so recovery still puts the controller back."""
    host = make_host(tmp_path)
    boot_id = host.fs.procfs / "sys/kernel/random/boot_id"
    boot_id.parent.mkdir(parents=True, exist_ok=True)
    boot_id.write_text("00000000-0000-4000-8000-000000000000\n")
    before = host.policy()
    host.tool.fault("wrcache", mode="hang", seconds=600)
    doc = document({"controller_read_ahead": "no-read-ahead", "controller_write_cache": "write-through"})
    child = subprocess.Popen([sys.executable, "-c", CRASH, str(host.fs.sysfs), str(host.fs.procfs),
                              str(host.bin), str(host.state), json.dumps(doc)])
    try:
        deadline = time.monotonic() + 60
        while not any("wrcache" in c for c in set_commands(host.tool)):
            assert child.poll() is None and time.monotonic() < deadline, "the apply never reached wrcache"
            time.sleep(0.1)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert host.policy()["read"] == "no-read-ahead"  # written before the crash
    boot_id.write_text("00000000-0000-4000-8000-000000000001\n")  # the host rebooted
    host.tool.update({"faults": []})
    done = local.recover(host.fs, host.state)
    assert done is not None and "put back" in done
    assert host.policy() == before


# -- the happy path -------------------------------------------------------------------------

def test_discovery_maps_the_volumes_and_shows_their_policies(tmp_path: Path) -> None:
    host = make_host(tmp_path)
    topo = local.discover(host.fs)
    sdb = topo.device("sdb")
    assert sdb is not None and sdb.controller is not None
    ref = sdb.controller
    assert (ref.adapter, ref.virtual_drive, ref.raid_level) == ("perc", 0, "raid5")
    assert sdb.tunables["controller_read_ahead"].value == host.policy()["read"]
    boot = topo.device("sda")
    assert boot is not None and boot.controller is None and "controller_read_ahead" not in boot.tunables


def test_apply_then_restore_covers_sysfs_and_the_controller(tmp_path: Path) -> None:
    host = make_host(tmp_path)
    before_ra, before = host.ra(), host.policy()
    wanted = profile({"read_ahead_kb": 4096, "controller_read_ahead": "no-read-ahead",
                      "drive_write_cache": "disabled"})
    report = local.apply(host.fs, [wanted], host.state)
    assert report.ok, report
    assert host.ra() == 4096
    assert host.policy()["read"] == "no-read-ahead" and host.policy()["drive"] == "disabled"
    again = local.plan(host.fs, [wanted], host.state)
    assert again.plan.empty, again.plan.changes  # planning after an apply is empty
    restored = local.restore(host.fs, host.state)
    assert restored.ok, restored
    assert host.ra() == before_ra and host.policy() == before


def test_the_vod_streamer_example_sets_the_os_and_the_controller_read_ahead(tmp_path: Path) -> None:
    """examples/vod-streamer.yaml on a PERC H710 streamer whose volume ships adaptive."""
    fs = perc_managed(tmp_path / "host", wwids=None)
    fake_megaraid(tmp_path / "bin", ("legacy",), name="perccli64")
    fs = dataclasses.replace(fs, controllers=ControllerAccess(ToolRunner([str(tmp_path / "bin")]), ttl=0))
    example = Path(__file__).resolve().parents[2] / "examples/vod-streamer.yaml"
    planned = local.plan(fs, local.read_profiles([str(example)]), tmp_path / "state").plan
    wanted = {(c.device, c.tunable): (c.current, c.desired) for c in planned.changes}
    assert wanted[("sdb", "read_ahead_kb")][1] == 4096
    assert wanted[("sdb", "controller_read_ahead")] == ("adaptive", "read-ahead")
    assert ("sda", "controller_read_ahead") not in wanted  # the boot SSD is no RAID volume
