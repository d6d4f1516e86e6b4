"""The agent's heap upkeep: capped malloc arenas and freed pages handed back (glibc)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from stortune.agent import heap

pytestmark = pytest.mark.skipif(heap._libc() is None, reason="no glibc malloc here")


def test_trim_hands_freed_heap_back_to_the_kernel() -> None:
    # In a child: what a discovery of a large host leaves behind is many small freed objects.
    script = textwrap.dedent("""
        from stortune.agent import heap
        def rss():
            with open("/proc/self/status") as fh:
                return next(int(l.split()[1]) for l in fh if l.startswith("VmRSS:")) * 1024
        assert heap.limit_arenas()
        junk = [bytearray(512) for _ in range(200_000)]
        del junk
        before = rss()
        released = heap.trim()
        print(released, before - rss())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    released, freed = out.split()
    assert released == "True"
    assert int(freed) > 32 << 20  # most of the ~110 MB the objects took

