"""Writing controller policies through stateful fake tools (storcli/perccli, ssacli/hpacucli,
arcconf): each write is read back by discovering again. Hostile cases first."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stortune.agent.controllers.arcconf import ArcconfAdapter
from stortune.agent.controllers.base import ControllerAdapter, PolicyUnsupported, ToolFailure
from stortune.agent.controllers.discover import discover_controllers as discover
from stortune.agent.controllers.megaraid import MegaRaidAdapter
from stortune.agent.controllers.smartarray import SmartArrayAdapter
from stortune.agent.tools import ToolRunner
from stortune.schemas.controllers import Controller, VirtualDrive
from tests.fixtures.diag_hosts import write_script
from tests.fixtures.raid_fakes import FakeTool, fake_arcconf, fake_megaraid, fake_ssacli

ADAPTERS: dict[str, ControllerAdapter] = {
    "megaraid": MegaRaidAdapter("megaraid", ("storcli64",)),
    "perc": MegaRaidAdapter("perc", ("perccli64",)),
    "smartarray": SmartArrayAdapter(),
    "arcconf": ArcconfAdapter(),
}


def make(kind: str, bin_dir: Path) -> FakeTool:
    """One fake per adapter: a modern MegaRAID, a legacy PERC, a Gen10 and a Gen6 Smart Array,
    an Adaptec Series 8 and a ServeRAID 8k."""
    return {
        "megaraid": lambda: fake_megaraid(bin_dir, ("modern",)),
        "perc": lambda: fake_megaraid(bin_dir, ("legacy",), name="perccli64"),
        "smartarray": lambda: fake_ssacli(bin_dir, ("gen10", "gen6")),
        "hpacucli": lambda: fake_ssacli(bin_dir, ("gen6",), name="hpacucli"),
        "arcconf": lambda: fake_arcconf(bin_dir, ("series8", "serveraid8")),
    }[kind]()


def adapter_of(tool: FakeTool) -> ControllerAdapter:
    names = {"storcli64": "megaraid", "perccli64": "perc", "arcconf": "arcconf"}
    return ADAPTERS[names.get(tool.path.name, "smartarray")]


def find(tool: FakeTool, controller: int, vd: int) -> tuple[Controller, VirtualDrive]:
    inv = discover(ToolRunner([tool.path.parent]), [adapter_of(tool)])
    assert inv.errors == []
    c = next(c for c in inv.controllers if c.index == controller)
    return c, next(v for v in c.virtual_drives if v.id == vd)


def write(tool: FakeTool, controller: int, vd: int, setting: str, value: str, *,
          timeout: float = 10.0) -> None:
    c, v = find(tool, controller, vd)
    runner = ToolRunner([tool.path.parent], timeout=timeout)
    adapter_of(tool).set_policy(runner, str(tool.path), c, v, setting, value)  # type: ignore[arg-type]


def writes(tool: FakeTool) -> list[list[str]]:
    """The write commands the fake received (show commands left out)."""
    return [c for c in tool.calls() if {"set", "modify", "SETCACHE"} & set(c)]


Target = tuple[str, int, int, str, str]
# (fake, controller, volume, setting, a value the tool offers) for each adapter
TARGETS: list[Target] = [
    ("megaraid", 0, 1, "read_policy", "read-ahead"),
    ("perc", 0, 0, "write_policy", "write-back"),
    ("smartarray", 0, 1, "write_policy", "write-through"),
    ("arcconf", 1, 0, "read_policy", "no-read-ahead"),
]


@pytest.mark.parametrize("target", [
    ("megaraid", 0, 0, "read_policy", "RA; rm -rf /"),
    ("megaraid", 0, 0, "read_policy", "RA nolog"),
    ("megaraid", 0, 0, "write_policy", "WB"),  # the tool's word, not the normalised one
    ("megaraid", 0, 0, "io_policy", "cached"),
    ("smartarray", 0, 1, "read_policy", "read-ahead"),  # no per-volume read-ahead
    ("smartarray", 0, 1, "write_policy", "always-write-back"),
    ("smartarray", 1, 1, "drive_cache", "default"),  # Gen6: enable or disable only
    ("smartarray", 0, 1, "write_policy", "enable forced"),
    ("arcconf", 1, 0, "drive_cache", "enabled"),  # per physical device on arcconf
    ("arcconf", 2, 0, "read_policy", "adaptive"),
    ("arcconf", 1, 0, "write_policy", "WBB noprompt"),
])
def test_hostile_unsupported_values_are_refused_before_any_run(tmp_path: Path, target: Target) -> None:
    kind, controller, vd, setting, value = target
    tool = make(kind, tmp_path)
    expected = rf"controller {controller} virtual drive {vd}: setting {setting} to .*: not supported"
    with pytest.raises(PolicyUnsupported, match=expected):
        write(tool, controller, vd, setting, value)
    assert writes(tool) == []


@pytest.mark.parametrize("target", TARGETS)
def test_hostile_a_failing_set_is_an_error_naming_controller_volume_and_setting(
        tmp_path: Path, target: Target) -> None:
    kind, controller, vd, setting, value = target
    tool = make(kind, tmp_path)
    tool.fault("", exit_code=3, message="Controller is busy, try later")
    with pytest.raises(ToolFailure) as err:
        write(tool, controller, vd, setting, value)
    message = str(err.value)
    assert f"controller {controller} virtual drive {vd}: setting {setting} to {value!r}" in message
    assert "status 3" in message and "Controller is busy" in message
    assert not isinstance(err.value, PolicyUnsupported)
    assert len(writes(tool)) == 1


@pytest.mark.parametrize("target", TARGETS)
def test_hostile_a_garbage_answer_is_an_error(tmp_path: Path, target: Target) -> None:
    kind, controller, vd, setting, value = target
    tool = make(kind, tmp_path)
    tool.fault("", "garbage")
    with pytest.raises(ToolFailure, match=rf"virtual drive {vd}: setting {setting}"):
        write(tool, controller, vd, setting, value)


@pytest.mark.parametrize("target", TARGETS)
def test_hostile_a_hanging_set_hits_the_runner_timeout(tmp_path: Path, target: Target) -> None:
    kind, controller, vd, setting, value = target
    tool = make(kind, tmp_path)
    tool.fault("", "hang", seconds=60)
    with pytest.raises(ToolFailure, match=r"did not finish within 0.5 s and was killed") as err:
        write(tool, controller, vd, setting, value, timeout=0.5)
    assert f"setting {setting}" in str(err.value)


def test_hostile_storcli_failure_status_with_exit_0_is_an_error(tmp_path: Path) -> None:
    tool = make("megaraid", tmp_path)
    tool.fault("wrcache", exit_code=0, message="Operation not allowed: VD is being reconstructed")
    with pytest.raises(ToolFailure, match=r"status 0\): Operation not allowed: VD is being reconstructed"):
        write(tool, 0, 0, "write_policy", "write-through")
    assert find(tool, 0, 0)[1].write_policy == "write-back"  # unchanged


def test_hostile_only_the_nth_write_fails_and_the_others_stay_applied(tmp_path: Path) -> None:
    tool = make("megaraid", tmp_path)
    tool.fault("", nth=2, message="Adapter firmware busy")
    write(tool, 0, 0, "read_policy", "no-read-ahead")
    with pytest.raises(ToolFailure, match="Adapter firmware busy"):
        write(tool, 0, 0, "write_policy", "write-through")
    write(tool, 0, 0, "drive_cache", "disabled")
    _, v = find(tool, 0, 0)
    assert (v.read_policy, v.write_policy, v.drive_cache) == ("no-read-ahead", "write-back", "disabled")
    assert [w[2] for w in writes(tool)] == ["rdcache=NoRA", "wrcache=WT", "pdcache=Off"]


def test_hostile_a_volume_the_controller_does_not_have_is_the_tools_error(tmp_path: Path) -> None:
    tool = make("megaraid", tmp_path)
    c, v = find(tool, 0, 0)
    ghost = v.model_copy(update={"id": 7})
    with pytest.raises(ToolFailure, match=r"virtual drive 7: .*VD doesn't exist"):
        ADAPTERS["megaraid"].set_policy(ToolRunner([tmp_path]), str(tool.path), c, ghost,
                                        "read_policy", "read-ahead")


def test_hostile_arcconf_leaves_its_log_in_a_private_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tool = make("arcconf", tmp_path / "bin")
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir()
    monkeypatch.chdir(agent_dir)
    assert len(discover(ToolRunner([tool.path.parent]), [ArcconfAdapter()]).controllers) == 2
    write(tool, 1, 0, "write_policy", "write-through")
    assert list(agent_dir.iterdir()) == []  # no UcliEvt.log where the agent stands
    # the fake does write one, wherever it is run: a directory the caller names receives it
    chosen = tmp_path / "tools-cwd"
    chosen.mkdir()
    discover(ToolRunner([tool.path.parent], cwd=chosen), [ArcconfAdapter()])
    assert (chosen / "UcliEvt.log").read_text().count("GETCONFIG") == 2


def test_each_run_gets_a_fresh_directory_removed_afterwards(tmp_path: Path) -> None:
    write_script(tmp_path / "where", "pwd; touch litter")
    runner = ToolRunner([tmp_path])
    first, second = (runner.run([str(tmp_path / "where")]).stdout.decode().strip() for _ in range(2))
    assert first != second and first != os.getcwd()
    assert not Path(first).exists() and not Path(second).exists()


@pytest.mark.parametrize(("setting", "value", "field", "flag"), [
    ("read_policy", "read-ahead", "read_policy", "rdcache=RA"),
    ("read_policy", "no-read-ahead", "read_policy", "rdcache=NoRA"),
    ("write_policy", "write-through", "write_policy", "wrcache=WT"),
    ("write_policy", "always-write-back", "write_policy", "wrcache=AWB"),
    ("write_policy", "write-back", "write_policy", "wrcache=WB"),
    ("drive_cache", "enabled", "drive_cache", "pdcache=On"),
    ("drive_cache", "disabled", "drive_cache", "pdcache=Off"),
    ("drive_cache", "default", "drive_cache", "pdcache=Default"),
])
def test_megaraid_set_then_rediscover(tmp_path: Path, setting: str, value: str, field: str,
                                      flag: str) -> None:
    tool = make("megaraid", tmp_path)
    write(tool, 0, 1, setting, value)
    assert getattr(find(tool, 0, 1)[1], field) == value
    assert writes(tool) == [["/c0/v1", "set", flag, "J"]]
    other = find(tool, 0, 0)[1]  # the other volume keeps its policies
    assert (other.read_policy, other.write_policy, other.drive_cache) == (
        "read-ahead", "write-back", "default")


def test_perc_adaptive_read_ahead_can_be_replaced_and_put_back(tmp_path: Path) -> None:
    """The PERC H710's factory adaptive read-ahead: stortune must be able to restore it."""
    tool = make("perc", tmp_path)
    assert find(tool, 0, 0)[1].read_policy == "adaptive"
    write(tool, 0, 0, "read_policy", "read-ahead")
    assert find(tool, 0, 0)[1].read_policy == "read-ahead"
    write(tool, 0, 0, "read_policy", "adaptive")
    assert find(tool, 0, 0)[1].read_policy == "adaptive"
    assert writes(tool)[-1] == ["/c0/v0", "set", "rdcache=ADRA", "J"]


