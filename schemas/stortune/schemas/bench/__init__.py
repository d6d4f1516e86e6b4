"""Benchmarks: the BenchmarkSpec document, presets, fio jobs and results, statistics.

Pure like the rest of ``stortune.schemas``: the agent runs fio and samples
the kernel; everything here is data in, data out.

* ``spec``: the document (``parse_benchmark``, ``load_benchmark``, ``BenchmarkSpec``)
* ``presets``: the field's workloads by name and their expansion
* ``steps``: ``WorkloadStep`` (one fio run) and ``TargetFacts``
* ``fiojob``: a step -> fio job file; ``fioresult``: fio's JSON -> ``FioResult``
* ``stats``: summaries over repeats, the noise rule, iozone tables
* ``results``: ``BenchmarkResult``, ``RunProgress``, ``DeviceStats``, thresholds' verdict
* ``target``: devices beneath a target, drive counts
"""
