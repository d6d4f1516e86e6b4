"""Protected devices: the disks a host lives on take no experiment, benchmark or probe.

Fixture hosts (tests/fixtures/scenarios.py) with / on a partition, on LVM over md, swap on
zram, another user's loop device; the refusals of the benchmark manager, the probe, a local
experiment and the agent API's Apply of a trial overlay; the dry run making them too.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from stortune.agent import cli, local
from stortune.agent.bench.manager import BenchmarkManager
from stortune.agent.kernelfs import KernelFS
from stortune.agent.probe.members import ProbeDeviceError
from stortune.agent.probe.runner import ProbeManager
from stortune.agent.protection import DEFAULT_MOUNTS, HostProtection, ProtectedDeviceError
from stortune.agent.serve import Agent
from stortune.agent.tune import LocalExperiment
from stortune.schemas import protection as pure
from stortune.schemas.bench.spec import BenchmarkSpec, parse_benchmark
from stortune.schemas.documents import parse_profile
from stortune.schemas.tuning.experiment import parse_experiment
from stortune.schemas.tuning.overlay import overlay_profile
from tests.agent.fakefio import FakeFio
from tests.fixtures import scenarios
from tests.fixtures.agent_host import Host
from tests.fixtures.sysfs_builder import Queue, SysfsBuilder

NOTHING_OWNED: Callable[[str], os.stat_result | None] = lambda _path: None  # noqa: E731


def protected(fs: KernelFS, **kw: Any) -> dict[str, str]:
    return HostProtection(stat=kw.pop("stat", NOTHING_OWNED), **kw).resolve(fs, local.discover(fs))


def read_spec(device: str, workload: str = "stream-32k", **extra: Any) -> BenchmarkSpec:
    return parse_benchmark({"apiVersion": "stortune/v1", "kind": "BenchmarkSpec", "metadata": {"name": "b"},
                            "spec": {"target": {"device": {"name": [device]}},
                                     "workloads": [{"preset": workload, "runtime": "1s"}], **extra}})


def test_the_agent_repeats_the_pure_default_mounts() -> None:
    assert DEFAULT_MOUNTS == pure.DEFAULT_MOUNTS


# -- which devices -------------------------------------------------------------------------
def test_hostile_root_on_lvm_over_md_protects_the_whole_stack_down_to_every_disk(tmp_path: Path) -> None:
    found = protected(scenarios.lvm_on_md(tmp_path))
    # / on dm-0 (vg0-root), on md0 over sd[a-d]2: the disks, their other partitions, the other LVs
    disks = {f"sd{c}{p}" for c in "abcd" for p in ("", "1", "2")}
    assert set(found) == {"dm-0", "dm-1", "dm-2", "md0", *disks}
    assert found["dm-0"] == "dm-0 holds /"
    assert found["sdc"].startswith("sdc carries ") and "which holds /" in found["sdc"]
    assert "which holds /" in found["dm-2"]


def test_hostile_swap_on_zram_and_root_on_a_partition_protect_zram_and_the_whole_ssd(tmp_path: Path) -> None:
    root = tmp_path / "host"
    fs = scenarios.nvme_ssd(root)
    (fs.procfs / "swaps").write_text("Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
                                     "/dev/zram0          partition\t8388604\t\t0\t\t100\n")
    found = protected(fs)
    assert found["zram0"] == "zram0 backs swap (/dev/zram0)"
    # / is nvme0n1p2: the whole namespace, and the scratch partition beside it, are protected
    assert {"nvme0n1", "nvme0n1p1", "nvme0n1p2", "nvme0n1p3"} <= set(found)
    assert "holds /" in found["nvme0n1p3"]
    # a loop whose backing file lies on / is not itself protected; an unattached one neither
    assert "loop0" not in found and "loop1" not in found


def test_an_array_beside_the_root_disk_is_not_protected(tmp_path: Path) -> None:
    found = protected(scenarios.md_raid5_fileserver(tmp_path))
    assert set(found) == {"sda", "sda1", "sda2"}  # md126 and its five disks hold /export only
    assert found["sda1"].startswith("sda1 is on sda, which carries sda2, which holds /")


def test_a_separate_var_and_a_swap_file_and_a_named_device_are_protected(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "host")
    _, loop = b.loop(2, size=131072, backing_file="/srv/os.img")
    _, vdb = b.loop(3, size=131072, backing_file="/srv/var.img")
    _, data = b.loop(4, size=131072, backing_file="/srv/data.img")
    b.loop(5, size=131072, backing_file="/srv/free.img")
    b.mount(loop, "/", "ext4", "/dev/loop2")
    b.mount(vdb, "/var", "xfs", "/dev/loop3")
    b.mount(data, "/data", "xfs", "/dev/loop4")
    fs = b.finish()
    (fs.procfs / "swaps").write_text("Filename Type Size Used Priority\n/data/swap\\040file file 1 0 -2\n")
    found = protected(fs, devices=("loop5",))
    assert found == {"loop2": "loop2 holds /", "loop3": "loop3 holds /var",
                     "loop4": "loop4 holds the swap file /data/swap file",
                     "loop5": "loop5 is named protected by the host (--protect-device)"}
    # /boot without a filesystem of its own lies on /
    only_boot = protected(fs, mounts=("/boot",))
    assert only_boot["loop2"] == "loop2 holds / (and so /boot)" and "loop3" not in only_boot


def test_hostile_another_users_loop_device_is_protected_unless_the_host_allows_it(tmp_path: Path) -> None:
    theirs, mine = tmp_path / "theirs.img", tmp_path / "mine.img"
    theirs.write_bytes(b""), mine.write_bytes(b"")
    os.chown(theirs, 65534, 65534)
    b = SysfsBuilder(tmp_path / "host")
    b.loop(3, size=131072, backing_file=str(theirs))
    b.loop(4, size=131072, backing_file=str(mine))
    b.loop(5, size=131072, backing_file=f"{tmp_path}/gone.img (deleted)")
    fs = b.finish()
    as_root = HostProtection(uid=0)
    found = as_root.resolve(fs, local.discover(fs))
    assert found == {"loop3": "loop3 is another user's loop device (its backing file belongs to uid 65534)"}
    assert HostProtection(uid=0, allow_loops=("loop3",)).resolve(fs, local.discover(fs)) == {}


def test_hostile_a_loop_device_over_the_root_disk_is_protected_like_the_disk(tmp_path: Path) -> None:
    b = SysfsBuilder(tmp_path / "host")
    _, root = b.loop(2, size=131072, backing_file="/srv/os.img")
    b.mount(root, "/", "ext4", "/dev/loop2")
    b.loop(6, size=131072, backing_file="/dev/loop2")  # losetup /dev/loop6 /dev/loop2
    b.loop(7, size=131072, backing_file="/srv/scratch.img")
    fs = b.finish()

    def stat_of(path: str) -> os.stat_result | None:
        if path == "/dev/loop2":  # a block device node, 7:2
            return os.stat_result((0o60660, 0, 0, 1, 0, 0, 0, 0, 0, 0), {"st_rdev": os.makedev(7, 2)})
        return None

    found = HostProtection(stat=stat_of, uid=0).resolve(fs, local.discover(fs))
    assert found == {"loop2": "loop2 holds /", "loop6": "loop6 is backed by loop2: loop2 holds /"}


def test_hostile_a_loop_over_a_loop_over_the_root_disk_is_protected(tmp_path: Path) -> None:
    # losetup /dev/loop6 /dev/loop2; losetup /dev/loop3 /dev/loop6: loop3 comes first in the
    # topology, before loop6 is known to be protected (one pass in device order missed it).
    b = SysfsBuilder(tmp_path / "host")
    _, root = b.loop(2, size=131072, backing_file="/srv/os.img")
    b.mount(root, "/", "ext4", "/dev/loop2")
    b.loop(6, size=131072, backing_file="/dev/loop2")
    b.loop(3, size=131072, backing_file="/dev/loop6")
    fs = b.finish()
    nodes = {"/dev/loop2": os.makedev(7, 2), "/dev/loop6": os.makedev(7, 6)}

    def stat_of(path: str) -> os.stat_result | None:
        if path in nodes:
            return os.stat_result((0o60660, 0, 0, 1, 0, 0, 0, 0, 0, 0), {"st_rdev": nodes[path]})
        return None

    found = HostProtection(stat=stat_of, uid=0).resolve(fs, local.discover(fs))
    assert found == {"loop2": "loop2 holds /", "loop6": "loop6 is backed by loop2: loop2 holds /",
                     "loop3": "loop3 is backed by loop6: loop6 is backed by loop2: loop2 holds /"}


def test_hostile_a_volume_over_a_loop_over_the_root_disk_is_protected(tmp_path: Path) -> None:
    # losetup /dev/loop6 /dev/loop2; dmsetup create over /dev/loop6: dm-4 writes to loop2 (/).
    b = SysfsBuilder(tmp_path / "host")
    _, root = b.loop(2, size=131072, backing_file="/srv/os.img")
    b.mount(root, "/", "ext4", "/dev/loop2")
    _, over = b.loop(6, size=131072, backing_file="/dev/loop2")
    b.dm(4, [over], name="sneaky", uuid="CRYPT-PLAIN-sneaky", size=131072, queue=Queue.bio_based())
    fs = b.finish()

    def stat_of(path: str) -> os.stat_result | None:
        if path == "/dev/loop2":
            return os.stat_result((0o60660, 0, 0, 1, 0, 0, 0, 0, 0, 0), {"st_rdev": os.makedev(7, 2)})
        return None

    found = HostProtection(stat=stat_of, uid=0).resolve(fs, local.discover(fs))
    assert found["dm-4"] == "dm-4 is on loop6: loop6 is backed by loop2: loop2 holds /"


# -- refusals ------------------------------------------------------------------------------
@pytest.fixture
def fileserver(tmp_path: Path) -> KernelFS:
    fs = scenarios.md_raid5_fileserver(tmp_path / "host")
    fs.dev.mkdir()
    for name in ("sda", "sda1", "sdb", "md126"):
        with open(fs.device_node(name), "wb") as fh:
            fh.truncate(1 << 20)
    return fs


def test_hostile_a_read_benchmark_on_the_root_disk_is_refused_naming_it_and_the_option(
        fileserver: KernelFS, tmp_path: Path) -> None:
    fio = FakeFio([])
    manager = BenchmarkManager(fileserver, tmp_path / "state", runner=fio)
    with pytest.raises(ProtectedDeviceError) as refused:
        manager.start(read_spec("sda"))
    message = str(refused.value)
    assert "sda carries sda2, which holds /" in message and "--protect-device" in message
    assert "no benchmark runs on it" in message
    assert fio.calls == [] and manager.runs() == []
    # a partition of it, whatever allowDestructive says
    with pytest.raises(ProtectedDeviceError, match="sda1 is on sda"):
        manager.start(read_spec("sda1", "seq-64k", allowDestructive=True))


def test_hostile_a_probe_of_the_root_disk_is_refused_and_every_disk_leaves_it_out(
        fileserver: KernelFS, tmp_path: Path) -> None:
    probes = ProbeManager(fileserver, tmp_path / "state", runner=FakeFio([]))
    with pytest.raises(ProtectedDeviceError, match="sda2 holds /"):
        probes.start("sda2")
    with pytest.raises(ProbeDeviceError, match="does not protect"):
        ProbeManager(scenarios.lvm_on_md(tmp_path / "lvm"), tmp_path / "s2", runner=FakeFio([])).start(None)


def test_an_array_beside_the_root_disk_can_be_probed(fileserver: KernelFS, tmp_path: Path) -> None:
    topology = local.discover(fileserver)
    from stortune.agent.probe import members

    chosen = members.every_disk(topology)
    assert "sda" in chosen  # the probe of every disk would have read the root disk
    found = HostProtection(stat=NOTHING_OWNED).resolve(fileserver, topology)
    assert [n for n in chosen if n not in found] == ["sdb", "sdc", "sdd", "sde", "sdf"]


def test_hostile_a_local_experiment_on_the_root_disk_is_refused_before_any_write(
        fileserver: KernelFS, tmp_path: Path) -> None:
    exp = parse_experiment({
        "apiVersion": "stortune/v1", "kind": "TuningExperiment", "metadata": {"name": "os-disk"},
        "spec": {"target": {"device": {"name": ["sda"]}},
                 "workloads": [{"preset": "stream-32k", "runtime": "5s"}],
                 "objective": {"metric": "read_bandwidth", "goal": "maximize"},
                 "parameters": [{"tunable": "read_ahead_kb", "values": [0, 1024]}],
                 "strategy": "one-at-a-time", "budget": {"trials": 30}}})
    before = (fileserver.sysfs / "block/sda/queue/read_ahead_kb").read_text()
    with pytest.raises(ProtectedDeviceError, match="no experiment runs on it"):
        LocalExperiment(fileserver, tmp_path / "state", exp, runner=FakeFio([]))
    assert (fileserver.sysfs / "block/sda/queue/read_ahead_kb").read_text() == before
    assert not (tmp_path / "state" / "originals.json").exists()


def _apply(agent: Agent, profiles: list[Any]) -> Any:
    from stortune.api.agent import wire

    channel = grpc.insecure_channel(agent.address)
    try:
        return wire.agent_stub(channel).Apply(
            wire.apply_request(profiles, {p.metadata.name: 1 for p in profiles}, "protection"), timeout=30)
    finally:
        channel.close()


def test_hostile_the_api_cannot_put_trial_values_on_a_protected_device_but_a_profile_may(
        host: Host, tmp_path: Path) -> None:
    host.builder.write("devices/virtual/block/loop7/ro", "0")
    fs = host.fs
    from stortune.agent.serve import ServeOptions

    agent = Agent(fs, tmp_path / "state", ServeOptions(listen="127.0.0.1:0", rescan_interval=3600, grace=1,
                                                       insecure=True,
                                                       protection=HostProtection(devices=("loop7",))))
    agent.start()
    try:
        device = local.discover(fs).device("loop7")
        assert device is not None
        overlay = overlay_profile("os-disk", {"read_ahead_kb": 4096}, device)
        with pytest.raises(grpc.RpcError) as refused:
            _apply(agent, [overlay])
        assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "loop7 is named protected by the host" in (refused.value.details() or "")
        assert host.queue("read_ahead_kb") == "128"
        profile = parse_profile(yaml.safe_load("""
