"""What a probe of a 4-member array costs: wall time and the agent's CPU (root, fio).

Four new direct-I/O loop devices over real blocks are the members of an md raid0 described
by a fixture sysfs tree (its dev dir holds block device nodes with the loops' own numbers),
as in tests/agent/test_probe_loop.py. The probe runs in this process (ProbeManager, the same
code serve runs), so "agent CPU" is this process's user+sys over the probe (the probe runner:
job files, status, parsing, storing), reported apart from fio's (its child processes).

    python bench/probe_cost.py [--seconds 2]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import stat
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stortune.agent.probe.jobs import ProbeSettings
from stortune.agent.probe.runner import ProbeManager
from tests.fixtures.sysfs_builder import SysfsBuilder
from tests.loopdev import fresh_loop

SIZE = 256 << 20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per probe step (default 2)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stortune-probe-cost-") as tmp, contextlib.ExitStack() as stack:
        root = Path(tmp)
        loops = [stack.enter_context(fresh_loop(root, SIZE, direct_io=True, fill=True)) for _ in range(4)]
        b = SysfsBuilder(root / "host", hostname="probe-cost")
        dirs = [b.loop(int(n[4:]), size=SIZE // 512)[1] for n in loops]
        b.md(0, dirs, level="raid0", chunk=512 << 10)
        fs = b.finish()
        fs.dev.mkdir(parents=True, exist_ok=True)
        for n in loops:
            os.mknod(fs.dev / n, stat.S_IFBLK | 0o600, os.makedev(7, int(n[4:])))
        probes = ProbeManager(fs, root / "state", settings=ProbeSettings(seconds=args.seconds))
        self0, kids0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        wall0 = time.monotonic()
        probe_id = probes.start("md0")
        progress = probes.wait(probe_id, timeout=600)
        wall = time.monotonic() - wall0
        self1, kids1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        result = probes.result(probe_id)
        agent_cpu = (self1.ru_utime - self0.ru_utime) + (self1.ru_stime - self0.ru_stime)
        fio_cpu = (kids1.ru_utime - kids0.ru_utime) + (kids1.ru_stime - kids0.ru_stime)
        steps = len(list((root / "state" / "probes" / probe_id / "steps").iterdir()))
        print(f"probe of a 4-member md raid0 over loop devices ({', '.join(loops)}),"
              f" {args.seconds:g} s per step")
        print(f"  state {progress.state}: {progress.message}")
        print(f"  steps {steps}, wall {wall:.2f} s (fio's runtime alone: {steps * args.seconds:.0f} s)")
        print(f"  agent CPU (this process, the in-process probe runner; user+sys): {agent_cpu:.3f} s")
        print(f"  fio CPU (child processes, user+sys): {fio_cpu:.3f} s")
        if result is not None:
            for p in result.scaling:
                print(f"  {p.count} at once: {p.read_bytes_per_second / 1e6:,.0f} MB/s")
    return 0 if progress.state == "done" else 1


if __name__ == "__main__":
    raise SystemExit(main())
