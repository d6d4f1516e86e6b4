"""stortune diff as a CI gate: 0 in sync, 2 differences (server or hosts), 1 error."""

from __future__ import annotations

from pathlib import Path

from tests.cli.conftest import ControlPlane, Run, free_port, profile_yaml, raid_volume

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def test_diff_is_0_in_sync_and_2_with_a_unified_diff_of_what_changed(
    stortune: Run, control_plane: ControlPlane, tmp_path: Path
) -> None:
    path = tmp_path / "vod.yaml"
    path.write_text(profile_yaml("vod"))
    missing = stortune("diff", "-f", str(path))
    assert missing.code == 2
    assert "--- /dev/null" in missing.out
    assert f"+++ {path}:storageprofile/vod" in missing.out
    assert control_plane.profiles() == {}  # diff never writes

    assert stortune("apply", "-f", str(path)).code == 0
    in_sync = stortune("diff", "-f", str(path))
    assert in_sync.code == 0, in_sync.out + in_sync.err
    assert "in sync" in in_sync.out

    path.write_text(profile_yaml("vod", read_ahead_kb=8192, labels="{team: media}"))
    changed = stortune("diff", "-f", str(path))
    assert changed.code == 2
    lines = changed.out.splitlines()
    assert "--- server:storageprofile/vod" in lines
    assert "-      read_ahead_kb: 4096" in lines
    assert "+      read_ahead_kb: 8192" in lines
    assert "+    team: media" in lines


def test_diff_prune_counts_managed_profiles_missing_from_the_files(
    stortune: Run, control_plane: ControlPlane, tmp_path: Path
) -> None:
    keep, gone = tmp_path / "keep.yaml", tmp_path / "gone.yaml"
    keep.write_text(profile_yaml("keep"))
    gone.write_text(profile_yaml("gone"))
    assert stortune("apply", "-f", str(keep), "-f", str(gone)).code == 0
    with control_plane.http() as http:
        http.post("/profiles", content=profile_yaml("handmade"), headers={"content-type": "application/yaml"})

    assert stortune("diff", "-f", str(keep)).code == 0  # without --prune, extra objects are fine
    pruned = stortune("diff", "-f", str(keep), "--prune")
    assert pruned.code == 2
    assert "--- server:storageprofile/gone" in pruned.out
    assert "handmade" not in pruned.out


def test_diff_is_2_when_a_host_would_still_change(
    stortune: Run, control_plane: ControlPlane, tmp_path: Path
) -> None:
    path = tmp_path / "vod.yaml"
    path.write_text(profile_yaml("vod"))
    assert stortune("apply", "-f", str(path)).code == 0
    assert stortune("diff", "-f", str(path)).code == 0

    # The stored profile is unchanged, but this host has not applied it yet.
    control_plane.register("web-1", {"role": "streamer"})
    pending = stortune("diff", "-f", str(path))
    assert pending.code == 2
    assert "host/web-1: 1 change(s)" in pending.out
    assert "0 profile difference(s), 1 pending host change(s)" in pending.out

    # Already at the desired value: nothing would change there.
    control_plane.register("web-1", {"role": "streamer"}, devices=[raid_volume(read_ahead_kb=4096)])
    assert stortune("diff", "-f", str(path)).code == 0


def test_diff_is_2_for_a_setting_removed_from_a_profile(
    stortune: Run, control_plane: ControlPlane, tmp_path: Path
) -> None:
    """The host's agent reports read_ahead_kb 4096, changed by stortune from 2560. The profile no
    longer sets it: applying puts it back, so that is a pending change, shown and counted."""
    control_plane.register("web-1", {"role": "streamer"},
                           devices=[raid_volume(read_ahead_kb=4096, original=2560)])
    path = tmp_path / "vod.yaml"
    path.write_text(profile_yaml("vod"))
    assert stortune("apply", "-f", str(path)).code == 0
    assert stortune("diff", "-f", str(path)).code == 0

    path.write_text(profile_yaml("vod").replace("{read_ahead_kb: 4096}", "{scheduler: none}"))
    removed = stortune("diff", "-f", str(path))
    assert removed.code == 2, removed.out + removed.err
    row = next(line for line in removed.out.splitlines() if "read_ahead_kb" in line and "->" in line)
    assert row.split()[:6] == ["sda", "read_ahead_kb", "4096", "->", "2560", "(original)"]
    assert "1 profile difference(s), 1 pending host change(s)" in removed.out
    preview = stortune("apply", "-f", str(path), "--dry-run")
    assert preview.code == 0 and "4096 -> 2560 (original)" in preview.out

    # Stored, but the host has not put it back yet: the gate is still red.
    assert stortune("apply", "-f", str(path)).code == 0
    pending = stortune("diff", "-f", str(path))
    assert pending.code == 2, pending.out
    assert "0 profile difference(s), 1 pending host change(s)" in pending.out
    # Once the host reports it back at its original (the journal forgot it): in sync.
    control_plane.register("web-1", {"role": "streamer"}, devices=[raid_volume(read_ahead_kb=2560)])
    assert stortune("diff", "-f", str(path)).code == 0


