"""Diagnostics bundles from fixture hosts (fake tools printing captured-style output) and this machine."""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from stortune.agent.diagnostics import ToolRunner, collect, commands, save
from stortune.agent.discovery import discover
from stortune.agent.kernelfs import KernelFS
from stortune.schemas.bundle import Bundle, pack, unpack, verify
from stortune.schemas.redact import KINDS, RedactionMapping, redact
from stortune.schemas.topology import Device, DeviceKind, Topology
from tests.fixtures.diag_hosts import DATA, DIAG_HOSTS, DiagHost, build, tree_state, write_script

NOW = datetime(2024, 5, 14, 9, 30, tzinfo=UTC)
ALL_TOOLS = {"lsblk", "smartctl", "nvme", "multipath", "dmsetup", "xfs_info", "storcli", "perccli", "dmesg"}
# keys under which the captured tool outputs hold serials and WWNs
SERIAL_KEYS = {"SN", "Serial Number", "serial_number", "serial", "SerialNumber"}
WWN_KEYS = {"WWN", "wwn", "SAS Address", "SAS address"}


def fixture_bundle(name: str, root: Path, timeout: float = 10) -> tuple[DiagHost, KernelFS, Bundle]:
    host = DIAG_HOSTS[name]
    fs, bin_dir = build(host, root)
    return host, fs, collect(fs, tools=ToolRunner([bin_dir], timeout=timeout), now=NOW)


