"""Tuning experiments: vary settings on a device, measure each point against the noise,
recommend a StorageProfile with the evidence.

Pure like the rest of ``stortune.schemas``; the agent (``stortune-agent tune``) and the
control plane run the trials, this package decides what to run and what it means.

* ``experiment``: the TuningExperiment document (``parse_experiment``, ``load_experiments``)
* ``space``: points, ``TrialRequest``, ``Measurement``, ``measure``, ``benchmark_for``
* ``engine``: ``Engine`` (ask with ``next``, tell with ``record``), ``Progress``
* ``strategies``: one-at-a-time, grid, bayesian (Optuna TPE, imported by it alone)
* ``evidence``: ``Outcome`` and the recommendation (never noise)
* ``overlay``: the profile that sets a trial's values; ``recommend``: the profile to commit
* ``simulate``: a response surface with measured noise, for tests and bench/tuning_search.py
"""
