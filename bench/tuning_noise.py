"""The run-to-run noise of a buffered 32K stream on a direct-I/O loop device: the CV the
simulated surface of tuning experiments uses (stortune.schemas.tuning.simulate.NOISE_CV).

    sudo .venv/bin/python bench/tuning_noise.py [--repeats 10] [--size 1G] [--dir /var/tmp]

Makes a backing file full of written blocks (not sparse: holes would be read as zeros
without any I/O), attaches it with ``losetup --direct-io=on`` (reads of the loop device
bypass the host page cache of the file, so they reach the disk), sets read_ahead_kb, and
runs the stream-32k preset (8 buffered psync readers of 32 KiB, each through its own
region once, the device's cache dropped before each run) ``--repeats`` times per
read-ahead value. Prints the bandwidth of each run, the mean and the CV. The loop device
and the file are removed afterwards, whatever happens.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from stortune.schemas import sizes
from stortune.schemas.bench import fioresult, presets
from stortune.schemas.bench.fiojob import FioTarget, render
from stortune.schemas.bench.steps import TargetFacts


@contextlib.contextmanager
def direct_loop(directory: Path, size: int) -> Iterator[str]:
    with tempfile.NamedTemporaryFile(dir=directory, prefix="stortune-noise-", suffix=".img") as fh:
        chunk = b"\xa5" * (1 << 20)
        for _ in range(size >> 20):
            fh.write(chunk)
        fh.flush()
        os.fsync(fh.fileno())
        dev = subprocess.run(["losetup", "--find", "--show", "--direct-io=on", fh.name], check=True,
                             capture_output=True, text=True, timeout=60).stdout.strip()
        try:
            yield dev
        finally:
            subprocess.run(["losetup", "-d", dev], check=False, timeout=60)


def set_read_ahead(dev: str, kb: int) -> int:
    path = Path("/sys/block") / Path(dev).name / "queue" / "read_ahead_kb"
    before = int(path.read_text())
    path.write_text(str(kb))
    return before


def run(dev: str, size: int) -> float:
    step = presets.expand("stream-32k", "stream-32k", presets.Overrides(), TargetFacts(size_bytes=size))[0]
    job = render(step, FioTarget(dev, size))
    with tempfile.NamedTemporaryFile("w", suffix=".fio") as fh:
        fh.write(job)
        fh.flush()
        out = subprocess.run(["fio", "--output-format=json", fh.name], check=True, capture_output=True,
                             text=True, timeout=600).stdout
    return fioresult.parse(out).read.bandwidth


def cv(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return mean, sd / mean


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--size", default="1G")
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp"))
    ap.add_argument("--read-ahead", type=int, nargs="+", default=[128, 0])
    args = ap.parse_args(argv)
    size = sizes.parse_size(args.size)
    with direct_loop(args.dir, size) as dev:
        before = set_read_ahead(dev, args.read_ahead[0])
        try:
            for kb in args.read_ahead:
                set_read_ahead(dev, kb)
                values = [run(dev, size) for _ in range(args.repeats)]
                mean, c = cv(values)
                shown = " ".join(f"{v / 1e6:.0f}" for v in values)
                print(f"read_ahead_kb={kb}: {args.repeats} runs, MB/s {shown}; mean {mean / 1e6:.1f} MB/s,"
                      f" CV {100 * c:.2f}%")
        finally:
            set_read_ahead(dev, before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
