"""Agent test fixtures: tiny fake sysfs trees (loop devices come from tests/loopdev.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stortune.agent.kernelfs import KernelFS
from tests.agent.fakekernel import FAKE_QUEUE, make_fake_kernel


@pytest.fixture
def fake_kernel(tmp_path: Path) -> KernelFS:
    """One fake loop-like device, fake0, with the queue attributes in FAKE_QUEUE."""
    return make_fake_kernel(tmp_path / "kernel", {"fake0": dict(FAKE_QUEUE)})
