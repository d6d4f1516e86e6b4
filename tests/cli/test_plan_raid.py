"""`stortune plan raid`: computed on the spot, no control plane (nothing listens at --server)."""

from __future__ import annotations

import json

import pytest

from stortune.cli.main import main

NOWHERE = ["--server", "http://127.0.0.1:9"]  # nothing listens there: a call would fail


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main([*NOWHERE, "plan", "raid", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(("args", "words"), [
    (["--disks", "0", "--disk-iops", "180", "--read-pct", "70"], "--disks:"),
    (["--disks", "5000", "--disk-iops", "180", "--read-pct", "70"], "--disks:"),
    (["--disks", "8", "--disk-iops", "-5", "--read-pct", "70"], "--disk-iops:"),
    (["--disks", "8", "--disk-iops", "180", "--read-pct", "170"], "--read-pct:"),
    (["--disks", "8", "--disk-iops", "180", "--read-pct", "70", "--levels", "raid7"], "--levels:"),
    (["--disks", "8", "--disk-iops", "180", "--read-pct", "70", "--disk-size", "lots"], "--disk-size:"),
    (["--disks", "8", "--read-pct", "70"], "--disk-iops or --disk-class:"),
])
def test_bad_options_are_refused_naming_the_option(capsys: pytest.CaptureFixture[str], args: list[str],
                                                   words: str) -> None:
    code, out, err = run(capsys, *args)
    assert code == 1 and out == "" and words in err, err


@pytest.mark.parametrize("args", [["--disks", "x"], ["--disks", "8", "--disk-iops", "nan"],
                                  ["--disks", "8", "--disk-iops", "inf"]])
def test_options_that_are_not_numbers_are_usage_errors(capsys: pytest.CaptureFixture[str],
                                                       args: list[str]) -> None:
    code, _, err = run(capsys, *args, "--read-pct", "70")
    assert code == 1 and "is not" in err


def test_json_lists_one_entry_per_level_with_the_known_answers(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--disks", "16", "--disk-iops", "180", "--read-pct", "70",
                         "--disk-size", "600GB", "--levels", "raid10,raid5,raid6", "-o", "json")
    assert code == 0, err
    levels = json.loads(out)
    assert [e["level"] for e in levels] == ["raid10", "raid5", "raid6"]
    for entry in levels:
        assert {"level", "usableBytes", "randomIops", "faultTolerance", "warnings"} <= set(entry)
    raid10, raid5, raid6 = levels
    assert round(raid10["randomIops"]) == 2215 and round(raid5["randomIops"]) == 1516
    assert raid10["usableBytes"] == 8 * 600 * 10**9 and raid5["usableBytes"] == 15 * 600 * 10**9
    assert (raid10["faultTolerance"], raid5["faultTolerance"], raid6["faultTolerance"]) == (1, 1, 2)
    assert any("more than 8" in w for w in raid5["warnings"]) and raid6["warnings"] == []


def test_the_table_shows_each_level_and_its_warnings(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--disks", "9", "--disk-iops", "180", "--read-pct", "0",
                         "--levels", "10,5", "--need-iops", "1000")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["LEVEL", "DISKS"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert set(rows) == {"raid10", "raid5"}
    assert "810" in rows["raid10"] and "405" in rows["raid5"]  # pure writes: RAID5 half of RAID10
    assert "warning: raid5: a RAID5 of 9 disks" in err


def test_plan_needs_a_kind(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan"]) == 1
    assert "KIND" in capsys.readouterr().err
