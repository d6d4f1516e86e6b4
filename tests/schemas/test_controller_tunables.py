"""Controller tunables in the catalog and the planner: states from a virtual drive, the battery
rule, pendingReboot as in sync (not drift), and hostile values that never reach a tool."""

from __future__ import annotations

import pytest

from stortune.schemas import catalog, controllertunables
from stortune.schemas.catalog import ControllerTunable, TunableValueError
from stortune.schemas.controllers import BackupUnit, Controller, VirtualDrive, VolumeRef
from stortune.schemas.documents import DocumentError, parse_profile
from stortune.schemas.planner import plan
from stortune.schemas.profile import StorageProfile
from stortune.schemas.topology import Device, DeviceKind, Topology


def perc(backup: BackupUnit | None = None, **vd: object) -> tuple[Controller, VirtualDrive]:
    volume = VirtualDrive(id=0, raid_level="RAID5", state="Optl", strip_size_bytes=256 << 10,
                          drive_count=8, **{"read_policy": "adaptive", "write_policy": "write-back",
                                             "drive_cache": "default", **vd})
    ctrl = Controller(adapter="perc", tool="/opt/fake/perccli64", index=0, model="PERC 5/i",
                      backup=backup or BackupUnit(kind="bbu", state="Optimal", optimal=True),
                      virtual_drives=[volume])
    return ctrl, volume


def topology(ctrl: Controller, vd: VirtualDrive) -> Topology:
    ref = VolumeRef(adapter=ctrl.adapter, controller=ctrl.index, virtual_drive=vd.id, mapped_by="target-id",
                    model=ctrl.model, driver="megaraid_sas", raid_level=vd.raid_level,
                    strip_size_bytes=vd.strip_size_bytes, physical_drives=8, backup=ctrl.backup)
    volume = Device(name="sdb", kind=DeviceKind.DISK, id="wwn:naa.6001", controller=ref,
                    tunables=controllertunables.states(ctrl, vd))
    plain = Device(name="sda", kind=DeviceKind.DISK, id="wwn:naa.5000")
    return Topology(hostname="streamer", devices=[plain, volume])


def profile(settings: dict[str, object], match: dict[str, object] | None = None) -> StorageProfile:
    return parse_profile({
        "apiVersion": "stortune/v1", "kind": "StorageProfile", "metadata": {"name": "vod"},
        "spec": {"rules": [{"name": "volumes", "match": match or {"kind": ["disk"]},
                            "settings": settings}]},
    })


# -- hostile first -------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["RA", "read-ahead; reboot", "read-ahead ", "", 1, "adaptive\nNoRA"])
def test_hostile_controller_values_are_refused_at_the_field(value: object) -> None:
    with pytest.raises(DocumentError) as err:
        profile({"controller_read_ahead": value})
    assert "controller_read_ahead" in str(err.value)


def test_hostile_a_controller_tunable_is_never_a_sysfs_path() -> None:
    from stortune.agent.kernelfs import KernelFS, UnsafePathError

    fs = KernelFS.at("/nonexistent-sys", "/nonexistent-proc")
    for name in controllertunables.TUNABLES:
        with pytest.raises(UnsafePathError):
            fs.tunable_path(catalog.get(name), "sdb")
        assert name not in {t.name for t in catalog.kernel_for_kind(DeviceKind.DISK)}


def test_hostile_parse_refuses_a_word_the_catalog_does_not_know() -> None:
    with pytest.raises(TunableValueError):
        catalog.get("controller_write_cache").parse("WB;rm")


# -- states --------------------------------------------------------------------------------

def test_states_carry_the_policies_and_say_why_one_is_missing() -> None:
    ctrl, vd = perc(drive_cache=None)
    states = controllertunables.states(ctrl, vd)
    assert states["controller_read_ahead"].value == "adaptive"
    assert states["controller_read_ahead"].choices == ["read-ahead", "no-read-ahead", "adaptive"]
    assert states["controller_write_cache"].value == "write-back"
    missing = states["drive_write_cache"]
    assert not missing.supported and "PERC 5/i" in (missing.reason or "")