def test_hostile_adaptive_on_firmware_without_it_is_the_tools_failure(tmp_path: Path) -> None:
    """Current MegaRAID firmware has no adaptive read-ahead: storcli answers Failure, which is a
    ToolFailure naming the volume (the apply fails and rolls back), and nothing changed."""
    tool = make("megaraid", tmp_path)
    with pytest.raises(ToolFailure, match="not supported by this controller"):
        write(tool, 0, 0, "read_policy", "adaptive")
    assert find(tool, 0, 0)[1].read_policy == "read-ahead"


def test_megaraid_write_back_falls_back_when_the_backup_fails_and_admin_changes_show(tmp_path: Path) -> None:
    tool = make("megaraid", tmp_path)
    tool.fail_battery(0)
    c, v0 = find(tool, 0, 0)
    assert (c.backup.optimal, v0.write_policy) == (False, "write-through")  # WB without a backup
    assert find(tool, 0, 1)[1].write_policy == "always-write-back"  # AWB does not fall back
    tool.set_by_hand(0, 1, "read_policy", "read-ahead")
    assert find(tool, 0, 1)[1].read_policy == "read-ahead"


def test_smart_array_caching_is_the_write_policy(tmp_path: Path) -> None:
    tool = make("smartarray", tmp_path)
    assert [(v.id, v.caching, v.write_policy) for v in find(tool, 0, 1)[0].virtual_drives] == [
        (1, True, "write-back"), (2, False, "write-through")]
    write(tool, 0, 1, "write_policy", "write-through")
    write(tool, 0, 2, "write_policy", "write-back")
    assert [(v.id, v.caching, v.write_policy) for v in find(tool, 0, 1)[0].virtual_drives] == [
        (1, False, "write-through"), (2, True, "write-back")]
    assert writes(tool) == [["ctrl", "slot=0", "ld", "1", "modify", "caching=disable"],
                            ["ctrl", "slot=0", "ld", "2", "modify", "caching=enable"]]


