"""Controller discovery through fake storcli64/perccli64 on a tool path: hostile answers first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stortune.agent.controllers.discover import discover_controllers
from stortune.agent.controllers.megaraid import parse_cache_flags, parse_size
from stortune.agent.tools import ToolRunner
from stortune.schemas.controllers import MAX_CONTROLLERS, ControllerInventory
from tests.fixtures.diag_hosts import write_script
from tests.fixtures.raid_tools import (
    SALL,
    SHOW,
    VALL,
    answers_for,
    legacy,
    modern,
    status,
    write_megaraid_tool,
)


def discover(bin_dir: Path, timeout: float = 10.0, max_output: int = 1 << 20) -> ControllerInventory:
    return discover_controllers(ToolRunner([bin_dir], timeout=timeout, max_output=max_output))


def healthy_perc(bin_dir: Path) -> None:
    write_megaraid_tool(bin_dir, "perccli64", answers_for(legacy()))


def test_no_tool_means_not_managed_not_an_error(tmp_path: Path) -> None:
    (tmp_path / "storcli64").write_text("not executable")  # present but not runnable: not a tool
    inv = discover(tmp_path)
    assert inv.controllers == [] and inv.errors == []
    assert inv.unmanaged == ["megaraid", "perc", "arcconf", "smartarray"]


def test_a_hanging_tool_times_out_and_the_other_tool_is_still_read(tmp_path: Path) -> None:
    write_script(tmp_path / "storcli64", "sleep 60")
    healthy_perc(tmp_path)
    inv = discover(tmp_path, timeout=0.5)
    [err] = inv.errors
    assert err.adapter == "megaraid" and err.index is None
    assert "did not finish within 0.5 s" in err.message and "/call show all J" in err.message
    assert [c.model for c in inv.controllers] == ["PERC H710 Mini"]


def test_garbage_output_is_an_error_naming_the_command(tmp_path: Path) -> None:
    write_megaraid_tool(tmp_path, "storcli64", {SHOW: "Segmentation fault\n\x00\xff{", VALL: "", SALL: ""})
    healthy_perc(tmp_path)
    inv = discover(tmp_path)
    [err] = inv.errors
    assert "did not print JSON" in err.message and "Segmentation fault" in err.message
    assert len(inv.controllers) == 1


def test_huge_output_is_bounded_and_refused(tmp_path: Path) -> None:
    write_script(tmp_path / "storcli64", "yes '{\"Controllers\": [' | head -c 5000000")
    inv = discover(tmp_path, max_output=64 << 10)
    [err] = inv.errors
    assert f"more than {64 << 10} bytes" in err.message


def test_deeply_nested_json_is_an_error_not_a_crash(tmp_path: Path) -> None:
    write_megaraid_tool(tmp_path, "storcli64", {SHOW: "[" * 200_000, VALL: "{}", SALL: "{}"})
    [err] = discover(tmp_path).errors
    assert "nested too deeply" in err.message


def test_non_zero_exit_is_an_error_with_the_tools_message(tmp_path: Path) -> None:
    answers = answers_for(modern())
    write_megaraid_tool(tmp_path, "storcli64", answers, exit_code=3)
    inv = discover(tmp_path)
    [err] = inv.errors
    assert "exited with status 3" in err.message and inv.controllers == []


@pytest.mark.parametrize("doc", [
    [], {"Controllers": {}}, {"Controllers": [{"Response Data": {}}]},
    {"Controllers": [{"Command Status": {"Controller": "zero", "Status": "Success"}, "Response Data": {}}]},
    {"Controllers": [{"Command Status": {"Controller": 0, "Status": "Success"}}]},
])
def test_json_of_the_wrong_shape_is_an_error(tmp_path: Path, doc: object) -> None:
    write_megaraid_tool(tmp_path, "storcli64", {SHOW: json.dumps(doc), VALL: "{}", SALL: "{}"})
    [err] = discover(tmp_path).errors
    assert "unexpected JSON" in err.message


def test_a_controller_without_model_or_with_unknown_policy_fails_alone(tmp_path: Path) -> None:
    good, bad = modern(0), modern(1)
    bad[0]["Basics"].pop("Model")
    answers = answers_for(good, bad)
    write_megaraid_tool(tmp_path, "storcli64", answers)
    inv = discover(tmp_path)
    assert [c.index for c in inv.controllers] == [0]
    assert [(e.index, "Model" in e.message) for e in inv.errors] == [(1, True)]

    bad = modern(1)
    bad[1]["/c1/v0"][0]["Cache"] = "XYZD"
    write_megaraid_tool(tmp_path, "storcli64", answers_for(good, bad))
    inv = discover(tmp_path)
    assert [c.index for c in inv.controllers] == [0]
    assert "unknown cache policy 'XYZD'" in inv.errors[0].message


@pytest.mark.parametrize(("where", "value", "field"), [
    ("strip", "3 TB", "strip_size_bytes"),
    ("media", -5, "media_errors"),
    ("cache", "4096 TB", "cache_size_bytes"),
    ("span", 5000, "drive_count"),
])
def test_values_out_of_range_fail_that_controller_naming_the_field(
        tmp_path: Path, where: str, value: object, field: str) -> None:
    show, vall, sall = modern()
    if where == "strip":
        vall["VD0 Properties"]["Strip Size"] = value
    elif where == "media":
        sall["Drive /c0/e64/s1 - Detailed Information"]["Drive /c0/e64/s1 State"]["Media Error Count"] = value
    elif where == "cache":
        show["HwCfg"]["On Board Memory Size"] = value
    else:
        vall["VD0 Properties"]["Number of Drives Per Span"] = value
    write_megaraid_tool(tmp_path, "storcli64", answers_for((show, vall, sall)))
    [err] = discover(tmp_path).errors
    assert err.index == 0 and "out of range" in err.message and field in err.message


def test_a_failed_command_status_fails_that_controller_only(tmp_path: Path) -> None:
    answers = answers_for(modern(0), modern(1))
    show = answers[SHOW]
    assert isinstance(show, dict)
    show["Controllers"][1] = {"Command Status": status(1, ok=False, description="Controller not responding")}
    write_megaraid_tool(tmp_path, "storcli64", answers)
    inv = discover(tmp_path)
    assert [c.index for c in inv.controllers] == [0]
    assert [(e.index, e.message) for e in inv.errors] == [(1, "controller 1: Controller not responding")]


def test_hostile_tools_listing_more_controllers_than_a_host_has_are_kept_bounded(tmp_path: Path) -> None:
    # Two tools of 520 controllers each: the inventory keeps 1,024 (what an uploaded topology
    # may carry) and says what it left out, instead of failing the host's discovery.
    write_megaraid_tool(tmp_path, "storcli64", answers_for(*(modern(i) for i in range(520))))
    write_megaraid_tool(tmp_path, "perccli64", answers_for(*(legacy(i) for i in range(520))))
    inv = discover(tmp_path, max_output=64 << 20)
    assert len(inv.controllers) == MAX_CONTROLLERS
    [err] = inv.errors
    assert err.adapter == "perc" and "reported 520 controllers; 504 kept" in err.message
    assert ControllerInventory.model_validate_json(inv.model_dump_json()) == inv


def test_modern_megaraid_is_read_in_full(tmp_path: Path) -> None:
    write_megaraid_tool(tmp_path, "storcli64", answers_for(modern()))
    inv = discover(tmp_path)
    assert inv.errors == [] and inv.unmanaged == ["perc", "arcconf", "smartarray"]
    [c] = inv.controllers
    assert (c.adapter, c.tool, c.model, c.firmware_version, c.firmware_package, c.driver) == (
        "megaraid", str(tmp_path / "storcli64"), "MegaRAID 9460-8i", "5.140.00-3319", "51.14.0-3900",
        "megaraid_sas")
    assert c.cache_size_bytes == 2048 << 20
    assert (c.backup.kind, c.backup.state, c.backup.optimal) == ("cachevault", "Optimal", True)
    v0, v1 = c.virtual_drives
    assert (v0.raid_level, v0.strip_size_bytes, v0.drive_count, v0.read_policy, v0.write_policy,
            v0.io_policy, v0.drive_cache, v0.wwn, v0.name) == (
        "RAID5", 256 << 10, 4, "read-ahead", "write-back", "direct", "default", "600062b2fake0000", "data")
    assert v0.drives == ["64:0", "64:1", "64:2", "64:3"]
    assert (v1.raid_level, v1.strip_size_bytes, v1.drive_count, v1.span_depth, v1.read_policy,
            v1.write_policy, v1.io_policy, v1.drive_cache) == (
        "RAID10", 64 << 10, 4, 2, "no-read-ahead", "always-write-back", "cached", "disabled")
    failing = [d for d in c.physical_drives if d.media_errors]
    assert [(d.slot, d.media_errors, d.predictive_failures, d.smart_alert) for d in failing] == [
        ("64:2", 7, 1, True)]
    assert len(c.physical_drives) == 8 and {d.state for d in c.physical_drives} == {"Onln"}


def test_legacy_perc_with_bbu_and_adaptive_read_ahead(tmp_path: Path) -> None:
    healthy_perc(tmp_path)
    [c] = discover(tmp_path).controllers
    assert (c.adapter, c.model, c.firmware_version, c.cache_size_bytes) == (
        "perc", "PERC H710 Mini", "3.130.05-2086", 512 << 20)
    assert (c.backup.kind, c.backup.state, c.backup.optimal) == ("bbu", "Learning", False)
    [v] = c.virtual_drives
    assert (v.read_policy, v.write_policy, v.io_policy, v.drive_count, v.wwn) == (
        "adaptive", "write-through", "direct", 3, None)
    assert all(d.media_errors is None for d in c.physical_drives)  # not reported: unknown, not 0


def test_controller_without_virtual_drives(tmp_path: Path) -> None:
    show, _, sall = modern()
    answers = answers_for((show, {}, sall))
    no_vds = status(0, ok=False, description="No VDs have been configured")
    answers[VALL] = {"Controllers": [{"Command Status": no_vds}]}
    write_megaraid_tool(tmp_path, "storcli64", answers)
    inv = discover(tmp_path)
    assert inv.errors == [] and inv.controllers[0].virtual_drives == []


def test_inventory_round_trips_as_json(tmp_path: Path) -> None:
    write_megaraid_tool(tmp_path, "storcli64", answers_for(modern(), legacy(1)))
    inv = discover(tmp_path)
    assert ControllerInventory.model_validate_json(inv.model_dump_json()) == inv
    assert [c.index for c in inv.controllers] == [0, 1]


@pytest.mark.parametrize(("flags", "expected"), [
    ("RWBD", ("read-ahead", "write-back", "direct")),
    ("NRWTD", ("no-read-ahead", "write-through", "direct")),
    ("ADRAAWBC", ("adaptive", "always-write-back", "cached")),
    ("RAWBC", ("read-ahead", "always-write-back", "cached")),
])
def test_cache_flags(flags: str, expected: tuple[str, str, str]) -> None:
    assert parse_cache_flags(flags, 0) == expected


def test_sizes() -> None:
    assert [parse_size(s) for s in ("64 KB", "2048MB", "1 MB", "NA", None)] == [
        64 << 10, 2048 << 20, 1 << 20, None, None]




def test_cli_lists_controllers_and_exits_1_when_one_failed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from stortune.agent.cli import main

    write_megaraid_tool(tmp_path, "storcli64", answers_for(modern()))
    assert main(["controllers", "--tool-path", str(tmp_path), "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["unmanaged"] == ["perc", "arcconf", "smartarray"]
    assert doc["controllers"][0]["model"] == "MegaRAID 9460-8i"

    write_script(tmp_path / "perccli64", "echo 'perccli: license expired' >&2; exit 4")
    assert main(["controllers", "--tool-path", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "RAID10" in out and "always-write-back" in out and "64:2" in out
    assert "exited with status 4: perccli: license expired" in out
