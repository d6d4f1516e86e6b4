"""``stortune-agent analyze`` end to end on fixture hosts: the JSON is a HostAnalysis dump,
diffed against golden files.

Regenerate the goldens after an intended change (and review the diff):

    .venv/bin/pytest tests/agent/test_analyze_cli.py --update-golden
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stortune.agent.cli import main
from stortune.agent.kernelfs import KernelFS
from stortune.agent.probe.store import MEASURED, probes_dir
from stortune.schemas.analysis.model import HostAnalysis, MeasuredCeiling
from tests.conftest import Golden
from tests.fixtures.scenarios import SCENARIOS

GOLDEN_HOSTS = ["san_8gfc_24lun", "perc_streamer", "md_raid5_fileserver"]


def analyze(fs: KernelFS, state: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    code = main(["analyze", "--sysfs", str(fs.sysfs), "--procfs", str(fs.procfs),
                 "--state-dir", str(state), *extra])
    out = capsys.readouterr()
    assert code == 0, out.err
    return out.out


def device(doc: dict[str, object], name: str) -> dict[str, object]:
    devices = doc["devices"]
    assert isinstance(devices, list)
    return next(d for d in devices if d["device"] == name)


@pytest.mark.parametrize("host", GOLDEN_HOSTS)
def test_json_matches_golden(host: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                             golden: Golden) -> None:
    fs = SCENARIOS[host](tmp_path / host)
    doc = json.loads(analyze(fs, tmp_path / "no-state", capsys, "-o", "json"))
    HostAnalysis.model_validate(doc)
    golden.check(f"analysis/{host}.json", doc)


def test_san_luns_top_out_at_both_fc_ports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fs = SCENARIOS["san_8gfc_24lun"](tmp_path / "h")
    doc = json.loads(analyze(fs, tmp_path / "s", capsys, "-o", "json"))
    luns = [d for d in doc["devices"] if d["kind"] == "dm"]
    assert len(luns) == 24
    for lun in luns:
        assert lun["limit"] == "host1+host2 qla2xxx"
        assert lun["ceilingBytesPerSecond"] == pytest.approx(2 * 797e6)
        port = next(la for la in lun["layers"] if la["kind"] == "port")
        assert port["source"] == "2 x 797 MB/s (8GFC) = 1,594 MB/s"
        assert [p["source"] for p in port["parts"]] == [
            f"fc_host/host{n}/speed 8 Gbit: 8.5 GBd 8b/10b, FCP payload = 797 MB/s" for n in (1, 2)]
        assert set(lun["layers"][0]) >= {"name", "kind", "ceilingBytesPerSecond", "source"}


def test_fileserver_names_the_misaligned_member(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fs = SCENARIOS["md_raid5_fileserver"](tmp_path / "h")
    doc = json.loads(analyze(fs, tmp_path / "s", capsys, "-o", "json"))
    checks = device(doc, "sdd1")["checks"]
    assert isinstance(checks, list)
    assert any(c["code"] == "partition-misaligned" and c["severity"] in ("warning", "error")
               for c in checks)
    assert all(set(c) >= {"severity", "code", "message"} for c in checks)


def test_stored_probe_ceilings_replace_the_estimates(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    fs = SCENARIOS["md_raid5_fileserver"](tmp_path / "h")
    state = tmp_path / "state"
    probes_dir(state).mkdir(parents=True)
    figures = [MeasuredCeiling(device=f"sd{x}", read_bytes_per_second=180e6, read_iops=200,
                               run_id="p1") for x in "bcdef"]
    figures[2] = MeasuredCeiling(device="sdd", read_bytes_per_second=60e6, run_id="p1")
    (probes_dir(state) / MEASURED).write_text(json.dumps([f.model_dump(mode="json") for f in figures]))
    doc = json.loads(analyze(fs, state, capsys, "-o", "json"))
    md = device(doc, "md126")
    disks = next(la for la in md["layers"] if la["kind"] == "disk")  # type: ignore[union-attr]
    assert disks["ceilingBytesPerSecond"] == pytest.approx(4 * 180e6 + 60e6)
    assert disks["estimate"] is False
    assert [m["device"] for m in doc["measured"]] == ["sdb", "sdc", "sdd", "sde", "sdf"]


def test_a_corrupt_probe_store_falls_back_to_estimates(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    fs = SCENARIOS["md_raid5_fileserver"](tmp_path / "h")
    state = tmp_path / "state"
    probes_dir(state).mkdir(parents=True)
    (probes_dir(state) / MEASURED).write_text('[{"device": "sdb", "readBytesPerSecond": "lots"}')
    doc = json.loads(analyze(fs, state, capsys, "-o", "json"))
    assert doc["measured"] == []
    assert device(doc, "md126")["ceilingBytesPerSecond"] == pytest.approx(750e6)


def test_table_shows_the_layer_tree_and_checks(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    fs = SCENARIOS["md_raid5_fileserver"](tmp_path / "h")
    text = analyze(fs, tmp_path / "s", capsys)
    # the layout of `stortune analyze host` (schemas.analysis.render)
    block = text.split("md126 (md): ", 1)[1]
    assert block.startswith("ceiling 750 MB/s, limited by sdb..sdf\n")
    assert "5 x 600 MB/s (SATA 6 Gbps) = 3,000 MB/s" in block
    checks = text.split("\nChecks\n", 1)[1].splitlines()
    assert any(line.split()[:3] == ["warning", "partition-misaligned", "sdd1"] for line in checks)


def test_unreadable_roots_are_an_empty_analysis_not_a_crash(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    fs = KernelFS.at(tmp_path / "nosys", tmp_path / "noproc")
    doc = json.loads(analyze(fs, tmp_path / "s", capsys, "-o", "json"))
    assert doc["devices"] == [] and doc["checks"] == []


def test_the_topology_listing_shows_the_layout_checks(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    fs = SCENARIOS["md_raid5_fileserver"](tmp_path / "host")
    code = main(["topology", "--sysfs", str(fs.sysfs), "--procfs", str(fs.procfs)])
    out = capsys.readouterr().out
    assert code == 0
    assert "raid5 chunk=512KiB members=5" in out
    checks = out[out.index("layout checks"):].splitlines()
    assert any("partition-misaligned" in line and "sdd1" in line and "sector 63" in line for line in checks)
    assert any("fs-geometry" in line and "md126" in line and "swidth=4096" in line for line in checks)
    # a share the host's stripe caches exceed turns the cost into a warning
    main(["topology", "--sysfs", str(fs.sysfs), "--procfs", str(fs.procfs),
          "--stripe-cache-ram-share", "0.0001"])
    strict = capsys.readouterr().out
    assert any(line.startswith("warning") and "stripe-cache-ram" in line for line in strict.splitlines())
