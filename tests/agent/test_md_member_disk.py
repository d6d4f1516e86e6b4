"""Role md-member-disk: the whole disk under an md member partition, so the file server example's
member rule changes the queues the members' I/O waits in (it changed nothing before: role
md-member selects the partitions, which have no scheduler)."""

from __future__ import annotations

from pathlib import Path

from stortune.agent.discovery import discover
from stortune.schemas.documents import load_profiles
from stortune.schemas.planner import plan
from stortune.schemas.topology import Role, Topology
from tests.fixtures.scenarios import SCENARIOS

EXAMPLE = Path(__file__).resolve().parents[2] / "examples/md-raid5-fileserver.yaml"
MEMBER_DISKS = ["sdb", "sdc", "sdd", "sde", "sdf"]


def fileserver(tmp_path: Path) -> Topology:
    return discover(SCENARIOS["md_raid5_fileserver"](tmp_path / "fs"))


def test_only_the_disks_under_md_member_partitions_carry_the_role(tmp_path: Path) -> None:
    topo = fileserver(tmp_path)
    assert sorted(d.name for d in topo.devices if Role.MD_MEMBER_DISK in d.roles) == MEMBER_DISKS
    for name in ("sdb1", "sdd1"):  # the partitions are the members, not member disks
        roles = topo.device(name).roles  # type: ignore[union-attr]
        assert Role.MD_MEMBER in roles and Role.MD_MEMBER_DISK not in roles
    # a disk that is itself a PV of an md-less stack, or an md, never carries it
    other = discover(SCENARIOS["san_multipath"](tmp_path / "san"))
    assert not any(Role.MD_MEMBER_DISK in d.roles for d in other.devices)


def test_the_examples_member_rule_changes_the_member_disks_queues(tmp_path: Path) -> None:
    topo = fileserver(tmp_path)
    [profile] = load_profiles(EXAMPLE.read_text(), str(EXAMPLE))
    result = plan([profile], topo)
    changed = {(c.device, c.tunable): c.desired for c in result.changes if c.source.rule == "members"}
    values = (("scheduler", "mq-deadline"), ("nr_requests", 128))
    wanted = {(d, t): v for d in MEMBER_DISKS for t, v in values}
    in_sync = {(d.device, d.tunable) for d in result.desired if d.source.rule == "members" and d.in_sync}
    # every member disk gets the rule's values: changed, or already in place
    assert {k: v for k, v in wanted.items() if k not in in_sync} == changed
    assert changed, "the fixture's member disks already run the example's values: the test proves nothing"
    assert not [r for r in result.rejections if r.source.rule == "members"]