def test_diff_prune_is_2_for_the_settings_a_prune_puts_back(
    stortune: Run, control_plane: ControlPlane, tmp_path: Path
) -> None:
    control_plane.register("web-1", {"role": "streamer"},
                           devices=[raid_volume(read_ahead_kb=4096, original=2560)])
    keep, gone = tmp_path / "keep.yaml", tmp_path / "gone.yaml"
    keep.write_text(profile_yaml("keep").replace("{read_ahead_kb: 4096}", "{scheduler: none}"))
    gone.write_text(profile_yaml("gone"))
    assert stortune("apply", "-f", str(keep), "-f", str(gone)).code == 0
    assert stortune("diff", "-f", str(keep), "-f", str(gone), "--prune").code == 0

    pruned = stortune("diff", "-f", str(keep), "--prune")
    assert pruned.code == 2
    assert "4096 -> 2560 (original)" in pruned.out
    assert "1 profile difference(s), 1 pending host change(s)" in pruned.out
    preview = stortune("apply", "-f", str(keep), "--prune", "--dry-run")
    assert preview.code == 0 and "4096 -> 2560 (original)" in preview.out
    assert sorted(control_plane.profiles()) == ["gone", "keep"]

    assert stortune("apply", "-f", str(keep), "--prune").code == 0
    assert sorted(control_plane.profiles()) == ["keep"]
    pending = stortune("diff", "-f", str(keep), "--prune")
    assert pending.code == 2, pending.out  # the host has yet to put it back
    assert "0 profile difference(s), 1 pending host change(s)" in pending.out


def test_a_setting_moved_from_one_file_to_another_is_the_new_value_not_a_restoration(
    stortune: Run, control_plane: ControlPlane, tmp_path: Path
) -> None:
    """One file removes read_ahead_kb from the stronger profile (aaa sorts first at equal
    priority), another adds it to the weaker one: the host goes to the weaker one's value."""
    control_plane.register("web-1", {"role": "streamer"},
                           devices=[raid_volume(read_ahead_kb=4096, original=2560)])
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(profile_yaml("aaa"))
    b.write_text(profile_yaml("bbb").replace("{read_ahead_kb: 4096}", "{scheduler: none}"))
    assert stortune("apply", "-f", str(a), "-f", str(b)).code == 0

    a.write_text(profile_yaml("aaa").replace("{read_ahead_kb: 4096}", "{scheduler: none}"))
    b.write_text(profile_yaml("bbb", read_ahead_kb=1024))
    moved = stortune("diff", "-f", str(a), "-f", str(b))
    assert moved.code == 2
    row = next(line for line in moved.out.splitlines() if "read_ahead_kb" in line and "->" in line)
    assert row.split() == ["sda", "read_ahead_kb", "4096", "->", "1024", "bbb/raid-volumes"]
    assert "(original)" not in moved.out
    assert "2 profile difference(s), 1 pending host change(s)" in moved.out


def test_audit_mode_changes_are_shown_but_do_not_fail_the_gate(
    stortune: Run, control_plane: ControlPlane, tmp_path: Path
) -> None:
    control_plane.register("web-1", {"role": "streamer"})
    path = tmp_path / "vod.yaml"
    path.write_text(profile_yaml("vod", mode="audit"))
    assert stortune("apply", "-f", str(path)).code == 0
    result = stortune("diff", "-f", str(path))
    assert result.code == 0, result.out
    assert "(audit: reported only)" in result.out


def test_diff_is_1_on_an_invalid_file_or_an_unreachable_server(stortune: Run, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(profile_yaml("bad", read_ahead_kb=-4))
    invalid = stortune("diff", "-f", str(bad))
    assert invalid.code == 1
    assert "spec.rules[0].settings.read_ahead_kb" in invalid.err

    good = tmp_path / "good.yaml"
    good.write_text(profile_yaml("good"))
    missing = stortune("diff", "-f", str(tmp_path / "nope.yaml"))
    assert missing.code == 1
    assert "nope.yaml: cannot read" in missing.err

    url = f"http://127.0.0.1:{free_port()}"
    down = stortune("diff", "-f", str(good), server=url)
    assert down.code == 1
    assert f"error: cannot reach the control plane at {url}: " in down.err
    assert down.out == ""


def test_examples_apply_then_diff(stortune: Run, control_plane: ControlPlane) -> None:
    applied = stortune("apply", "-f", str(EXAMPLES))
    assert applied.code == 0, applied.err
    names = sorted(line.split()[0] for line in applied.out.splitlines())
    assert names == sorted(f"storageprofile/{p.stem}" for p in EXAMPLES.glob("*.yaml"))

    quiet = stortune("diff", "-f", str(EXAMPLES))
    assert quiet.code == 0, quiet.out + quiet.err  # no host is selected: nothing would change

    # A streaming host with a MegaRAID volume at the kernel's read-ahead: vod-streamer would change it.
    control_plane.register("web-1", {"role": "streamer"})
    gate = stortune("diff", "-f", str(EXAMPLES))
    assert gate.code == 2
    assert "host/web-1:" in gate.out
    row = next(line for line in gate.out.splitlines() if "read_ahead_kb" in line)
    assert row.split() == ["sda", "read_ahead_kb", "128", "->", "4096", "vod-streamer/raid-volumes"]
    assert "0 profile difference(s)" in gate.out  # the server holds exactly the examples
