"""``stortune import tuned`` / ``export tuned`` on real files: the profiles Debian's ``tuned``
package installs (read in place, never copied), and small hand-written hostile ones."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from stortune.cli.main import main
from stortune.cli.tuned import DirectorySource, read_bounded
from stortune.schemas.tuned import TunedFileError, import_profile
from tests.conftest import Golden

SHIPPED = Path("/usr/lib/tuned")
needs_tuned = pytest.mark.skipif(not (SHIPPED / "throughput-performance" / "tuned.conf").is_file(),
                                 reason="Debian package tuned is not installed (./dev test installs it)")


def shipped_profiles() -> list[str]:
    if not SHIPPED.is_dir():
        return ["throughput-performance"]  # reported as skipped by needs_tuned
    return sorted(p.parent.name for p in SHIPPED.glob("*/tuned.conf"))


def stortune(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def write(path: Path, text: str) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "tuned.conf").write_text(text, encoding="utf-8")
    return path


# Hostile files first ---------------------------------------------------------------------


def test_a_100_mb_profile_is_refused_without_reading_it(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    big = tmp_path / "big" / "tuned.conf"
    big.parent.mkdir()
    with big.open("wb") as fh:
        fh.truncate(100 * 1024 * 1024)  # sparse: costs no disk
    code, out, err = stortune(capsys, "import", "tuned", str(big.parent))
    assert code == 1 and out == ""
    assert f"{big}: larger than 1048576 bytes; not a TuneD profile" in err


def test_a_100_mb_include_is_skipped_and_the_rest_converted(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    big = write(tmp_path / "big", "")
    with (big / "tuned.conf").open("wb") as fh:
        fh.truncate(100 * 1024 * 1024)
    mine = write(tmp_path / "mine", "[main]\ninclude=big\n[disk]\nreadahead=1024\n")
    code, out, err = stortune(capsys, "import", "tuned", str(mine), "--tuned-dir", str(tmp_path / "none"))
    assert code == 0
    assert yaml.safe_load(out)["spec"]["rules"][0]["settings"] == {"read_ahead_kb": 1024}
    assert "skipped 'include = big': " in err and "larger than 1048576 bytes" in err


def test_hostile_exponential_variables_are_skipped_naming_the_variable(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 26: seven levels of a variable used 60 times, a 2 KiB file, ran past 90 s of CPU.
    levels = "".join(f"v{i}={f'${{v{i - 1}}}' * 60}\n" for i in range(1, 8))
    mine = write(tmp_path / "mine", f"[variables]\nv0=4096\n{levels}[disk]\nreadahead=${{v7}}\n"
                                    "[d2]\ntype=disk\ndevices=vd*\nreadahead=1024\n")
    code, out, err = stortune(capsys, "import", "tuned", str(mine), "--tuned-dir", str(tmp_path / "none"))
    assert code == 0  # the rest is converted
    assert yaml.safe_load(out)["spec"]["rules"][0]["settings"] == {"read_ahead_kb": 1024}
    assert "skipped 'readahead = ${v7}': ${v6} expands the value to 18000 characters, more than 16384" in err


def test_symlinks_fifos_and_binary_are_not_read(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("[disk]\nreadahead=4\n")
    link = tmp_path / "link" / "tuned.conf"
    link.parent.mkdir()
    link.symlink_to(secret)
    with pytest.raises(TunedFileError, match="is a symlink; not followed"):
        read_bounded(link)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(TunedFileError, match="not a regular file"):
        read_bounded(fifo)  # O_NONBLOCK: opening a FIFO with no writer does not hang
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe[disk]\n")
    with pytest.raises(TunedFileError, match="not UTF-8 text"):
        read_bounded(binary)


def test_include_cycle_and_escape_on_disk(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path / "a", "[main]\ninclude=b\n[disk]\nelevator=none\n")
    write(tmp_path / "b", "[main]\ninclude=a, ../../etc/passwd\n")
    code, out, err = stortune(capsys, "import", "tuned", str(tmp_path / "a" / "tuned.conf"), "-o", "json",
                              "--tuned-dir", str(tmp_path / "none"))
    assert code == 0
    assert json.loads(out)["spec"]["rules"] == [
        {"name": "disk", "match": {"kind": ["disk"]}, "settings": {"scheduler": "none"}}]
    a, b = tmp_path / "a" / "tuned.conf", tmp_path / "b" / "tuned.conf"
    assert f"include cycle: {a} -> {b} -> {a}" in err
    assert "skipped 'include = ../../etc/passwd': not a profile name" in err


def test_only_sysctl_lines_exit_1_with_every_line_listed(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path / "mem", "[sysctl]\nvm.swappiness=10\nvm.dirty_ratio=40\n")
    code, out, err = stortune(capsys, "import", "tuned", str(tmp_path / "mem"))
    assert code == 1 and out == ""
    assert err.count("kernel parameter (sysctl) outside stortune's catalog") == 2
    assert "no block-device setting to convert (2 lines skipped)" in err


def test_missing_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = stortune(capsys, "import", "tuned", str(tmp_path / "nope"))
    assert code == 1 and "No such file or directory" in err


# Real TuneD profiles ---------------------------------------------------------------------


@needs_tuned
@pytest.mark.parametrize("name", shipped_profiles())
def test_shipped_profile_matches_golden(name: str, golden: Golden) -> None:
    source = DirectorySource([str(SHIPPED)])  # not /etc/tuned: the host's own profiles would leak in
    found = source.find(name, None)
    assert found is not None
    result = import_profile(found, name, source)
    profile = result.profile()

    def rel(where: str) -> str:
        return where.replace(f"{SHIPPED}/", "TUNED/")

    golden.check(f"tuned/{name}.json", {
        "profile": profile.document() if profile else None,
        "files": [rel(f) for f in result.files],
        "notes": [rel(n) for n in result.notes],
        "skipped": [f"{rel(s.where)}: {s.line} -- {s.reason}" for s in result.skipped],
    })


@needs_tuned
def test_throughput_performance_and_its_includers(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = stortune(capsys, "import", "tuned", str(SHIPPED / "throughput-performance"))
    assert code == 0
    document = yaml.safe_load(out)
    assert document["metadata"]["name"] == "tuned-throughput-performance"
    # readahead=>4096: KiB, "only raise" kept as a plain value, and said so.
    assert document["spec"]["rules"] == [
        {"name": "disk", "match": {"kind": ["disk"]}, "settings": {"read_ahead_kb": 4096}}]
    assert "readahead '>' (only raise) became read_ahead_kb = 4096" in err
    assert "skipped 'vm.swappiness = 10'" in err and "skipped 'governor = performance'" in err
    for includer in ("virtual-guest", "virtual-host", "enterprise-storage"):
        code, out, err = stortune(capsys, "import", "tuned", str(SHIPPED / includer))
        assert code == 0, err
        assert yaml.safe_load(out)["spec"]["rules"] == document["spec"]["rules"]
        assert f"{SHIPPED}/throughput-performance/tuned.conf:28: readahead" in err


@needs_tuned
def test_export_then_import_round_trips(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = stortune(capsys, "import", "tuned", str(SHIPPED / "throughput-performance"))
    assert code == 0
    (tmp_path / "tp.yaml").write_text(out)
    code, out, err = stortune(capsys, "export", "tuned", "-f", str(tmp_path / "tp.yaml"),
                              "-o", str(tmp_path / "back"))
    assert code == 0 and err == ""
    text = (tmp_path / "back" / "tuned.conf").read_text()
    assert "[disk-disk]\ntype=disk\nreadahead=4096\n" in text
    assert "summary=Broadly applicable tuning" in text
    code, again, err = stortune(capsys, "import", "tuned", str(tmp_path / "back"))
    assert code == 0 and err == ""
    assert yaml.safe_load(again)["spec"]["rules"] == [
        {"name": "disk-disk", "match": {"kind": ["disk"]}, "settings": {"read_ahead_kb": 4096}}]


def test_export_refuses_an_invalid_document(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.yaml").write_text("apiVersion: stortune/v1\nkind: StorageProfile\nmetadata: {name: x}\n"
                                       "spec: {rules: [{name: r, match: {kind: [disk]},"
                                       " settings: {read_ahead_kb: 4097}}]}\n")
    code, out, err = stortune(capsys, "export", "tuned", "-f", str(tmp_path / "bad.yaml"))
    assert code == 1 and out == ""
    assert "read_ahead_kb" in err and "multiple of 4" in err
