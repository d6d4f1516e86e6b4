"""Smart Array discovery through a fake ``ssacli`` on a tool path: hostile answers first."""

from __future__ import annotations

from pathlib import Path

import pytest

from stortune.agent.controllers.base import ToolFailure
from stortune.agent.controllers.discover import discover_controllers
from stortune.agent.controllers.smartarray import parse_ratio, raid_level
from stortune.agent.tools import ToolRunner
from stortune.schemas.controllers import ControllerInventory
from tests.fixtures.diag_hosts import write_script
from tests.fixtures.ssacli_tool import config_text, gen6, gen10, write_ssacli


def discover(bin_dir: Path, timeout: float = 10.0, max_output: int = 1 << 20) -> ControllerInventory:
    return discover_controllers(ToolRunner([bin_dir], timeout=timeout, max_output=max_output))


def only_smartarray(inv: ControllerInventory) -> ControllerInventory:
    assert inv.unmanaged == ["megaraid", "perc", "arcconf"]
    return inv


def test_a_hanging_ssacli_times_out_alone(tmp_path: Path) -> None:
    write_script(tmp_path / "ssacli", "sleep 60")
    inv = only_smartarray(discover(tmp_path, timeout=0.5))
    [err] = inv.errors
    assert err.adapter == "smartarray" and err.index is None
    assert "did not finish within 0.5 s" in err.message and "ctrl all show config detail" in err.message


@pytest.mark.parametrize("text", ["Segmentation fault\n", "   Status: OK\n   Slot: 0\n", "{\"json\": 1}\n"])
def test_garbage_text_is_an_error_not_an_empty_inventory(tmp_path: Path, text: str) -> None:
    write_ssacli(tmp_path, text)
    [err] = only_smartarray(discover(tmp_path)).errors
    assert "no controller header" in err.message and text.strip()[:10] in err.message


def test_binary_garbage_is_an_error(tmp_path: Path) -> None:
    write_script(tmp_path / "ssacli", "printf 'Smart Array in Slot 0\\n\\377\\376\\000'")
    [err] = discover(tmp_path).errors
    assert "invalid UTF-8" in err.message


def test_huge_output_is_bounded_and_refused(tmp_path: Path) -> None:
    write_script(tmp_path / "ssacli", "yes '      physicaldrive 1I:1:1' | head -c 5000000")
    [err] = discover(tmp_path, max_output=64 << 10).errors
    assert f"more than {64 << 10} bytes" in err.message


def test_one_enormous_line_is_read_in_linear_time(tmp_path: Path) -> None:
    write_ssacli(tmp_path, "Smart Array P440ar in Slot 0\n   Cache Ratio: " + "1% Read / " * 50_000 + "\n")
    [err] = discover(tmp_path, max_output=4 << 20).errors
    assert err.index == 0 and "unreadable cache ratio" in err.message


def test_too_many_drives_is_refused(tmp_path: Path) -> None:
    lines = ["Smart Array P440ar in Slot 0", "   Array: A"]
    lines += [f"      physicaldrive 1I:1:{n}" for n in range(1100)]
    write_ssacli(tmp_path, "\n".join(lines))
    [err] = discover(tmp_path, max_output=4 << 20).errors
    assert "more than 1024 physical drives" in err.message


@pytest.mark.parametrize("code", [2, 127])
def test_non_zero_exit_is_an_error_with_the_tools_message(tmp_path: Path, code: int) -> None:
    write_ssacli(tmp_path, config_text(gen10()), exit_code=code)
    [err] = discover(tmp_path).errors
    assert f"exited with status {code}" in err.message and "Smart Array" in err.message


def test_exit_1_with_an_error_is_an_error(tmp_path: Path) -> None:
    write_script(tmp_path / "ssacli",
                 "echo 'Error: You need to have administrator rights to continue.'; exit 1")
    [err] = discover(tmp_path).errors
    assert "exited with status 1: Error: You need to have administrator rights" in err.message


def test_no_controllers_on_the_host_is_nothing_to_manage_not_an_error(tmp_path: Path) -> None:
    write_script(tmp_path / "ssacli",
                 "printf '\\nError: No controllers detected. Possible causes: ...\\n'; exit 1")
    inv = discover(tmp_path)
    assert inv.errors == [] and inv.controllers == []


@pytest.mark.parametrize(("change", "message"), [
    ({"ratio": "lots Read / some Write"}, "unreadable cache ratio"),
    ({"ratio": "10% Read"}, "unreadable cache ratio"),
    ({"ratio": "900% Read / 10% Write"}, "cache_read_percent"),
    ({"fault_tolerance": "RAID 5; rm -rf"}, "unknown fault tolerance"),
    ({"fault_tolerance": ""}, "unknown fault tolerance"),
    ({"disk": "sda"}, "not under /dev/"),
    ({"disk": "/dev/../etc"}, "block_device"),
])
def test_a_malformed_controller_fails_alone(tmp_path: Path, change: dict[str, str], message: str) -> None:
    write_ssacli(tmp_path, config_text(gen10(0, **change), gen6(1)))
    inv = discover(tmp_path)
    assert [c.index for c in inv.controllers] == [1]
    [err] = inv.errors
    assert err.index == 0 and message in err.message


