"""A setting the hosts cannot set is an error the CLI says and exits 1 on, in the dry run, in
diff and after apply (issue 26, point 9): nobody learns of it only from a host's condition."""

from __future__ import annotations

from pathlib import Path

from tests.cli.conftest import ControlPlane, Run, profile_yaml

#: sda offers none and mq-deadline (tests.cli.conftest.raid_volume).
BAD = profile_yaml("turbo").replace("{read_ahead_kb: 4096}", "{scheduler: bfq-turbo, nr_requests: 32}")
ERROR = ("error: host/web-1: sda scheduler=bfq-turbo (turbo/raid-volumes) cannot be set: scheduler"
         " 'bfq-turbo' is not offered by this kernel for this device; offered: none, mq-deadline")


def _files(tmp_path: Path) -> Path:
    path = tmp_path / "profiles.yaml"
    path.write_text(BAD + "---\n" + profile_yaml("vod"))
    return path


def test_hostile_apply_dry_run_exits_1_on_a_value_a_host_cannot_set(
        stortune: Run, control_plane: ControlPlane, tmp_path: Path) -> None:
    control_plane.register("web-1", {"role": "streamer"})
    result = stortune("apply", "-f", str(_files(tmp_path)), "--dry-run")
    assert result.code == 1, result.out
    assert ERROR in result.err.splitlines()
    # The rest is still planned: the other profile's setting and the same profile's nr_requests.
    planned = {tuple(line.split()[:2]) for line in result.out.splitlines()}
    assert {("sda", "read_ahead_kb"), ("sda", "nr_requests")} <= planned
    assert control_plane.profiles() == {}


def test_hostile_diff_exits_1_not_2_on_a_value_a_host_cannot_set(
        stortune: Run, control_plane: ControlPlane, tmp_path: Path) -> None:
    control_plane.register("web-1", {"role": "streamer"})
    path = _files(tmp_path)
    result = stortune("diff", "-f", str(path))
    assert result.code == 1, result.out
    assert ERROR in result.err.splitlines()
    # Stored, it is still an error (not "in sync", not "differences").
    assert stortune("apply", "-f", str(path)).code == 1
    again = stortune("diff", "-f", str(path))
    assert again.code == 1 and ERROR in again.err.splitlines()


def test_hostile_apply_stores_then_prints_the_servers_errors_and_exits_1(
        stortune: Run, control_plane: ControlPlane, tmp_path: Path) -> None:
    control_plane.register("web-1", {"role": "streamer"})
    control_plane.register("db-1", {"role": "database"})  # not selected: nothing said of it
    result = stortune("apply", "-f", str(_files(tmp_path)))
    assert result.code == 1, result.err
    assert result.out.splitlines() == ["storageprofile/turbo created", "storageprofile/vod created"]
    assert result.err.splitlines()[0] == ERROR and "db-1" not in result.err
    assert "1 setting(s) cannot be set (every other setting is applied)" in result.err
    assert sorted(control_plane.profiles()) == ["turbo", "vod"]


def test_apply_and_diff_of_settable_values_exit_0(
        stortune: Run, control_plane: ControlPlane, tmp_path: Path) -> None:
    control_plane.register("web-1", {"role": "streamer"})
    path = tmp_path / "ok.yaml"
    path.write_text(BAD.replace("bfq-turbo", "mq-deadline") + "---\n" + profile_yaml("vod"))
    dry = stortune("apply", "-f", str(path), "--dry-run")
    assert dry.code == 0 and "error" not in dry.err, dry.err
    assert stortune("apply", "-f", str(path)).code == 0
    # No agent here applies them: pending host changes, which is 2, not an error.
    assert stortune("diff", "-f", str(path)).code == 2