@pytest.mark.parametrize("value", ["enabled", "disabled", "default"])
def test_smart_array_gen10_drive_cache_is_controller_wide_per_usage(tmp_path: Path, value: str) -> None:
    tool = make("smartarray", tmp_path)
    assert {v.drive_cache for v in find(tool, 0, 1)[0].virtual_drives} == {"default"}
    write(tool, 0, 2, "drive_cache", value)
    c, _ = find(tool, 0, 1)
    assert {v.drive_cache for v in c.virtual_drives} == {value}
    assert find(tool, 1, 1)[1].drive_cache == "disabled"  # the other controller is untouched
    word = {"enabled": "enable", "disabled": "disable", "default": "default"}[value]
    assert writes(tool) == [
        ["ctrl", "slot=0", "modify", f"drivewritecache={word}", "usage=configured", "forced"]]


def test_hpacucli_gen6_drive_cache_without_usage(tmp_path: Path) -> None:
    tool = make("hpacucli", tmp_path)
    write(tool, 0, 1, "drive_cache", "enabled")
    assert find(tool, 0, 1)[1].drive_cache == "enabled"
    assert writes(tool) == [["ctrl", "slot=0", "modify", "drivewritecache=enable", "forced"]]


@pytest.mark.parametrize(("setting", "value", "mode"), [
    ("read_policy", "no-read-ahead", "ROFF"),
    ("write_policy", "write-through", "WT"),
    ("write_policy", "always-write-back", "WB"),
])
def test_arcconf_series8_set_then_rediscover(tmp_path: Path, setting: str, value: str, mode: str) -> None:
    tool = make("arcconf", tmp_path)
    write(tool, 1, 0, setting, value)
    v = find(tool, 1, 0)[1]
    assert (getattr(v, setting), v.pending) == (value, {})
    assert writes(tool) == [["SETCACHE", "1", "LOGICALDRIVE", "0", mode, "noprompt"]]


