"""The agent's own re-apply keeps what it set back, with its cause, until the control plane recorded it.

A correction is a setting stortune had applied that was found changed and written back; a first
apply (a new device) is none, and neither is a write a failed apply rolled back.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stortune.agent import corrections, daemon, journal, local
from stortune.schemas.corrections import MAX_BATCH
from stortune.schemas.documents import load_profiles
from tests.agent.fakekernel import PickyKernel
from tests.fixtures.agent_host import Host, build_host

PROFILE = """
apiVersion: stortune/v1
kind: StorageProfile
metadata: {name: loops}
spec:
  rules:
    - name: all-loops
      match: {kind: [loop]}
      settings: {read_ahead_kb: 4096}
"""


def applied(tmp_path: Path) -> tuple[Host, Path]:
    """loop7 with the profile applied (the desired state stored, its original recorded)."""
    host = build_host(tmp_path / "host")
    state = tmp_path / "state"
    assert local.converge(host.fs, load_profiles(PROFILE), state).ok
    assert host.queue("read_ahead_kb") == "4096"
    return host, state


# -- hostile ------------------------------------------------------------------------------------
def test_hostile_a_first_apply_to_a_new_device_is_no_correction(tmp_path: Path) -> None:
    host, state = applied(tmp_path)
    host.builder.loop(8, size=65536, backing_file="/var/tmp/new.img")  # hot-plugged: kernel defaults

    assert daemon.converge(host.fs, state) is not None

    assert host.queue("read_ahead_kb", "loop8") == "4096"
    assert corrections.batch(state) is None


def test_hostile_a_write_the_apply_rolled_back_is_no_correction(tmp_path: Path) -> None:
    host, state = applied(tmp_path)
    (host.fs.sysfs / "block/loop7/queue/read_ahead_kb").write_text("256")
    refusing = PickyKernel.over(host.fs, refuses={"read_ahead_kb": 0})  # EINVAL on every value

    report = daemon.converge(refusing, state)

    # Rolled back, then reported as a setting that cannot be set (the rest would be applied).
    assert report is not None and [r.tunable for r in report.rejected] == ["read_ahead_kb"]
    assert corrections.batch(state) is None


def test_hostile_a_damaged_corrections_file_is_named_and_left_alone(tmp_path: Path) -> None:
    (tmp_path / "corrections.json").write_text('{"epoch": 7}')
    with pytest.raises(journal.StateCorruptError, match=r"corrections\.json: not a corrections file"):
        corrections.batch(tmp_path)
    assert (tmp_path / "corrections.json").read_text() == '{"epoch": 7}'


# -- the cases -----------------------------------------------------------------------------------
def test_a_hand_change_set_back_at_a_rescan_is_kept_with_what_was_found(tmp_path: Path) -> None:
    host, state = applied(tmp_path)
    (host.fs.sysfs / "block/loop7/queue/read_ahead_kb").write_text("256")

    daemon.converge(host.fs, state)

    assert host.queue("read_ahead_kb") == "4096"
    batch = corrections.batch(state)
    assert batch is not None
    assert [(c.seq, c.device, c.tunable, c.found, c.set_to, c.profile, c.rule, c.cause, c.trigger)
            for c in batch.items] == [
        (1, "loop7", "read_ahead_kb", 256, 4096, "loops", "all-loops", "runtime", "rescan")]
    daemon.converge(host.fs, state)  # nothing drifted since: nothing more
    assert len(corrections.batch(state).items) == 1  # type: ignore[union-attr]


def test_the_cause_at_a_start_is_a_reboot_when_the_boot_id_changed(tmp_path: Path) -> None:
    host, state = applied(tmp_path)
    assert daemon.start_cause(host.fs, state) == "runtime"  # the first start knows no earlier boot
    assert daemon.start_cause(host.fs, state) == "runtime"  # restarted, same boot
    host.builder.write("sys/kernel/random/boot_id", "another-boot", base=host.builder.proc)
    (host.fs.sysfs / "block/loop7/queue/read_ahead_kb").write_text("128")  # the kernel's default again

    daemon.converge(host.fs, state, trigger="start", cause=daemon.start_cause(host.fs, state))

    batch = corrections.batch(state)
    assert batch is not None
    assert [(c.found, c.cause, c.trigger) for c in batch.items] == [(128, "reboot", "start")]
    assert daemon.start_cause(host.fs, state) == "runtime"


def test_recorded_corrections_are_dropped_and_the_rest_kept(tmp_path: Path) -> None:
    host, state = applied(tmp_path)
    for value in ("256", "512", "1024"):
        (host.fs.sysfs / "block/loop7/queue/read_ahead_kb").write_text(value)
        daemon.converge(host.fs, state)
    batch = corrections.batch(state)
    assert batch is not None and [c.seq for c in batch.items] == [1, 2, 3]

    corrections.acknowledge(state, "f" * 16, 3)  # another epoch: not these
    assert corrections.batch(state) == batch
    corrections.acknowledge(state, batch.epoch, 2)
    left = corrections.batch(state)
    assert left is not None and [(c.seq, c.found) for c in left.items] == [(3, 1024)]
    corrections.acknowledge(state, batch.epoch, 3)
    assert corrections.batch(state) is None


def test_a_batch_is_bounded_and_the_kept_ones_too(tmp_path: Path) -> None:
    host, state = applied(tmp_path)
    (host.fs.sysfs / "block/loop7/queue/read_ahead_kb").write_text("256")
    before = local.plan(host.fs, load_profiles(PROFILE), state)
    (drifted,) = corrections.drifted(before.topology, before.plan.desired)
    for _ in range(corrections.MAX_PENDING // 8 + 1):
        corrections.add(state, [drifted] * 8, "runtime", "rescan")
    batch = corrections.batch(state)
    assert batch is not None and len(batch.items) == MAX_BATCH
    assert batch.items[0].seq == 9  # the oldest 8 gave way
    assert corrections._load(state).pending[-1].seq == corrections.MAX_PENDING + 8