def test_a_pending_setting_is_the_configured_value_with_the_one_in_effect_beside_it() -> None:
    ctrl, vd = perc(pending={"read_policy": "read-ahead"})
    state = controllertunables.states(ctrl, vd)["controller_read_ahead"]
    assert (state.value, state.effective) == ("read-ahead", "adaptive")


# -- the planner ---------------------------------------------------------------------------

def test_the_streamer_profile_plans_the_controller_read_ahead_on_the_volume_only() -> None:
    ctrl, vd = perc()
    result = plan([profile({"read_ahead_kb": 4096, "controller_read_ahead": "read-ahead"})],
                  topology(ctrl, vd))
    assert [(c.device, c.tunable, c.current, c.desired) for c in result.changes
            if c.tunable == "controller_read_ahead"] == [
        ("sdb", "controller_read_ahead", "adaptive", "read-ahead")]
    skipped = [r for r in result.rejections if r.device == "sda" and r.tunable.startswith("controller")]
    assert [r.tunable for r in skipped] == ["controller_read_ahead"] and not skipped[0].fatal
    assert "not a hardware RAID volume" in skipped[0].reason


def test_pending_reboot_is_in_sync_not_a_change() -> None:
    ctrl, vd = perc(pending={"read_policy": "read-ahead"})
    result = plan([profile({"controller_read_ahead": "read-ahead"})], topology(ctrl, vd))
    assert not [c for c in result.changes if c.device == "sdb"]
    wanted = next(d for d in result.desired if d.device == "sdb")
    assert wanted.in_sync and wanted.pending_reboot and wanted.effective == "adaptive"


def test_asking_back_for_the_value_in_effect_while_another_is_pending_is_a_change() -> None:
    ctrl, vd = perc(pending={"read_policy": "read-ahead"})
    result = plan([profile({"controller_read_ahead": "adaptive"})], topology(ctrl, vd))
    assert [(c.current, c.desired) for c in result.changes] == [("read-ahead", "adaptive")]


@pytest.mark.parametrize("backup", [
    BackupUnit(kind="bbu", state="Failed", optimal=False),
    BackupUnit(kind="none"),
    BackupUnit(kind="cachevault", state="Degraded", optimal=False),
])
def test_write_back_is_refused_without_a_working_backup_unit(backup: BackupUnit) -> None:
    ctrl, vd = perc(backup=backup, write_policy="write-through")
    result = plan([profile({"controller_write_cache": "write-back"})], topology(ctrl, vd))
    fatal = result.fatal
    assert [(r.device, r.tunable) for r in fatal] == [("sdb", "controller_write_cache")]
    assert "always-write-back" in fatal[0].reason and not result.changes


def test_always_write_back_is_the_explicit_choice_and_a_learn_cycle_is_no_failure() -> None:
    ctrl, vd = perc(backup=BackupUnit(kind="bbu", state="Failed"), write_policy="write-through")
    explicit = plan([profile({"controller_write_cache": "always-write-back"})], topology(ctrl, vd))
    assert not explicit.fatal and [c.desired for c in explicit.changes] == ["always-write-back"]
    ctrl, vd = perc(backup=BackupUnit(kind="bbu", state="Learning"), write_policy="write-through")
    learning = plan([profile({"controller_write_cache": "write-back"})], topology(ctrl, vd))
    assert not learning.fatal and [c.desired for c in learning.changes] == ["write-back"]


def test_every_controller_tunable_is_declared_once_with_its_words() -> None:
    found = [t for t in catalog.ordered() if isinstance(t, ControllerTunable)]
    assert {t.setting for t in found} == {"read_policy", "write_policy", "drive_cache"}
    assert all(t.scope == "controller" and t.applies_to == {DeviceKind.DISK} for t in found)
    assert catalog.get("controller_write_cache").json_schema()["enum"] == [
        "write-through", "write-back", "always-write-back"]