def test_arcconf_asking_for_the_mode_a_drive_has_is_not_a_failure(tmp_path: Path) -> None:
    tool = make("arcconf", tmp_path)
    write(tool, 1, 0, "write_policy", "write-back")  # WBB already: arcconf refuses, exit 2
    assert find(tool, 1, 0)[1].write_policy == "write-back"
    assert len(writes(tool)) == 1


def test_serveraid_read_ahead_is_pending_until_reboot(tmp_path: Path) -> None:
    tool = make("arcconf", tmp_path)
    write(tool, 2, 0, "read_policy", "no-read-ahead")
    v = find(tool, 2, 0)[1]
    assert (v.read_policy, v.pending) == ("read-ahead", {"read_policy": "no-read-ahead"})
    write(tool, 2, 0, "write_policy", "always-write-back")  # the write cache changes at once
    assert find(tool, 2, 0)[1].write_policy == "always-write-back"
    tool.reboot()
    v = find(tool, 2, 0)[1]
    assert (v.read_policy, v.pending) == ("no-read-ahead", {})


def test_serveraid_setting_back_before_the_reboot_clears_the_pending_change(tmp_path: Path) -> None:
    tool = make("arcconf", tmp_path)
    write(tool, 2, 0, "read_policy", "no-read-ahead")
    write(tool, 2, 0, "read_policy", "read-ahead")
    v = find(tool, 2, 0)[1]
    assert (v.read_policy, v.pending) == ("read-ahead", {})


def test_arcconf_write_back_when_protected_reads_as_configured_with_a_failed_battery(tmp_path: Path) -> None:
    tool = make("arcconf", tmp_path)
    tool.fail_battery(1)
    c, v = find(tool, 1, 0)
    # the status says Off (no protection), the setting stays write-back: not a pending change
    assert (c.backup.optimal, v.write_policy, v.pending) == (False, "write-back", {})


@pytest.mark.parametrize("text", ["On when protected by battery/ZMM", "On"])
def test_newer_arcconf_write_cache_wording(text: str) -> None:
    from stortune.agent.controllers.arcconf import parse_write_cache

    assert parse_write_cache(text, "ld 0") == ("write-back" if "protected" in text else "always-write-back")


def test_the_agents_controller_seam_writes_and_reads_back_through_the_fake(tmp_path: Path) -> None:
    """What the executor does: ControllerAccess finds the volume behind a disk and writes it."""
    from dataclasses import replace

    from stortune.agent.controllers.access import ControllerAccess, ControllerWriteError
    from stortune.schemas import catalog
    from tests.fixtures.scenarios import perc_managed

    tool = fake_megaraid(tmp_path / "bin", ("modern",), name="perccli64")
    runner = ToolRunner([tool.path.parent])
    fs = replace(perc_managed(tmp_path / "host"), controllers=ControllerAccess(runner))
    access = fs.controllers
    assert access is not None
    read_ahead, drive_cache = catalog.get("controller_read_ahead"), catalog.get("drive_write_cache")
    assert access.read(fs, read_ahead, "sdc").value == "no-read-ahead"
    access.write(fs, read_ahead, "sdc", "read-ahead")
    assert access.read(fs, read_ahead, "sdc").value == "read-ahead"
    assert writes(tool) == [["/c0/v1", "set", "rdcache=RA", "J"]]
    tool.fault("pdcache", message="Drive cache change not allowed")
    with pytest.raises(ControllerWriteError, match=r"volume 1 drive_cache: .*Drive cache change not allowed"):
        access.write(fs, drive_cache, "sdc", "enabled")
    assert access.read(fs, drive_cache, "sdc").value == "disabled"
