"""``stortune-agent diag`` end to end on a fixture host: redacted by default, mapping kept private."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

from stortune.schemas.bundle import unpack, verify
from stortune.schemas.redact import RedactionMapping
from tests.fixtures.diag_hosts import DIAG_HOSTS, build


def diag(fs_root: Path, bin_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stortune.agent.cli", "diag", "--sysfs", str(fs_root / "sys"),
         "--procfs", str(fs_root / "proc"), "--tool-path", str(bin_dir), *args],
        capture_output=True, text=True, timeout=120, check=False, cwd=cwd)


def test_diag_writes_a_redacted_bundle_and_a_private_mapping(tmp_path: Path) -> None:
    fs, bin_dir = build(DIAG_HOSTS["san_multipath"], tmp_path)
    out = tmp_path / "out" / "db.tar.gz"
    out.parent.mkdir()
    done = diag(fs.sysfs.parent, bin_dir, "-o", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    mapping_file = out.with_name("db.tar.gz.mapping.json")
    assert f"token -> real value mapping: {mapping_file} (mode 0600)" in done.stderr
    assert "not installed: storcli" in done.stderr and "redacted (hostname 1, ip 4" in done.stderr
    assert stat.S_IMODE(mapping_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    data = out.read_bytes()
    assert verify(data) == []
    bundle = unpack(data)
    mapping = RedactionMapping.model_validate_json(mapping_file.read_text())
    assert mapping.values["hostname"] == {"HOST-0001": "db01"}
    assert "PHYF812300AB480BGN" in mapping.values["serial"].values()
    assert bundle.info.host == "HOST-0001" and bundle.info.redaction is not None
    assert not any(b"PHYF812300AB480BGN" in d or b"db01" in d for d in bundle.files.values())


def test_no_redact_keeps_values_and_writes_no_mapping(tmp_path: Path) -> None:
    fs, bin_dir = build(DIAG_HOSTS["san_multipath"], tmp_path)
    done = diag(fs.sysfs.parent, bin_dir, "--no-redact", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (written,) = tmp_path.glob("stortune-diag-*.tar.gz")
    assert written.name.startswith("stortune-diag-db01-")
    assert not list(tmp_path.glob("*.mapping.json"))
    assert "NOT redacted" in done.stderr
    bundle = unpack(written.read_bytes())
    assert bundle.info.redaction is None
    assert json.loads(bundle.files["topology.json"])["hostname"] == "db01"
    assert b"PHYF812300AB480BGN" in bundle.files["commands/lsblk.json"]


def test_default_name_does_not_carry_the_hostname_when_redacted(tmp_path: Path) -> None:
    fs, bin_dir = build(DIAG_HOSTS["md_raid5_fileserver"], tmp_path)
    done = diag(fs.sysfs.parent, bin_dir, "--tool-timeout", "5", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (written,) = tmp_path.glob("stortune-diag-*.tar.gz")
    assert written.name.startswith("stortune-diag-HOST-0001-")
    assert (tmp_path / f"{written.name}.mapping.json").exists()


def test_an_unwritable_output_is_a_clear_error(tmp_path: Path) -> None:
    fs, bin_dir = build(DIAG_HOSTS["md_raid5_fileserver"], tmp_path)
    done = diag(fs.sysfs.parent, bin_dir, "-o", str(tmp_path / "no" / "such" / "b.tgz"), cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip() == (f"error: diag: cannot write {tmp_path}/no/such/b.tgz: No such file or"
                                   " directory; choose another -o FILE")
