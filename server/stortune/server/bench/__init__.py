"""Benchmarks on the control plane: the run queue, schedules, judgement against baselines, charts.

``dispatcher``  the BenchmarkDispatcher: starts queued runs (one per host), follows them,
                stores their results, fires due schedules; run with the app
``store``       its short database transactions, through ``services.benchmarks``
``cron``        5-field cron expressions (UTC) and their next fire time
``judge``       pure: a run against another or against its class's baseline
``plots``       PNG and SVG charts (matplotlib, imported when a chart is asked for)
"""
