"""The controller cache (``--controller-cache``, 30 s) between a discovery and a write: the
volumes may be renumbered, or the battery fail, after the inventory the plan was made from.
A write must go to the volume that backs the disk now, judged on what the controller says now."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from stortune.agent import local
from stortune.agent.controllers.access import ControllerAccess
from stortune.agent.tools import ToolRunner
from tests.agent.test_controller_apply import Host, profile, set_commands
from tests.fixtures.raid_fakes import fake_megaraid
from tests.fixtures.scenarios import perc_managed


def cached_host(tmp_path: Path) -> Host:
    """make_host with the agent's default controller cache, not ttl=0."""
    fs = perc_managed(tmp_path / "host")
    tool = fake_megaraid(tmp_path / "bin", ("modern",), name="perccli64")
    access = ControllerAccess(ToolRunner([str(tmp_path / "bin")], timeout=10.0), ttl=30.0)
    return Host(dataclasses.replace(fs, controllers=access), tool, tmp_path / "bin", tmp_path / "state")


def test_hostile_volumes_renumbered_after_the_cached_discovery_write_the_disks_own_volume(
        tmp_path: Path) -> None:
    host = cached_host(tmp_path)
    host.tool.set_by_hand(0, 1, "read_policy", "read-ahead")  # both volumes read ahead
    topo = local.discover(host.fs)  # cached: sdb is VD 0 (RAID5), sdc VD 1 (RAID10)
    sdb = topo.device("sdb")
    assert sdb is not None and sdb.controller is not None and sdb.controller.virtual_drive == 0
    # an administrator deletes and recreates: the RAID5 behind sdb is VD 1 now, the RAID10 VD 0
    state = host.tool.state()
    vall = state["controllers"][0]["vall"]
    swap = {"/c0/v0": "/c0/v1", "PDs for VD 0": "PDs for VD 1", "VD0 Properties": "VD1 Properties"}
    swap |= {b: a for a, b in swap.items()}
    state["controllers"][0]["vall"] = {new: vall[old] for new, old in swap.items()}
    host.tool.update({"controllers": state["controllers"]})
    report = local.apply(host.fs, [profile({"controller_read_ahead": "no-read-ahead"})], host.state)
    assert report.ok, report
    # the RAID5 (sdb) now read-aheads no more; the RAID10 behind sdc was left alone
    assert host.policy(1)["read"] == "no-read-ahead" and host.policy(0)["read"] == "read-ahead"
    assert set_commands(host.tool) == ["/c0/v1 set rdcache=NoRA J"]
