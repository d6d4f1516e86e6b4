"""Choosing a benchmark's target, and refusing writes that would destroy something."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from stortune.agent import discovery
from stortune.agent.bench.errors import BenchmarkError, UnsafeTargetError
from stortune.agent.bench.files import BenchFiles
from stortune.agent.bench.targets import check_safety, resolve
from stortune.agent.kernelfs import KernelFS
from stortune.schemas.bench.spec import BenchmarkSpec, parse_benchmark
from stortune.schemas.topology import Topology
from tests.agent.test_bench_signatures import write_bluestore_label
from tests.fixtures.scenarios import md_raid5_fileserver
from tests.fixtures.sysfs_builder import SysfsBuilder

MiB = 1 << 20


def spec(target: dict[str, object], *workloads: dict[str, object], destructive: bool = True) -> BenchmarkSpec:
    return parse_benchmark(yaml.safe_load(yaml.safe_dump({
        "apiVersion": "stortune/v1", "kind": "BenchmarkSpec", "metadata": {"name": "t"},
        "spec": {"target": target, "allowDestructive": destructive,
                 "workloads": list(workloads) or [{"preset": "iometer-4k", "runtime": "1s"}]},
    })))


def nodes(fs: KernelFS, topology: Topology) -> None:
    """Device nodes in the fixture's /dev: sparse files as large as the devices."""
    fs.dev.mkdir(parents=True, exist_ok=True)
    for dev in topology.devices:
        with open(fs.device_node(dev.name), "wb") as fh:
            fh.truncate(dev.size_bytes or MiB)


@pytest.fixture
def fileserver(tmp_path: Path) -> tuple[KernelFS, Topology]:
    fs = md_raid5_fileserver(tmp_path / "host")
    topology = discovery.discover(fs)
    nodes(fs, topology)
    return fs, topology


def refusal(fs: KernelFS, topology: Topology, name: str) -> list[str]:
    s = spec({"device": {"name": [name]}})
    resolved = resolve(fs, s, topology)
    with pytest.raises(UnsafeTargetError) as err:
        check_safety(resolved, s.steps(resolved.info.facts), s.spec.allowDestructive)
    return err.value.reasons


def test_a_mounted_array_is_refused(fileserver: tuple[KernelFS, Topology]) -> None:
    assert refusal(*fileserver, "md126") == ["md126 is mounted at /export (xfs)"]


def test_an_array_member_is_refused_for_its_holder(fileserver: tuple[KernelFS, Topology]) -> None:
    assert refusal(*fileserver, "sdc1") == ["sdc1 has holders md126 (something is built on it)"]


def test_a_partitioned_disk_is_refused(fileserver: tuple[KernelFS, Topology]) -> None:
    assert refusal(*fileserver, "sdc") == ["sdc has partitions sdc1"]


def test_reads_are_allowed_on_a_busy_array(fileserver: tuple[KernelFS, Topology]) -> None:
    fs, topology = fileserver
    s = spec({"device": {"name": ["md126"]}}, {"preset": "stream-32k"}, destructive=False)
    resolved = resolve(fs, s, topology)
    check_safety(resolved, s.steps(resolved.info.facts), allow_destructive=False)
    assert resolved.info.facts.drives == 5  # five RAID5 members
    assert [s.iodepth for s in spec({"device": {"name": ["md126"]}}).steps(resolved.info.facts)] == [10] * 3


def test_without_allow_destructive_every_write_is_refused(fileserver: tuple[KernelFS, Topology]) -> None:
    fs, topology = fileserver
    s = spec({"device": {"name": ["md126"]}})
    resolved = resolve(fs, s, topology)
    with pytest.raises(UnsafeTargetError) as err:
        check_safety(resolved, s.steps(resolved.info.facts), allow_destructive=False)
    assert err.value.reasons[0] == ("allowDestructive is not true and iometer-4k/randwrite,"
                                    " iometer-4k/oltp write to the raw device, destroying its contents")
    assert str(err.value).startswith(f"refusing to write to {fs.dev}/md126: ")


def test_the_target_must_be_exactly_one_device(fileserver: tuple[KernelFS, Topology]) -> None:
    fs, topology = fileserver
    with pytest.raises(BenchmarkError, match=r"matches 6 devices \(sda, sdb, sdc, sdd, sde, sdf\)"):
        resolve(fs, spec({"device": {"kind": ["disk"]}}), topology)
    with pytest.raises(BenchmarkError, match="matches none of the 14 devices"):
        resolve(fs, spec({"device": {"name": ["nvme*"]}}), topology)


def loop_host(root: Path, mnt: Path | None = None) -> tuple[KernelFS, Topology]:
    b = SysfsBuilder(root)
    _, loop = b.loop(5, size=8192, backing_file="/var/tmp/bench.img")
    b.write(f"{loop}/ro", "0")  # attached read-write
    if mnt is not None:
        b.mount(loop, str(mnt), "xfs", "/dev/loop5")
    fs = b.finish()
    topology = discovery.discover(fs)
    nodes(fs, topology)
    return fs, topology


def test_a_signature_on_an_unused_device_is_refused(tmp_path: Path) -> None:
    fs, topology = loop_host(tmp_path / "host")
    write_bluestore_label(fs.device_node("loop5"))
    assert refusal(fs, topology, "loop5") == ["loop5 holds ceph_bluestore (other), signature at byte 0"]


def test_a_file_target_is_found_on_its_filesystem(tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    fs, topology = loop_host(tmp_path / "host", mnt)
    files = BenchFiles(fs, tmp_path / "state", [mnt])
    s = spec({"file": {"path": str(mnt / "bench.dat"), "size": "4M"}})
    resolved = resolve(fs, s, topology, files)
    assert (resolved.info.kind, resolved.info.device, resolved.existed) == ("file", "loop5", False)
    assert [b.device for b in resolved.beneath] == ["loop5"]
    check_safety(resolved, s.steps(resolved.info.facts), allow_destructive=False)  # a new file
    assert files.claim(str(mnt / "bench.dat"), "run-1")  # made by stortune, kept for later runs
    files.release(str(mnt / "bench.dat"), "run-1", remove=False)
    resolved = resolve(fs, s, topology, files)
    assert resolved.existed
    with pytest.raises(UnsafeTargetError, match="the file exists and iometer-4k/randwrite"):
        check_safety(resolved, s.steps(resolved.info.facts), allow_destructive=False)
    check_safety(resolved, s.steps(resolved.info.facts), allow_destructive=True)


def test_hostile_a_file_target_may_not_lead_into_dev(tmp_path: Path) -> None:
    fs, topology = loop_host(tmp_path / "host")
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "sneaky").symlink_to(fs.dev)
    files = BenchFiles(fs, tmp_path / "state", [bench])
    with pytest.raises(BenchmarkError, match=f"{bench}/sneaky is a symbolic link"):
        resolve(fs, spec({"file": {"path": str(bench / "sneaky" / "loop5"), "size": "4M"}}), topology, files)
    with pytest.raises(BenchmarkError, match=f"is under {fs.dev}"):
        resolve(fs, spec({"file": {"path": str(fs.device_node("loop5")), "size": "4M"}}), topology,
                BenchFiles(fs, tmp_path / "state", [fs.dev.parent]))
