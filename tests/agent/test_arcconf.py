"""Adaptec / ServeRAID discovery through a fake ``arcconf`` on a tool path: hostile answers first."""

from __future__ import annotations

from pathlib import Path

import pytest

from stortune.agent.controllers.arcconf import ArcconfAdapter, parse_read_cache, parse_write_cache
from stortune.agent.controllers.base import ToolFailure
from stortune.agent.controllers.discover import discover_controllers
from stortune.agent.tools import ToolRunner
from stortune.schemas.controllers import ControllerInventory
from tests.fixtures.arcconf_tool import render, series8, serveraid8, write_arcconf
from tests.fixtures.diag_hosts import write_script
from tests.fixtures.raid_tools import answers_for, legacy, write_megaraid_tool


def discover(bin_dir: Path, timeout: float = 10.0, max_output: int = 1 << 20) -> ControllerInventory:
    return discover_controllers(ToolRunner([bin_dir], timeout=timeout, max_output=max_output),
                                [ArcconfAdapter()])


def test_no_arcconf_means_not_managed(tmp_path: Path) -> None:
    inv = discover_controllers(ToolRunner([tmp_path]))
    assert inv.errors == [] and "arcconf" in inv.unmanaged


def test_a_hanging_arcconf_times_out_and_megaraid_is_still_read(tmp_path: Path) -> None:
    write_script(tmp_path / "arcconf", "sleep 60")
    write_megaraid_tool(tmp_path, "perccli64", answers_for(legacy()))
    inv = discover_controllers(ToolRunner([tmp_path], timeout=0.5))
    [err] = inv.errors
    assert err.adapter == "arcconf" and err.index is None
    assert "did not finish within 0.5 s" in err.message and "GETVERSION" in err.message
    assert [c.model for c in inv.controllers] == ["PERC H710 Mini"]


def test_one_controller_hanging_fails_alone(tmp_path: Path) -> None:
    write_arcconf(tmp_path, [series8(), series8()])
    script = (tmp_path / "arcconf").read_text().replace(
        "'GETCONFIG 2 AL')", "'GETCONFIG 2 AL') sleep 60;;\n  'unused')")
    write_script(tmp_path / "arcconf", script.split("\n", 1)[1])
    inv = discover(tmp_path, timeout=0.5)
    assert [c.index for c in inv.controllers] == [1]
    [err] = inv.errors
    assert err.index == 2 and "GETCONFIG 2 AL" in err.message and "did not finish" in err.message


@pytest.mark.parametrize(("version", "expected"), [
    ("Segmentation fault\n", "no \"Controllers found\" line in the answer: Segmentation fault"),
    ("", "no \"Controllers found\" line in the answer (empty)"),
    ("Controllers found: many\n", "unexpected controller count 'many'"),
    ("Controllers found: 99999\n", "unexpected controller count '99999'"),
    ("Controllers found: 1\x00\xff\n", "NUL bytes"),
])
def test_garbage_version_answer_is_an_error(tmp_path: Path, version: str, expected: str) -> None:
    write_arcconf(tmp_path, [series8()], version=version)
    inv = discover(tmp_path)
    [err] = inv.errors
    assert err.index is None and expected in err.message and inv.controllers == []


def test_garbage_config_fails_that_controller_only(tmp_path: Path) -> None:
    write_arcconf(tmp_path, ["Controllers found: 1\n\x7fELF garbage : : :\n" * 50, series8()])
    inv = discover(tmp_path)
    assert [c.index for c in inv.controllers] == [2]
    [err] = inv.errors
    assert err.index == 1 and 'no "Controller Model"' in err.message


def test_huge_output_is_bounded_and_refused(tmp_path: Path) -> None:
    write_script(tmp_path / "arcconf", "yes 'Controllers found: 1' | head -c 5000000")
    [err] = discover(tmp_path, max_output=64 << 10).errors
    assert f"more than {64 << 10} bytes" in err.message


