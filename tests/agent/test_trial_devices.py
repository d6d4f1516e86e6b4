"""Issue 26, point 2 on real loop devices: a control-plane experiment's trial values (its overlay,
stored by the agent as part of what it applied) never land on another device, and never come
back by themselves when the agent starts again.

The agent cannot confirm at start that an experiment still runs (the control plane may be
unreachable, or the experiment over), so it always puts the trial values back first; a running
experiment re-sends them with its next trial.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stortune.agent import daemon, journal, local
from stortune.agent.kernelfs import KernelFS
from stortune.agent.serve import Agent, ServeOptions
from stortune.schemas.documents import parse_profile
from stortune.schemas.profile import StorageProfile
from stortune.schemas.tuning.overlay import overlay_profile

pytestmark = [pytest.mark.root]

Start = Callable[[KernelFS, Path], None]
Loops = Callable[[], contextlib.AbstractContextManager[str]]  # the fresh_loops fixture (tests/loopdev.py)


def _daemon(fs: KernelFS, state: Path) -> None:
    assert daemon.run(fs, state, 3600, once=True) == 0


def _serve_without_its_control_plane(fs: KernelFS, state: Path) -> None:
    # Nothing listens on port 1: the agent cannot ask whether the experiment still runs.
    agent = Agent(fs, state, ServeOptions(listen="127.0.0.1:0", server="http://127.0.0.1:1", insecure=True,
                                          rescan_interval=3600, grace=1, backoff_base=30))
    agent.start()
    agent.stop()


STARTS = [_daemon, _serve_without_its_control_plane]


def _ra(name: str) -> int:
    return int((Path("/sys/block") / name / "queue" / "read_ahead_kb").read_text())


def _set_ra(name: str, value: int) -> None:
    (Path("/sys/block") / name / "queue" / "read_ahead_kb").write_text(str(value))


def _backing(name: str) -> Path:
    return Path((Path("/sys/block") / name / "loop" / "backing_file").read_text().strip())


def _losetup(*args: str) -> None:
    subprocess.run(["losetup", *args], check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def _swapped(first: str, second: str) -> Iterator[None]:
    """``first`` and ``second`` detached and re-attached each to the other's file; as they
    were afterwards (fresh_loop releases only a device still attached to its own file)."""
    a, b = _backing(first), _backing(second)

    def attach(x: Path, y: Path) -> None:
        for name in (first, second):
            if (Path("/sys/block") / name / "loop" / "backing_file").exists():
                _losetup("-d", f"/dev/{name}")
        _losetup(f"/dev/{first}", str(x))
        _losetup(f"/dev/{second}", str(y))

    attach(b, a)
    try:
        yield
    finally:
        attach(a, b)


def _desired_state(fs: KernelFS, state: Path, name: str, value: int) -> StorageProfile:
    """What a control plane's trial Apply leaves stored: a desired profile and the trial's
    overlay over it, on ``name`` (named by its stable id); -> the overlay."""
    target = local.discover(fs).device(name)
    assert target is not None and target.id.startswith("loop:"), target
    desired = parse_profile({"apiVersion": "stortune/v1", "kind": "StorageProfile",
                             "metadata": {"name": "streaming"},
                             "spec": {"rules": [{"name": "it", "match": {"id": [target.id]},
                                                 "settings": {"read_ahead_kb": 64}}]}}, "test")
    overlay = overlay_profile("ra-sweep", {"read_ahead_kb": value}, target)
    report = local.converge(fs, [desired, overlay], state, {"streaming": 1, overlay.name: 3})
    assert report.ok, report
    assert _ra(name) == value
    return overlay


@pytest.mark.parametrize("start", STARTS, ids=["daemon", "serve"])
def test_hostile_loop_devices_swapped_while_the_agent_was_down_keep_the_trial_off_the_other_device(
        tmp_path: Path, fresh_loops: Loops, start: Start) -> None:
    fs, state = KernelFS.at(), tmp_path / "state"
    with fresh_loops() as first, fresh_loops() as second:
        _set_ra(second, 2560)
        a_image, b_image = _backing(first), _backing(second)
        _desired_state(fs, state, first, 16)  # a trial's values on a.img's device, loop `first`
        # kill -9 of the agent; the devices come back in the other order.
        with _swapped(first, second):
            assert _backing(first) == b_image and _backing(second) == a_image
            _set_ra(first, 2560)  # b.img's device, now `first`, holds its own value
            _set_ra(second, 16)  # a.img's device, now `second`, as the trial left it
            start(fs, state)
            assert _ra(first) == 2560, "the trial's value went to b.img's device"
            assert _ra(second) == 64, "a.img's device keeps the trial value (or lost its profile's)"
            ids = {device_id for device_id, _ in journal.load_originals(state)}
            assert f"loop:{b_image}" not in ids  # never written, so nothing of it journaled
            stored = local.saved_desired(state)
            assert stored is not None and [p.name for p in stored.profiles] == ["streaming"]


@pytest.mark.parametrize("start", STARTS, ids=["daemon", "serve"])
def test_hostile_an_agent_starting_with_a_trial_overlay_puts_the_values_back_before_anything_else(
        tmp_path: Path, fresh_loops: Loops, start: Start) -> None:
    fs, state = KernelFS.at(), tmp_path / "state"
    with fresh_loops() as name:
        _set_ra(name, 512)  # the device's own value, before any profile
        overlay = _desired_state(fs, state, name, 16)
        start(fs, state)  # no control plane confirms the experiment
        assert _ra(name) == 64  # the desired profile's value, not the trial's
        stored = local.saved_desired(state)
        assert stored is not None and [p.name for p in stored.profiles] == ["streaming"]
        assert stored.generations == {"streaming": 1}
        assert overlay.name not in stored.generations
        start(fs, state)  # a second start finds nothing to put back and changes nothing
        assert _ra(name) == 64
        # Restoring everything still reaches the device's own value: the original was kept.
        assert local.restore(fs, state).ok
        assert _ra(name) == 512
