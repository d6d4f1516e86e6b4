"""Benchmarks on this host: fio runs, diskstats sampling, target safety, stored results.

The control plane's gRPC service and ``stortune-agent bench`` both go through
``BenchmarkManager`` (``manager``). The documents, presets, fio job files,
fio output parsing and statistics are pure and live in ``stortune.schemas.bench``.

* ``manager``: start / progress / cancel / wait / result / forget, one run at a time
* ``fio``: the ``FioRunner`` seam and the real subprocess runner
* ``sampler``: /proc/diskstats figures for the target and every device beneath it
* ``targets``: resolving a spec's target, and the safety rules for writes
* ``signatures``: what a device holds, as libblkid (util-linux's wipefs) sees it
* ``store``: runs on disk under the state directory; ``context``: settings in effect
"""