def test_huge_config_with_no_newlines_is_refused_not_parsed(tmp_path: Path) -> None:
    write_arcconf(tmp_path, ["x" * (2 << 20)])
    [err] = discover(tmp_path).errors
    assert err.index == 1 and "more than" in err.message


def test_non_zero_exit_is_an_error_with_the_tools_message(tmp_path: Path) -> None:
    write_arcconf(tmp_path, [series8()], exit_code=2)
    inv = discover(tmp_path)
    [err] = inv.errors
    assert "exited with status 2: Controllers found: 1" in err.message and inv.controllers == []


@pytest.mark.parametrize(("drop", "message"), [
    ("   Controller Model", 'no "Controller Model"'),
    ("   Write-cache setting", "unknown write-cache setting None"),
    ("   Read-cache setting", "unknown read-cache setting None"),
])
def test_missing_fields_fail_that_controller_naming_them(tmp_path: Path, drop: str, message: str) -> None:
    text = "\n".join(line for line in render(series8()).splitlines() if not line.startswith(drop))
    write_arcconf(tmp_path, [text, serveraid8()])
    inv = discover(tmp_path)
    assert [c.index for c in inv.controllers] == [2]
    [err] = inv.errors
    assert err.index == 1 and message in err.message


def test_optional_fields_missing_become_none(tmp_path: Path) -> None:
    keep = ("Installed memory", "Stripe-unit size", "Total Size", "Firmware", "Disk Name")
    text = "\n".join(line for line in render(series8()).splitlines()
                     if not line.strip().startswith(keep))
    write_arcconf(tmp_path, [text])
    [c] = discover(tmp_path).controllers
    assert (c.cache_size_bytes, c.firmware_version) == (None, None)
    assert {(v.strip_size_bytes, v.block_device) for v in c.virtual_drives} == {(None, None)}
    assert {d.size_bytes for d in c.physical_drives} == {None}


@pytest.mark.parametrize(("old", "new", "field"), [
    ("256 KB", "3 TB", "strip_size_bytes"),
    ("1024 MB", "4096 TB", "cache_size_bytes"),
    (": 3\n", ": -3\n", "media_errors"),  # drive 2's medium error count, the only 3
])
def test_values_out_of_range_fail_that_controller_naming_the_field(
        tmp_path: Path, old: str, new: str, field: str) -> None:
    text = render(series8())
    assert text.count(old) == 1
    write_arcconf(tmp_path, [text.replace(old, new)])
    [err] = discover(tmp_path).errors
    assert err.index == 1 and "out of range" in err.message and field in err.message


@pytest.mark.parametrize(("value", "bad"), [("Stripe-unit size", "256 parsecs"),
                                            ("Logical device number", "zero")])
def test_unreadable_values_are_errors(tmp_path: Path, value: str, bad: str) -> None:
    text = render(series8())
    text = text.replace("256 KB", bad) if value.startswith("Stripe") else text.replace(
        "Logical device number 0", f"Logical device number {bad}")
    write_arcconf(tmp_path, [text])
    [err] = discover(tmp_path).errors
    assert bad in err.message


