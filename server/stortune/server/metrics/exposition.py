"""The fleet's gauges in the Prometheus text format, each host's lines kept until the host changes.

prometheus-client formats about 130,000 samples a second; a fleet of 10,000
hosts with 24 managed settings each has half a million. So these families are
written here, and each host's lines are kept with the resourceVersion they
were written at: a scrape after one host changed formats that host again and
joins the others as they were (as api/rendered.py does for host documents).
Label values are escaped as the format requires (backslash, double quote,
newline); tests parse the output back with prometheus-client's parser.

Series follow kube-state-metrics: one per condition and status (1 for the
current status, 0 for the others), ``_info`` series for strings, and a
``device`` label with the kernel name so they join node_exporter's
``node_disk_*``. No ``instance``-like label: the scrape target is the control
plane, the host is a label.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping, Sequence

from stortune.server.services.fleet_state import FleetState, HostRecord
from stortune.server.services.regressions import Regressions, Verdict

CONDITION_STATUSES = ("true", "false", "unknown")

#: (name, type, help), in the order they are written.
FAMILIES = (
    ("stortune_host_info", "gauge", "A managed host: its address, agent version and kernel; always 1"),
    ("stortune_host_labels", "gauge", "A host's effective labels as label_<key>; always 1"),
    ("stortune_host_condition", "gauge",
     "Host conditions (Ready, Reachable, Applied, Drifted): 1 for the current status, 0 for the others"),
    ("stortune_host_condition_reason", "gauge", "The reason of each host condition now; always 1"),
    ("stortune_setting_desired", "gauge", "Desired value of an integer setting by host, device, tunable"),
    ("stortune_setting_observed", "gauge", "Observed value of an integer setting by host, device, tunable"),
    ("stortune_setting_desired_info", "gauge", "Desired value of a string setting (value label); always 1"),
    ("stortune_setting_observed_info", "gauge", "Observed value of a string setting (value label); always 1"),
)
_NOT_NAME = re.compile(r"[^a-zA-Z0-9_]")


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def label_name(key: str) -> str:
    """A host label key as a Prometheus label name (kube-state-metrics' label_ prefix)."""
    return "label_" + _NOT_NAME.sub("_", key)


def _labels(pairs: Mapping[str, str]) -> str:
    return "{" + ",".join(f'{k}="{escape(v)}"' for k, v in pairs.items()) + "}"


def host_lines(r: HostRecord) -> tuple[str, ...]:
    """This host's lines of each family in FAMILIES, in that order."""
    host = f'host="{escape(r.name)}"'
    info = (f'stortune_host_info{{{host},address="{escape(r.address)}",'
            f'agent_version="{escape(r.agent_version)}",kernel="{escape(r.kernel)}"}} 1\n')
    # Two keys may map to one name (a.b and a_b): the later one in key order wins, never a duplicate.
    labels = {label_name(k): v for k, v in sorted(r.labels.items())}
    tagged = "stortune_host_labels" + _labels({"host": r.name, **labels}) + " 1\n"
    conditions = "".join(
        f'stortune_host_condition{{{host},condition="{escape(kind)}",status="{s}"}} '
        f'{1 if status.lower() == s else 0}\n'
        for kind, (status, _) in sorted(r.conditions.items()) for s in CONDITION_STATUSES)
    reasons = "".join(
        f'stortune_host_condition_reason{{{host},condition="{escape(kind)}",reason="{escape(reason)}"}} 1\n'
        for kind, (_, reason) in sorted(r.conditions.items()))
    numbers: list[list[str]] = [[], []]
    strings: list[list[str]] = [[], []]
    for device, tunable, desired, observed in r.settings:
        where = f'{host},device="{escape(device)}",tunable="{escape(tunable)}"'
        for i, value in enumerate((desired, observed)):
            kind = ("desired", "observed")[i]
            if isinstance(value, int):
                numbers[i].append(f"stortune_setting_{kind}{{{where}}} {value}\n")
            elif isinstance(value, str):
                strings[i].append(f'stortune_setting_{kind}_info{{{where},value="{escape(value)}"}} 1\n')
    return (info, tagged, conditions, reasons, "".join(numbers[0]), "".join(numbers[1]), "".join(strings[0]),
            "".join(strings[1]))


class FleetExposition:
    """Renders a FleetState; keeps each host's lines by (name, resourceVersion)."""

    def __init__(self, fleet: FleetState, regressions: Regressions | None = None) -> None:
        self.fleet = fleet
        self.regressions = regressions or Regressions(None)
        self._kept: dict[str, tuple[int, tuple[str, ...]]] = {}
        self._lock = threading.Lock()

    def render(self) -> bytes:
        hosts = self.fleet.hosts
        with self._lock:  # one render at a time: concurrent scrapes would format the same hosts twice
            kept = self._kept
            fresh: dict[str, tuple[int, tuple[str, ...]]] = {}
            for name, record in hosts.items():
                entry = kept.get(name)
                if entry is None or entry[0] != record.version:
                    entry = (record.version, host_lines(record))
                fresh[name] = entry
            self._kept = fresh  # deleted hosts fall out here
        ordered = [fresh[name][1] for name in sorted(fresh)]
        parts: list[str] = []
        for i, (name, kind, text) in enumerate(FAMILIES):
            parts.append(f"# HELP {name} {text}\n# TYPE {name} {kind}\n")
            parts.extend(lines[i] for lines in ordered)
        parts.append(_runs(self.fleet.runs))
        parts.append(regression_lines(self.regressions.verdicts))
        parts.append(f"# HELP stortune_hosts Hosts the control plane manages\n# TYPE stortune_hosts gauge\n"
                     f"stortune_hosts {len(fresh)}\n")
        return "".join(parts).encode()


RUN_STATES = ("queued", "running", "done", "failed", "cancelled")
#: The families written besides FAMILIES (what the deploy/ rules and dashboard may use).
OTHER_FAMILIES = ("stortune_hosts", "stortune_benchmark_runs", "stortune_experiments",
                  "stortune_benchmark_regressed", "stortune_benchmark_objectives_worse")


def regression_lines(verdicts: Sequence[Verdict]) -> str:
    """Per host and benchmark with a baseline, its latest run judged against the baseline."""
    out = ["# HELP stortune_benchmark_regressed 1 when the host's latest run of the benchmark is worse "
           "than its baseline beyond the noise in an objective metric, else 0\n"
           "# TYPE stortune_benchmark_regressed gauge\n"]
    worse = ["# HELP stortune_benchmark_objectives_worse Objective metrics of the latest run worse than "
             "the baseline beyond the noise\n# TYPE stortune_benchmark_objectives_worse gauge\n"]
    for v in verdicts:
        where = (f'benchmark="{escape(v.benchmark)}",host="{escape(v.host)}",'
                 f'baseline="{escape(v.baseline)}"')
        out.append(f"stortune_benchmark_regressed{{{where}}} {int(v.regressed)}\n")
        worse.append(f"stortune_benchmark_objectives_worse{{{where}}} {v.worse}\n")
    return "".join(out + worse)


def _runs(counts: Mapping[tuple[str, str], int]) -> str:
    out = []
    for kind, family in (("benchmark", "stortune_benchmark_runs"), ("experiment", "stortune_experiments")):
        out.append(f"# HELP {family} {kind.capitalize()} runs by state\n# TYPE {family} gauge\n")
        states = sorted({*RUN_STATES, *(s for k, s in counts if k == kind)})
        out.extend(f'{family}{{state="{escape(s)}"}} {counts.get((kind, s), 0)}\n' for s in states)
    return "".join(out)
