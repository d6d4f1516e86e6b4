"""Experiment documents for the tuning tests: a valid one, changed per test."""

from __future__ import annotations

import copy
from typing import Any

from stortune.schemas.tuning.experiment import TuningExperiment, parse_experiment

BASE: dict[str, Any] = {
    "apiVersion": "stortune/v1",
    "kind": "TuningExperiment",
    "metadata": {"name": "streamer-readahead"},
    "spec": {
        "target": {"device": {"kind": ["loop"]}},
        "workloads": [{"preset": "stream-32k", "runtime": "20s"}],
        "objective": {"metric": "read_bandwidth", "goal": "maximize"},
        "parameters": [
            {"tunable": "read_ahead_kb", "values": [0, 128, 1024, 4096, 16384]},
            {"tunable": "nr_requests", "values": [32, 64, 128, 256]},
        ],
        "strategy": "one-at-a-time",
        "repeats": {"min": 2, "max": 5},
        "budget": {"trials": 60, "duration": "30m"},
    },
}


def doc(**spec: Any) -> dict[str, Any]:
    """BASE with ``spec`` fields replaced (None removes one)."""
    out = copy.deepcopy(BASE)
    for key, value in spec.items():
        if value is None:
            out["spec"].pop(key, None)
        else:
            out["spec"][key] = value
    return out


def experiment(**spec: Any) -> TuningExperiment:
    return parse_experiment(doc(**spec))