apiVersion: stortune/v1
kind: StorageProfile
metadata: {name: os-disk-readahead}
spec: {rules: [{name: os, match: {name: [loop7]}, settings: {read_ahead_kb: 256}}]}
"""))
        assert _apply(agent, [profile]).ok
        assert host.queue("read_ahead_kb") == "256"
    finally:
        agent.stop()


# -- the dry run makes every refusal ----------------------------------------------------------
def _bench(fs: KernelFS, tmp_path: Path, *args: str) -> int:
    return cli.main(["bench", "--sysfs", str(fs.sysfs), "--procfs", str(fs.procfs), "--dev", str(fs.dev),
                     "--state-dir", str(tmp_path / "state"), *args])


def _fake_fio_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "fio").write_text("#!/bin/sh\necho fio-3.33\n")
    (bin_dir / "fio").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def test_hostile_a_dry_run_write_on_the_mounted_root_disk_is_refused_like_the_run(
        fileserver: KernelFS, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_fio_on_path(tmp_path, monkeypatch)
    spec = tmp_path / "b.yaml"
    spec.write_text(yaml.safe_dump(read_spec("sda", "seq-64k", allowDestructive=True).document()))
    assert _bench(fileserver, tmp_path, "-f", str(spec), "--dry-run") == 1
    err = capsys.readouterr().err
    assert "sda carries sda2, which holds /" in err and "Traceback" not in err
    # an unprotected device that is mounted: the write refusals, as the run makes them
    assert _bench(fileserver, tmp_path, "--preset", "seq-64k", "--target", "md126", "--allow-destructive",
                  "--dry-run") == 1
    err = capsys.readouterr().err
    assert "md126 is mounted at /export (xfs)" in err
    assert not (tmp_path / "state" / "bench").exists()


def test_a_dry_run_on_a_free_device_shows_the_steps_and_runs_nothing(
        fileserver: KernelFS, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_fio_on_path(tmp_path, monkeypatch)
    assert _bench(fileserver, tmp_path, "--preset", "stream-32k", "--target", "sdb", "--dry-run") == 0
    out = capsys.readouterr().out
    assert "dry run: stream-32k on" in out and "stream-32k" in out
    assert not (tmp_path / "state" / "bench").exists()


# -- on this host, with a real loop device ------------------------------------------------------
@pytest.mark.root
def test_hostile_on_this_host_the_root_disk_is_refused_and_a_loop_device_only_while_another_users(
        loop_device: str, tmp_path: Path) -> None:
    fs = KernelFS.at()
    topology = local.discover(fs)
    holders = [d.name for d in topology.devices if any(m.mountpoint == "/" for m in d.mounts)]
    if not holders:
        pytest.skip("/ is not on a block device here (an overlay or a network filesystem)")
    found = HostProtection().resolve(fs, topology)
    assert f"{holders[0]} holds /" in found[holders[0]]
    # The loop's backing file lies on /, yet the loop is not the root disk: free to measure.
    assert loop_device not in found
    fio = FakeFio([])
    manager = BenchmarkManager(fs, tmp_path / "state", runner=fio)
    with pytest.raises(ProtectedDeviceError, match=f"{holders[0]} holds /"):  # a read, refused before fio
        manager.start(read_spec(holders[0]))
    assert fio.calls == []
    backing = (fs.sysfs / "block" / loop_device / "loop" / "backing_file").read_text().strip()
    owner = os.stat(backing)
    os.chown(backing, 65534, 65534)
    try:
        found = HostProtection().resolve(fs, local.discover(fs))
        assert found[loop_device] == (f"{loop_device} is another user's loop device (its backing file"
                                      " belongs to uid 65534)")
        with pytest.raises(ProtectedDeviceError, match="--allow-loop"):
            manager.start(read_spec(loop_device))
    finally:
        os.chown(backing, owner.st_uid, owner.st_gid)


def test_the_topology_listing_shows_what_is_protected_and_why(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fs = scenarios.md_raid5_fileserver(tmp_path / "host")
    assert cli.main(["topology", "--sysfs", str(fs.sysfs), "--procfs", str(fs.procfs),
                     "--protect-device", "md126"]) == 0
    out = capsys.readouterr().out.split("protected: no experiment, benchmark or probe")[1]
    assert "sda2 holds /" in out and "md126 is named protected by the host" in out
    assert "sdb carries md126, which is named protected" in out and "sdf1 carries md126" in out


@pytest.mark.parametrize("bad", [["--protect-device", "../sda"], ["--protect-device", "sd a"],
                                 ["--protect-mount", "var"], ["--allow-loop", "/etc/passwd"]])
def test_hostile_protection_flags_take_only_device_names_and_absolute_paths(
        bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as usage:
        cli.main(["topology", *bad])
    assert usage.value.code == 1 and bad[0] in capsys.readouterr().err


def test_the_serving_agent_takes_the_hosts_protection_flags() -> None:
    from stortune.agent.bench.args import protection_of

    args = cli.build_parser().parse_args(["serve", "--listen", "127.0.0.1:0", "--protect-mount", "/srv/db/",
                                          "--protect-device", "/dev/sdc", "--allow-loop", "loop3"])
    got = protection_of(args)
    assert (got.mounts, got.devices, got.allow_loops) == ((*DEFAULT_MOUNTS, "/srv/db"), ("sdc",), ("loop3",))


# -- the control plane is told -------------------------------------------------------------------
def test_the_topology_the_agent_uploads_and_serves_names_its_protected_devices(
        host: Host, tmp_path: Path) -> None:
    """What registration uploads and what GetTopology answers (both stored by the control plane)
    carry the host's protected devices, so its dry runs refuse loop7 as this agent does; a host
    protecting nothing reports an empty list, not nothing (an older agent)."""
    from stortune.api.agent import wire
    from tests.fixtures.agent_host import LOOP_ID, serving

    named = {"name": "loop7", "id": LOOP_ID,
             "reason": "loop7 is named protected by the host (--protect-device)"}
    for flags, expected in (((), []), (("loop7",), [named])):
        with serving(host.fs, tmp_path / f"state{len(flags)}",
                     protection=HostProtection(devices=flags, stat=NOTHING_OWNED)) as agent:
            uploaded = agent._uploaded_topology().model_dump(mode="json")
            channel = grpc.insecure_channel(agent.address)
            try:
                answer = wire.agent_stub(channel).GetTopology(wire.topology_request(), timeout=30)
            finally:
                channel.close()
            _, served, _ = wire.topology_from(answer)
        assert uploaded["protected"] == expected
        assert served.model_dump(mode="json")["protected"] == expected