def test_series8_is_read_in_full(tmp_path: Path) -> None:
    write_arcconf(tmp_path, [series8()])
    inv = discover(tmp_path)
    assert inv.errors == []
    [c] = inv.controllers
    assert (c.adapter, c.tool, c.index, c.model, c.serial, c.firmware_version, c.pci_address) == (
        "arcconf", str(tmp_path / "arcconf"), 1, "Adaptec ASR8805", "FAKE8805SN", "7.18-0 (33556)", "0:3:0:0")
    assert c.cache_size_bytes == 1024 << 20
    assert (c.backup.kind, c.backup.state, c.backup.optimal) == ("cachevault", "Ready", True)
    v0, v1 = c.virtual_drives
    assert (v0.id, v0.name, v0.raid_level, v0.state, v0.strip_size_bytes, v0.drive_count, v0.read_policy,
            v0.write_policy, v0.io_policy, v0.block_device) == (
        0, "data", "RAID5", "Optimal", 256 << 10, 4, "read-ahead", "write-back", None, "/dev/sdb")
    assert v0.drives == ["0:0", "0:1", "0:2", "0:3"]
    assert (v1.raid_level, v1.strip_size_bytes, v1.drive_count, v1.read_policy, v1.write_policy,
            v1.block_device, v1.drives) == (
        "RAID10", 64 << 10, 4, "no-read-ahead", "always-write-back", "/dev/sdc", ["0:4", "0:5", "0:6", "0:7"])
    assert len(c.physical_drives) == 8  # the enclosure device is not a drive
    assert {(d.state, d.interface, d.model) for d in c.physical_drives} == {
        ("Online", "SAS", "FAKEVNDR FK600SAS")}
    failing = [(d.slot, d.media_errors, d.predictive_failures, d.smart_alert)
               for d in c.physical_drives if d.media_errors]
    assert failing == [("0:2", 3, 1, True)]


def test_serveraid8_with_a_charging_battery(tmp_path: Path) -> None:
    write_arcconf(tmp_path, [serveraid8()])
    [c] = discover(tmp_path).controllers
    assert (c.model, c.firmware_version, c.cache_size_bytes) == ("ServeRAID 8k", "5.2-0 (15427)", 256 << 20)
    assert (c.backup.kind, c.backup.state, c.backup.optimal) == ("bbu", "Charging", False)
    [v] = c.virtual_drives
    assert (v.raid_level, v.strip_size_bytes, v.drive_count, v.read_policy, v.write_policy, v.block_device,
            v.drives) == ("RAID5", 128 << 10, 3, "read-ahead", "write-through", None, ["0,0", "0,1", "0,2"])
    assert [(d.slot, d.state) for d in c.physical_drives] == [
        ("0,0", "Online"), ("0,1", "Online"), ("0,2", "Online"), ("0,3", "Hot Spare")]
    assert all(d.media_errors is None for d in c.physical_drives)  # not reported: unknown, not 0


def test_absent_backup_unit_is_none(tmp_path: Path) -> None:
    text = render(serveraid8()).replace("Charging", "Not Installed")
    write_arcconf(tmp_path, [text])
    [c] = discover(tmp_path).controllers
    assert (c.backup.kind, c.backup.optimal) == ("none", False)


def test_no_controllers_is_not_an_error(tmp_path: Path) -> None:
    write_arcconf(tmp_path, [])
    inv = discover(tmp_path)
    assert inv.controllers == [] and inv.errors == []


def test_two_controllers_and_json_round_trip(tmp_path: Path) -> None:
    write_arcconf(tmp_path, [series8(), serveraid8()])
    inv = discover(tmp_path)
    assert [(c.index, c.model) for c in inv.controllers] == [(1, "Adaptec ASR8805"), (2, "ServeRAID 8k")]
    assert ControllerInventory.model_validate_json(inv.model_dump_json()) == inv


@pytest.mark.parametrize(("value", "expected"), [
    ("Enabled", "read-ahead"), ("Disabled", "no-read-ahead"), ("Enabled (adaptive)", "adaptive")])
def test_read_cache(value: str, expected: str) -> None:
    assert parse_read_cache(value, "ld 0") == expected


@pytest.mark.parametrize(("value", "expected"), [
    ("Disabled (write-through)", "write-through"),
    ("Enabled (write-back) when protected by battery/ZMM", "write-back"),
    ("Enabled (write-back) when protected by battery", "write-back"),
    ("Enabled (write-back)", "always-write-back"),
])
def test_write_cache(value: str, expected: str) -> None:
    assert parse_write_cache(value, "ld 0") == expected


def test_unknown_write_cache_is_refused() -> None:
    with pytest.raises(ToolFailure, match="unknown write-cache setting 'Sometimes'"):
        parse_write_cache("Sometimes", "ld 0")