def test_missing_fields_are_none_not_errors(tmp_path: Path) -> None:
    bare = ["Smart Array P222 in Slot 3", "   Controller Status: OK", "", "   Array: A",
            "      Logical Drive: 1", "         Fault Tolerance: 0", "         Status: OK"]
    write_ssacli(tmp_path, config_text(bare))
    inv = discover(tmp_path)
    assert inv.errors == []
    [c] = inv.controllers
    assert (c.index, c.model, c.serial, c.firmware_version, c.cache_size_bytes, c.cache_read_percent) == (
        3, "Smart Array P222", None, None, None, None)
    assert c.backup.kind == "none"
    [v] = c.virtual_drives
    assert (v.raid_level, v.strip_size_bytes, v.drive_count, v.caching, v.wwn, v.block_device) == (
        "RAID0", None, None, None, None, None)


def test_a_header_without_slot_fails_that_controller(tmp_path: Path) -> None:
    write_ssacli(tmp_path, config_text(["Smart Array P440 in Slot X"], gen6(1)))
    inv = discover(tmp_path)
    assert [c.index for c in inv.controllers] == [1]
    assert "no slot number" in inv.errors[0].message


def test_gen10_ssacli_is_read_in_full(tmp_path: Path) -> None:
    write_ssacli(tmp_path, "Note: banner before the first controller\n" + config_text(gen10()))
    inv = only_smartarray(discover(tmp_path))
    assert inv.errors == []
    [c] = inv.controllers
    assert (c.adapter, c.tool, c.index, c.model, c.serial, c.firmware_version, c.driver, c.pci_address) == (
        "smartarray", str(tmp_path / "ssacli"), 0, "HPE Smart Array P408i-a SR Gen10", "PFAKE0000", "3.53",
        "smartpqi", "0000:5C:00.0")
    assert (c.cache_size_bytes, c.cache_read_percent, c.cache_write_percent) == (2 << 30, 10, 90)
    assert (c.backup.kind, c.backup.state, c.backup.optimal) == ("bbu", "OK", True)
    v1, v2 = c.virtual_drives
    assert (v1.id, v1.raid_level, v1.strip_size_bytes, v1.drive_count, v1.caching, v1.wwn, v1.block_device,
            v1.name, v1.state, v1.read_policy) == (
        1, "RAID10", 256 << 10, 4, True, "600508B1001CFAKE0000000000000001", "/dev/sda", "data", "OK", None)
    assert v1.drives == ["1I:1:1", "1I:1:2", "1I:1:3", "1I:1:4"]
    assert (v2.raid_level, v2.strip_size_bytes, v2.drive_count, v2.caching, v2.block_device) == (
        "RAID5", 64 << 10, 3, False, "/dev/sdb")
    states = {d.slot: d.state for d in c.physical_drives}
    assert states == {"1I:1:1": "OK", "1I:1:2": "OK", "1I:1:3": "OK", "1I:1:4": "Predictive Failure",
                      "2I:1:5": "OK", "2I:1:6": "OK", "2I:1:7": "OK", "2I:1:8": "Failed"}
    assert {d.media for d in c.physical_drives if d.slot.startswith("2I:1:")} == {"SSD", "HDD"}
    assert c.physical_drives[0].model == "HP FAKE0600SAS" and c.physical_drives[0].size_bytes == 600 << 30


def test_gen6_hpacucli_with_a_failed_battery_and_a_spare(tmp_path: Path) -> None:
    write_ssacli(tmp_path, config_text(gen6(1)), name="hpacucli")
    [c] = discover(tmp_path).controllers
    assert (c.index, c.model, c.cache_size_bytes, c.cache_read_percent, c.cache_write_percent) == (
        1, "Smart Array P410i", 512 << 20, 25, 75)
    assert (c.backup.kind, c.backup.optimal) == ("bbu", False) and "Failed" in (c.backup.state or "")
    [v] = c.virtual_drives
    # no member list under the drive: the array's data drives, the spare excluded
    assert (v.raid_level, v.strip_size_bytes, v.drive_count, v.caching, v.block_device) == (
        "RAID5", 64 << 10, 3, True, "/dev/cciss/c0d0")
    assert v.drives == ["1I:1:1", "1I:1:2", "1I:1:3"] and len(c.physical_drives) == 4


def test_two_controllers_round_trip_as_json(tmp_path: Path) -> None:
    write_ssacli(tmp_path, config_text(gen10(0), gen6(1)))
    inv = discover(tmp_path)
    assert [c.index for c in inv.controllers] == [0, 1]
    assert ControllerInventory.model_validate_json(inv.model_dump_json()) == inv


@pytest.mark.parametrize(("value", "expected"), [
    ("1+0", "RAID10"), ("RAID 1+0", "RAID10"), ("ADG", "RAID6"), ("6", "RAID6"), ("50", "RAID50"),
    ("1 (ADM)", "RAID1(ADM)"),
])
def test_raid_levels(value: str, expected: str) -> None:
    assert raid_level(value, "1") == expected


def test_ratio() -> None:
    assert parse_ratio("0% Read / 100% Write", 0) == (0, 100)
    assert parse_ratio(None, 0) == (None, None)
    with pytest.raises(ToolFailure):
        parse_ratio("10% Read / 90% Read", 0)


def test_cli_table_shows_smart_array(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from stortune.agent.cli import main

    write_ssacli(tmp_path, config_text(gen10()))
    assert main(["controllers", "--tool-path", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "HPE Smart Array P408i-a SR Gen10" in out and "RAID10" in out and "Predictive Failure" in out
