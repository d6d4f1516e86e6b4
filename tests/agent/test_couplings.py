"""The catalog's ``resets`` against this kernel: bench/couplings.py measures, on fresh loop
devices, what every write of a catalog tunable changes besides itself; each catalog tunable
changed that way must be declared, or restore would leave it where the write put it."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.root, pytest.mark.slow]

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "couplings.py"


def test_every_coupling_measured_on_this_kernel_is_declared() -> None:
    if os.geteuid() != 0 or shutil.which("losetup") is None:
        pytest.skip("needs root and losetup (fresh loop devices)")
    spec = importlib.util.spec_from_file_location("couplings", SCRIPT)
    assert spec is not None and spec.loader is not None
    couplings = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = couplings  # its dataclasses look themselves up there
    try:
        spec.loader.exec_module(couplings)
    finally:
        sys.modules.pop(spec.name, None)

    experiments, offered = couplings.measure()
    text, ok = couplings.report(experiments, offered)
    assert ok, text
    # The coupling issue 14 found: a switch to bfq turns a default writeback throttle off.
    if "bfq" in offered:
        assert any(e.write == "scheduler" and e.after == "bfq" and "wbt_lat_usec" in e.changed
                   for e in experiments), text
