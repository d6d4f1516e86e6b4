"""Vendor tool numbers Python itself refuses: a float too large for an int, an int past the
4,300 digit limit, a digit int() does not read (``²``). Each must fail that controller only
(never the tool's other controllers) and a write's answer holding one must fail that write."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from stortune.agent import local
from stortune.agent.controllers.access import ControllerAccess
from stortune.agent.controllers.arcconf import ArcconfAdapter
from stortune.agent.controllers.discover import discover_controllers
from stortune.agent.controllers.smartarray import SmartArrayAdapter
from stortune.agent.tools import ToolRunner
from stortune.schemas.controllers import ControllerInventory
from tests.agent.test_controller_apply import Host, profile, set_commands
from tests.fixtures.arcconf_tool import render, series8, version_text, write_arcconf
from tests.fixtures.diag_hosts import write_script
from tests.fixtures.raid_fakes import fake_megaraid
from tests.fixtures.raid_tools import answers_for, modern, write_megaraid_tool
from tests.fixtures.scenarios import perc_managed
from tests.fixtures.ssacli_tool import config_text, gen10, write_ssacli

HUGE = "9" * 5000


def discover(bin_dir: Path, adapters: tuple[object, ...] | None = None) -> ControllerInventory:
    runner = ToolRunner([bin_dir], timeout=10.0, max_output=1 << 20)
    return discover_controllers(runner, *([list(adapters)] if adapters else []))  # type: ignore[arg-type]


@pytest.mark.parametrize(("where", "value", "expected"), [
    ("strip", "9" * 400 + " KB", "unreadable size"),  # float() says inf: round() overflows
    ("size", HUGE + " MB", "unreadable size"),
    ("did", HUGE, "expected a number"),  # int() refuses more than 4,300 digits
    ("dg", "²/0", None),  # isdigit() says yes, int() says no: the drive group is unknown
])
def test_hostile_megaraid_numbers_python_refuses_fail_that_controller_only(
        tmp_path: Path, where: str, value: str, expected: str | None) -> None:
    show, vall, _ = bad = modern(1)
    if where == "strip":
        vall["VD0 Properties"]["Strip Size"] = value
    elif where == "size":
        vall["/c1/v0"][0]["Size"] = value
    elif where == "did":
        show["PD LIST"][0]["DID"] = value
    else:
        vall["/c1/v0"][0]["DG/VD"] = value
    write_megaraid_tool(tmp_path, "storcli64", answers_for(modern(0), bad))
    inv = discover(tmp_path)
    if expected is None:
        assert inv.errors == [] and inv.controllers[1].virtual_drives[0].drive_group is None
        return
    assert [c.index for c in inv.controllers] == [0]
    [err] = inv.errors
    assert err.index == 1 and expected in err.message and "adapter failed" not in err.message


def test_hostile_megaraid_index_and_vd_keys_in_other_scripts_are_not_numbers(tmp_path: Path) -> None:
    good = modern(0)
    good[1]["/c0/v\u0661"] = good[1].pop("/c0/v1")  # ARABIC-INDIC DIGIT ONE: not volume 1
    write_megaraid_tool(tmp_path, "storcli64", answers_for(good))
    inv = discover(tmp_path)
    assert [v.id for v in inv.controllers[0].virtual_drives] == [0]


def test_hostile_megaraid_a_number_of_5000_digits_is_not_json(tmp_path: Path) -> None:
    answers = answers_for(modern(0))
    write_megaraid_tool(tmp_path, "storcli64", {**answers, "/call/eall/sall show all J":
                                                f'{{"Controllers": [{HUGE}]}}'})
    [err] = discover(tmp_path).errors
    assert err.index is None and "did not print JSON" in err.message and "adapter failed" not in err.message


@pytest.mark.parametrize(("old", "new"), [
    ("in Slot 1 ", "in Slot ² "),
    ("Logical Drive: 1\n", "Logical Drive: ²\n"),
    ("Cache Ratio: 10% Read", "Cache Ratio: ¹⁰% Read"),
])
def test_hostile_ssacli_superscript_digits_fail_that_controller_only(
        tmp_path: Path, old: str, new: str) -> None:
    bad = config_text(gen10(1))
    assert old in bad
    write_ssacli(tmp_path, config_text(gen10(0)) + bad.replace(old, new, 1))
    inv = discover(tmp_path, (SmartArrayAdapter(),))
    assert [c.index for c in inv.controllers] == [0]
    [err] = inv.errors
    assert "adapter failed" not in err.message


@pytest.mark.parametrize(("old", "new"), [
    ("Logical device number 0", "Logical device number ²"),
    ("Controllers found: 2", "Controllers found: ²"),
])
def test_hostile_arcconf_superscript_digits_are_the_tools_error(tmp_path: Path, old: str, new: str) -> None:
    text = render(series8())
    assert old in text + version_text(2)
    write_arcconf(tmp_path, [text.replace(old, new), text], version=version_text(2).replace(old, new))
    inv = discover(tmp_path, (ArcconfAdapter(),))
    [err] = inv.errors
    assert "adapter failed" not in err.message
    if old.startswith("Logical"):
        assert [c.index for c in inv.controllers] == [2] and err.index == 1


def test_hostile_a_set_answer_python_cannot_parse_fails_and_rolls_back_the_apply(tmp_path: Path) -> None:
    # the write happens, then storcli answers with a number json.loads refuses (ValueError,
    # not JSONDecodeError): the apply must fail that write and put the controller back
    fs = perc_managed(tmp_path / "host")
    real = tmp_path / "real"
    tool = fake_megaraid(real, ("modern",), name="perccli64")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    write_script(bin_dir / "perccli64",
                 f'case " $* " in *" set "*) "{real}/perccli64" "$@" >/dev/null;'
                 f" echo '{{\"Controllers\": [{HUGE}]}}';; *) exec \"{real}/perccli64\" \"$@\";; esac")
    access = ControllerAccess(ToolRunner([str(bin_dir)], timeout=10), ttl=0)
    host = Host(dataclasses.replace(fs, controllers=access), tool, bin_dir, tmp_path / "state")
    before = host.policy()
    report = local.apply(host.fs, [profile({"controller_read_ahead": "no-read-ahead"})], host.state)
    assert not report.ok
    [row] = [r for r in report.rows if r.tunable == "controller_read_ahead"]
    assert row.status == "failed" and "without a JSON answer" in row.message, row
    assert host.policy() == before
    assert [c.split()[-2] for c in set_commands(tool)] == ["rdcache=NoRA", "rdcache=RA"]