def archive(data: bytes) -> dict[str, bytes]:
    """Every member of a tar.gz by name, read with nothing but tarfile."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        out = {}
        for m in tar:
            if m.isfile():
                f = tar.extractfile(m)
                assert f is not None
                out[m.name] = f.read()
        return out


def check_complete(data: bytes) -> dict[str, Any]:
    """The manifest lists every file of the archive with a matching sha256; -> the manifest."""
    assert verify(data) == []
    files = archive(data)
    (manifest_name,) = [n for n in files if n.endswith("/manifest.json")]
    root = manifest_name.removesuffix("manifest.json")
    manifest: dict[str, Any] = json.loads(files.pop(manifest_name))
    assert {e["path"] for e in manifest["files"]} == {n.removeprefix(root) for n in files}
    for entry in manifest["files"]:
        body = files[root + entry["path"]]
        assert (entry["size"], entry["sha256"]) == (len(body), hashlib.sha256(body).hexdigest())
    described = {c["path"] for c in manifest["collected"]}
    assert described == {e["path"] for e in manifest["files"]}, "every file says where it came from"
    return manifest


def _walk(node: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield key, value
            yield from _walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)


def sensitive_values(host: DiagHost, topo: Topology) -> set[str]:
    """The fixture's serials, WWNs, hostnames and addresses: from its topology, its captured
    tool outputs and the network values it plants."""
    values: set[str] = {topo.hostname or "", *host.network_values}
    for dev in topo.devices:
        values |= {v for v in (dev.serial, dev.wwn) if v}
        if dev.scsi_host and dev.scsi_host.fc_port_name:
            values.add(dev.scsi_host.fc_port_name)
    for path in (DATA / host.scenario).glob("*.json"):
        for key, value in _walk(json.loads(path.read_text())):
            if key in SERIAL_KEYS | WWN_KEYS and isinstance(value, str) and value.strip() not in ("", "0x0"):
                values.add(value.strip())
    values.discard("")
    return values


def spellings(value: str) -> set[str]:
    """The forms a value takes in tool output, lower-cased."""
    v = value.lower()
    core = re.sub(r"^(naa\.|eui\.|0x)", "", v)
    forms = {v, core}
    if len(core) == 16 and re.fullmatch(r"[0-9a-f]+", core):
        forms.add(":".join(core[i:i + 2] for i in range(0, 16, 2)))
    return forms


@pytest.mark.parametrize("name", ["perc_streamer", "san_multipath"])
def test_fixture_bundle_leaks_no_sensitive_value(name: str, tmp_path: Path) -> None:
    host, fs, bundle = fixture_bundle(name, tmp_path)
    values = sensitive_values(host, discover(fs))
    assert len(values) >= 8, values
    clear = b"\n".join(archive(pack(bundle)).values()).decode("utf-8", "replace").lower()
    for value in values:  # each one was really collected, so masking it is the redactor's work
        assert any(s in clear for s in spellings(value)), f"{value} never made it into the bundle"

    redacted, mapping = redact(bundle)
    data = pack(redacted)
    check_complete(data)
    files = archive(data)
    for member, body in files.items():
        text = f"{member}\n{body.decode('utf-8', 'replace')}".lower()
        for value in values:
            for spelling in spellings(value):
                assert spelling not in text, f"{value!r} ({spelling!r}) remains in {member}"
    originals = {v.lower() for kind in mapping.values.values() for v in kind.values()}
    assert {re.sub(r"^(naa\.|eui\.|0x)", "", v.lower()) for v in values} <= originals | {
        v.lower() for v in values}


def token_for(mapping: RedactionMapping, original: str) -> str:
    return next(t for kind in mapping.values.values() for t, v in kind.items() if v == original)


def test_the_same_value_becomes_the_same_token_in_every_file(tmp_path: Path) -> None:
    _, _, bundle = fixture_bundle("san_multipath", tmp_path)
    redacted, mapping = redact(bundle)
    text = {p: d.decode() for p, d in redacted.files.items()}
    lun = token_for(mapping, "600a0b800029ab4c00001a2b5f3c4d5e")
    for path, spelled in [("topology.json", f"naa.{lun}"), ("topology.json", f"dm:mpath-3{lun}"),
                          ("commands/lsblk.json", f"0x{lun}"), ("commands/multipath-ll.txt", f"(3{lun})"),
                          ("kernel/storage-messages.txt", f"device naa.{lun} port group")]:
        assert spelled in text[path], (spelled, path)
    serial = token_for(mapping, "PHYF812300AB480BGN")
    for path in ("topology.json", "commands/lsblk.json", "commands/smartctl/sda.json"):
        assert serial in text[path]
    nfs = token_for(mapping, "10.20.30.40")
    # the export has the mountpoint's name (/backup): one token for both
    assert f"- nfs4 {nfs}:/{token_for(mapping, '/backup')}" in text["proc/self/mountinfo"]
    assert f"nfs: server {nfs} OK" in text["kernel/storage-messages.txt"]
    assert redacted.info.host == token_for(mapping, "db01")
    assert json.loads(text["topology.json"])["hostname"] == redacted.info.host


def test_perc_drives_behind_the_controller_are_masked(tmp_path: Path) -> None:
    """The topology never sees the drives a PERC hides: only the detectors can find their ids."""
    _, _, bundle = fixture_bundle("perc_streamer", tmp_path)
    redacted, mapping = redact(bundle)
    drives = json.loads(redacted.files["commands/perccli/drives-show-all.json"])
    attrs = [v for k, v in _walk(drives) if k.endswith("Device attributes")]
    assert len(attrs) == 8
    assert all(re.fullmatch(r"SERIAL-\d{4}", a["SN"]) and re.fullmatch(r"WWN-\d{4}", a["WWN"]) for a in attrs)
    assert len({a["SN"] for a in attrs}) == 8
    # slot 3's SAS address in the drive list and in the controller's kernel message: one token
    sas = token_for(mapping, "5000c5000a1b2c0d")
    assert f"0x{sas}" in redacted.files["commands/perccli/drives-show-all.json"].decode()
    assert f"Path {sas}," in redacted.files["kernel/storage-messages.txt"].decode()
    # sector counts in hex and firmware versions survive
    assert "[0x22ecb25c Sectors]" in redacted.files["commands/perccli/drives-show-all.json"].decode()
    assert '"Driver Version": "07.725.01.00-rc1"' in redacted.files[
        "commands/perccli/call-show-all.json"].decode()


def test_fixture_manifest_records_commands_failures_and_missing_tools(tmp_path: Path) -> None:
    _, fs, bundle = fixture_bundle("perc_streamer", tmp_path)
    manifest = check_complete(pack(bundle))
    assert manifest["host"] == "stream01" and manifest["created"] == "2024-05-14T09:30:00Z"
    assert manifest["collector"].startswith("stortune-agent ")
    assert set(bundle.files) == {
        "topology.json", "proc/mdstat", "proc/diskstats", "proc/partitions", "proc/self/mountinfo",
        "commands/lsblk.json", "commands/smartctl/sda.json", "commands/dmsetup-table.txt",
        "commands/xfs_info/sda1.txt", "commands/xfs_info/sda2.txt", "commands/xfs_info/sda3.txt",
        "commands/perccli/call-show-all.json", "commands/perccli/drives-show-all.json",
        "kernel/storage-messages.txt",
    }
    by_path = {c["path"]: c for c in manifest["collected"]}
    perccli = by_path["commands/perccli/drives-show-all.json"]
    assert perccli["argv"][0].endswith("/perccli64")
    assert perccli["argv"][1:] == ["/call/eall/sall", "show", "all", "J", "nolog"]
    assert perccli["exit_code"] == 0 and perccli["duration_seconds"] >= 0
    assert by_path["proc/mdstat"] == {
        "path": "proc/mdstat", "source": "file", "origin": f"{fs.procfs}/mdstat", "argv": None,
        "exit_code": None, "duration_seconds": None, "note": None}
    # named after the device, not the mountpoint: a file name is not redacted away
    assert {p: by_path[f"commands/xfs_info/{p}.txt"]["argv"][1:] for p in ("sda1", "sda2", "sda3")} == {
        "sda1": ["/boot"], "sda2": ["/srv/video"], "sda3": ["/"]}
    assert {m["tool"]: m["searched"] for m in manifest["missing"]} == {
        "nvme": ["nvme"], "multipath": ["multipath"], "storcli": ["storcli", "storcli64"]}
    # smartctl cannot see through the PERC: its answer is kept, and its exit status recorded
    assert manifest["failed"] == [{"what": f"{perccli['argv'][0].rsplit('/', 1)[0]}/smartctl -j -a /dev/sda",
                                   "reason": "exit status 2", "path": "commands/smartctl/sda.json"}]
    assert b"please try adding '-d megaraid,N'" in bundle.files["commands/smartctl/sda.json"]
    # the topology carries every tunable with its raw text
    topo = json.loads(bundle.files["topology.json"])
    sda = next(d for d in topo["devices"] if d["name"] == "sda")
    assert sda["tunables"]["read_ahead_kb"]["raw"] == "128"
    assert sda["tunables"]["scheduler"]["raw"] == "[mq-deadline] kyber bfq none"
    # kernel messages: the storage lines only
    kernel = bundle.files["kernel/storage-messages.txt"].decode()
    assert "[sda] 4101558272 512-byte logical blocks" in kernel and "nfs: server" in kernel
    assert "e1000e" not in kernel and "martian" not in kernel and "Command line" not in kernel
    assert by_path["kernel/storage-messages.txt"]["note"] == "21 of 25 lines: storage-related only"


def test_one_command_per_md_array_disk_and_xfs_mount(tmp_path: Path) -> None:
    _, fs, bundle = fixture_bundle("md_raid5_fileserver", tmp_path)
    assert b"local to host files01" in bundle.files["commands/mdadm-detail/md126.txt"]
    lines = [c.line() for c in commands(discover(fs))]
    assert "mdadm --detail /dev/md126" in lines
    assert [ln for ln in lines if ln.startswith("smartctl")] == [
        f"smartctl -j -a /dev/sd{x}" for x in "abcdef"]
    san = commands(discover(build(DIAG_HOSTS["san_multipath"], tmp_path / "san")[0]))
    # SAN LUN paths have no SMART data; the local disk does
    assert [c.line() for c in san if c.tool == "smartctl"] == ["smartctl -j -a /dev/sda"]
    assert sorted(c.args[0] for c in san if c.tool == "xfs_info") == ["/", "/boot", "/oradata", "/oralogs"]
    # a Smart Array disk's kernel name has a '!' where its device node has a '/'
    cciss = Topology(devices=[Device(name="cciss!c0d0", kind=DeviceKind.DISK, id="name:cciss!c0d0")])
    (smart,) = [c for c in commands(cciss) if c.tool == "smartctl"]
    assert smart.line() == "smartctl -j -a /dev/cciss/c0d0"
    assert smart.path == "commands/smartctl/cciss_c0d0.json"


def test_an_empty_tool_path_records_every_tool_as_missing(tmp_path: Path) -> None:
    fs = build(DIAG_HOSTS["san_multipath"], tmp_path)[0]
    empty = tmp_path / "empty"
    empty.mkdir()
    bundle = collect(fs, tools=ToolRunner([empty]), now=NOW)
    manifest = check_complete(pack(bundle))
    missing = {m["tool"]: m["wanted_for"] for m in manifest["missing"]}
    assert set(missing) == ALL_TOOLS
    assert missing["smartctl"] == ["smartctl -j -a /dev/sda"]
    assert sorted(missing["xfs_info"]) == ["xfs_info /", "xfs_info /boot", "xfs_info /oradata",
                                           "xfs_info /oralogs"]
    assert missing["dmesg"] == ["dmesg"]
    assert manifest["failed"] == []
    assert sorted(bundle.files) == ["proc/diskstats", "proc/mdstat", "proc/partitions", "proc/self/mountinfo",
                                    "topology.json"]


def test_failing_and_hung_tools_are_recorded(tmp_path: Path) -> None:
    host = DIAG_HOSTS["san_multipath"]
    fs, bin_dir = build(host, tmp_path)
    write_script(bin_dir / "multipath", "echo 'mpatha (3600a0b800029ab4c00001a2b5f3c4d5e) dm-0 NETAPP'\n"
                                        "exec sleep 60")
    write_script(bin_dir / "dmsetup", "echo 'device-mapper: ioctl on 600a0b800029ab4c00001a2b5f3c4d5e"
                                      " failed' >&2\nexit 1")
    bundle = collect(fs, tools=ToolRunner([bin_dir], timeout=1), now=NOW)
    failed = {f.what.rsplit("/", 1)[1]: f for f in bundle.info.failed}
    hung = failed["multipath -ll"]
    assert hung.reason == "timed out after 1 s and was killed" and hung.path == "commands/multipath-ll.txt"
    assert bundle.files[hung.path] == b"mpatha (3600a0b800029ab4c00001a2b5f3c4d5e) dm-0 NETAPP\n"
    bad = failed["dmsetup table"]
    assert bad.reason == "exit status 1: device-mapper: ioctl on 600a0b800029ab4c00001a2b5f3c4d5e failed"
    assert bad.path == "commands/dmsetup-table.txt.stderr"
    assert "commands/dmsetup-table.txt" not in bundle.files
    duration = {c.path: c.duration_seconds for c in bundle.info.collected}
    # A lower bound only: it ran to its timeout; that it was then killed, not waited for, is
    # the reason above (and tests/agent/test_diagnostics_tools.py).
    assert (duration["commands/multipath-ll.txt"] or 0) >= 1
    # partial output and stderr are redacted like everything else
    redacted, _ = redact(bundle)
    assert all(b"600a0b800029ab4c" not in d for d in redacted.files.values())
    check_complete(pack(redacted))


def test_collecting_changes_nothing_on_the_host(tmp_path: Path) -> None:
    host = DIAG_HOSTS["perc_streamer"]
    fs, bin_dir = build(host, tmp_path)
    before = tree_state(tmp_path)
    collect(fs, tools=ToolRunner([bin_dir]), now=NOW)
    assert tree_state(tmp_path) == before


def test_a_bundle_from_this_machine_is_complete_and_verifiable() -> None:
    fs = KernelFS.at()
    tools = ToolRunner(timeout=30)
    bundle = collect(fs, tools=tools)
    topo = Topology.model_validate_json(bundle.files["topology.json"])
    expected_missing = {c.tool for c in commands(topo) if not any(tools.which(n) for n in c.names)}
    if tools.which("dmesg") is None:
        expected_missing.add("dmesg")
    assert {m.tool for m in bundle.info.missing} == expected_missing
    if tools.which("lsblk"):
        lsblk = json.loads(bundle.files["commands/lsblk.json"])
        assert {d["name"] for d in lsblk["blockdevices"]} >= {d.name for d in topo.devices
                                                              if d.kind.value == "disk"}
    # the live tables (other tests may attach loop devices meanwhile): read, and the real ones
    assert bundle.files["proc/partitions"].startswith(b"major minor  #blocks  name")
    assert re.search(rb"^\d+ \d+ \d+:\d+ / / ", bundle.files["proc/self/mountinfo"], re.M)
    assert re.match(rb"\s*\d+\s+\d+ \S+ \d+", bundle.files["proc/diskstats"])
    redacted, mapping = redact(bundle)
    data = pack(redacted)
    manifest = check_complete(data)
    assert manifest["redaction"]["kinds"] == list(KINDS)
    assert {"path", "bootid", "address"} <= set(KINDS)
    assert unpack(data).files == redacted.files
    # serials too short to be told from words and numbers are left (docs/diagnostics.md)
    clear = [v for d in topo.devices for v in (d.serial, d.wwn)
             if v and (len(v) >= 8 or (len(v) >= 4 and re.search("[0-9]", v) and re.search("[A-Za-z]", v)))]
    for body in archive(data).values():
        assert not any(v.lower() in body.decode("utf-8", "replace").lower() for v in clear)
    if topo.hostname:
        assert redacted.info.host == token_for(mapping, topo.hostname)
        assert json.loads(redacted.files["topology.json"])["hostname"] == redacted.info.host


def test_hostile_a_loop_devices_backing_file_and_a_boot_id_leave_no_trace(tmp_path: Path) -> None:
    from tests.fixtures.sysfs_builder import SysfsBuilder

    backing = "/home/alice/acme-corp/q3-forecast.img"
    boot_id = "5f1c2a9e-7b3d-4e8f-a1c2-9d8e7f6a5b4c"
    b = SysfsBuilder(tmp_path / "host", hostname="db01")
    b.loop(4, size=131072, backing_file=backing)
    b.write("sys/kernel/random/boot_id", boot_id, base=b.proc)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # lsblk and losetup print the backing file under their own keys; a tool's log names the boot id
    lsblk = f'{{"blockdevices": [{{"name": "loop4", "back-file": "{backing}"}}]}}'
    write_script(bin_dir / "lsblk", f"echo '{lsblk}'")
    write_script(bin_dir / "dmesg", f"echo '[    0.0] loop4: detected capacity change; boot_id: {boot_id}'")
    fs = b.finish()
    bundle = collect(fs, tools=ToolRunner([bin_dir], timeout=10), now=NOW)
    assert backing.encode() in b"".join(bundle.files.values())  # what redaction must find
    redacted, mapping = redact(bundle, known=[("bootid", boot_id)])
    everything = b"".join([*redacted.files.values(), *(p.encode() for p in redacted.files)])
    assert backing.encode() not in everything and b"acme-corp" not in everything
    assert boot_id.encode() not in everything and boot_id.upper().encode() not in everything
    token = next(t for t, v in mapping.values["path"].items() if v == backing)
    topology = json.loads(redacted.files["topology.json"])
    assert next(d["id"] for d in topology["devices"] if d["name"] == "loop4") == f"loop:{token}"
    assert redacted.info.redaction is not None and redacted.info.redaction.masked["bootid"].values == 1
    # `stortune-agent diag` knows its own boot id; under a key, any boot id is found unasked
    written, _, _ = save.diagnose(fs, ToolRunner([bin_dir], timeout=10), tmp_path / "b.tar.gz")
    assert boot_id.encode() not in b"".join(written.files.values())
    assert list(redact_text_mapping(f'{{"boot_id": "{boot_id}"}}').values["bootid"].values()) == [boot_id]


def redact_text_mapping(text: str) -> RedactionMapping:
    from stortune.schemas.redact import Redactor

    redactor = Redactor()
    assert redactor.redact_text(text) == '{"boot_id": "BOOT-0001"}'
    return redactor.mapping
