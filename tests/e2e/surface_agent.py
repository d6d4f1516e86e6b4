"""A real managed agent (``stortune-agent serve``'s Agent: gRPC, registration, journal) on a fixture
host whose fio is ``SurfaceFio``: the e2e tests of tuning experiments run it as a process, so it
can be SIGKILLed mid-trial and started again on the same host tree and state directory.

    python -m tests.e2e.surface_agent --root DIR --state DIR --server URL --listen 127.0.0.1:PORT
                                      --name NAME --label k=v --token-file FILE

The host (one loop device, loop7, with its node in the tree) is built at the first start and
kept: its sysfs files hold what the agent wrote, across restarts. ``ROOT/control`` steers fio.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from stortune.agent import serve
from stortune.agent.kernelfs import KernelFS
from tests.agent.fakefio import SurfaceFio
from tests.fixtures.sysfs_builder import SysfsBuilder

#: Bytes/s of buffered 32K streams by read_ahead_kb: 0 starves the streams, 1024 is best.
SURFACE = {0: 90e6, 128: 300e6, 1024: 420e6, 4096: 340e6, 16384: 280e6}


def host(root: Path) -> KernelFS:
    if (root / "built").exists():
        return KernelFS(root / "sys", root / "proc", root / "dev")
    b = SysfsBuilder(root, hostname="tunehost", kernel="6.1.0-18-amd64")
    b.loop(7, size=131072, backing_file="/var/tmp/tune-e2e.img")
    b.write("diskstats", "   7       7 loop7 10 0 80 4 0 0 0 0 0 4 4 0 0 0 0 0 0", base=b.proc)
    b.write("sys/kernel/random/boot_id", "0b5e4f3c-1111-4222-8333-444455556666", base=b.proc)
    fs = b.finish()
    fs.dev.mkdir(exist_ok=True)
    with open(fs.device_node("loop7"), "wb") as fh:
        fh.truncate(64 << 20)
    (root / "control").mkdir(exist_ok=True)
    (root / "built").write_text("")
    return fs


def main() -> int:
    parser = argparse.ArgumentParser()
    for flag in ("--root", "--state", "--server", "--listen", "--name", "--token-file"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--label", action="append", default=[])
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    root = Path(args.root)
    fs = host(root)
    queue = fs.sysfs / "block" / "loop7" / "queue"

    def read_ahead() -> int:
        return int((queue / "read_ahead_kb").read_text().strip())

    options = serve.ServeOptions(
        listen=args.listen, server=args.server, name=args.name,
        labels=dict(label.split("=", 1) for label in args.label), rescan_interval=2,
        token=Path(args.token_file).read_text().strip())
    agent = serve.Agent(fs, Path(args.state), options)
    agent.service.bench.runner = SurfaceFio(read_ahead, lambda ra: SURFACE.get(ra, 250e6),
                                            control=root / "control")
    import threading

    stop = threading.Event()
    with serve._signals(stop):
        try:
            agent.start()
            while not stop.wait(1.0):
                pass
        finally:
            agent.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
