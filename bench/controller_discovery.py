"""Controller discovery: how long the vendor tools take to be asked and parsed, and what it adds
to the agent's memory.

Runs the fake tools of tests/fixtures/raid_fakes.py (Python scripts printing each tool's real
format from a state file), so the time is dominated by starting those scripts: a real storcli64
takes about a second per call on real hardware, which is why discovery reuses an answer for
``--controller-cache`` seconds. Figures:

* per adapter and all four at once: tool calls per discovery and the median wall time of one
  discovery, and of one apply's read-back (a fresh ask);
* the RSS a serving agent gains from its first controller discovery (adapters imported, one
  inventory parsed and kept), measured in a fresh interpreter that has imported the serve path.

The absolute idle RSS of a managed agent with a fake PERC on its tool path is printed by
bench/agent_idle_rss.py (mode "managed, a PERC behind perccli64").
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RUNS = 5

_RSS_PROBE = """
import sys
sys.path.insert(0, {root!r})
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1])
import stortune.agent.serve, stortune.agent.cli
from stortune.agent.controllers.access import ControllerAccess
from stortune.agent.tools import ToolRunner
access = ControllerAccess(ToolRunner([{bin!r}]))
before = rss()
inv = access.inventory()
assert inv is not None and inv.controllers, inv
print(rss() - before, len(inv.controllers), sum(len(c.virtual_drives) for c in inv.controllers))
"""


def _fakes(bin_dir: Path, which: str) -> None:
    from tests.fixtures import raid_fakes

    if which in ("perc", "all"):
        raid_fakes.fake_megaraid(bin_dir, ("legacy",), name="perccli64")
    if which in ("megaraid", "all"):
        raid_fakes.fake_megaraid(bin_dir, ("modern", "modern"))
    if which in ("smartarray", "all"):
        raid_fakes.fake_ssacli(bin_dir, ("gen10", "gen6"))
    if which in ("arcconf", "all"):
        raid_fakes.fake_arcconf(bin_dir, ("series8", "serveraid8"))


def main() -> int:
    from stortune.agent.controllers.access import ControllerAccess
    from stortune.agent.tools import ToolRunner
    from tests.fixtures.raid_fakes import FakeTool

    print(f"controller discovery through the fake vendor tools, median of {RUNS} runs")
    for which in ("perc", "megaraid", "smartarray", "arcconf", "all"):
        with tempfile.TemporaryDirectory(prefix="stortune-bench-ctl-") as tmp:
            bin_dir = Path(tmp)
            _fakes(bin_dir, which)
            access = ControllerAccess(ToolRunner([str(bin_dir)]), ttl=3600)
            times = []
            inv = None
            for _ in range(RUNS):
                start = time.perf_counter()
                inv = access.inventory(fresh=True)
                times.append(time.perf_counter() - start)
            assert inv is not None
            calls = sum(len(FakeTool(p).calls()) for p in bin_dir.iterdir()
                        if p.is_file() and os.access(p, os.X_OK)) // RUNS  # the tools, not their state
            start = time.perf_counter()
            cached = access.inventory()
            hit = time.perf_counter() - start
            assert cached is inv
            vds = sum(len(c.virtual_drives) for c in inv.controllers)
            print(f"  {which:<10} {len(inv.controllers)} controller(s), {vds} volume(s), {calls} tool"
                  f" call(s): {statistics.median(times) * 1000:7.1f} ms per discovery"
                  f" (cached answer {hit * 1e6:.0f} us), errors {len(inv.errors)}")
        with tempfile.TemporaryDirectory(prefix="stortune-bench-ctl-") as tmp:
            _fakes(Path(tmp), which)
            out = subprocess.run([sys.executable, "-c", _RSS_PROBE.format(root=str(ROOT), bin=tmp)],
                                 capture_output=True, text=True, check=True).stdout.split()
            print(f"  {'':<10} RSS added to a serving agent by its first discovery:"
                  f" {int(out[0]) / 1024:.2f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
