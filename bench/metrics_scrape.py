"""The cost of a /metrics scrape of a large fleet, from the in-memory state.

    python bench/metrics_scrape.py [--hosts 10000] [--devices 4] [--tunables 6]

Fills a FleetState with hosts x devices x tunables settings (one tunable in six a
string, as the scheduler is), four conditions and a few labels per host, then
times the fleet's part of a scrape (what /metrics adds to the counters):

* the first scrape, which formats every host;
* a scrape after one host changed (its resourceVersion moved), the usual case;
* a scrape of an unchanged fleet.

The database refresh is not in these figures: it reads only the rows written
since the last scrape (services/fleet_state.py). Target: under 1 s for 10,000 hosts.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import statistics
import time

from stortune.server.metrics.exposition import FleetExposition
from stortune.server.metrics.recorder import Recorder
from stortune.server.services.fleet_state import FleetState, record_of

TUNABLES = ("read_ahead_kb", "nr_requests", "max_sectors_kb", "rq_affinity", "nomerges", "scheduler",
            "wbt_lat_usec", "iostats")


def fill(fleet: FleetState, hosts: int, devices: int, tunables: int) -> None:
    records = []
    for h in range(hosts):
        name = f"host-{h:05d}"
        settings = []
        for d in range(devices):
            for tunable in TUNABLES[:tunables]:
                value: int | str = "mq-deadline" if tunable == "scheduler" else 4096 + d
                settings.append({"device": f"nvme{d}n1", "tunable": tunable, "desired": value,
                                 "observed": value})
        conditions = [{"type": t, "status": "True"} for t in ("Ready", "Reachable", "Applied")]
        conditions.append({"type": "Drifted", "status": "False"})
        records.append(record_of(
            name, version=1, address=f"{name}.example:7443",
            facts={"kernel": "6.1.0-18-amd64", "agent_version": "0.1.0"},
            status={"conditions": conditions, "devices": settings},
            labels={"role": "streamer", "rack": f"r{h % 40}"}))
    fleet.put(records)


def timed(render: FleetExposition, recorder: Recorder) -> tuple[float, int]:
    started = time.perf_counter()
    body = recorder.render() + render.render()
    return time.perf_counter() - started, len(body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=10_000)
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--tunables", type=int, default=6, choices=range(1, len(TUNABLES) + 1))
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    fleet = FleetState()
    fill(fleet, args.hosts, args.devices, args.tunables)
    exposition, recorder = FleetExposition(fleet), Recorder()
    settings = args.hosts * args.devices * args.tunables
    first, size = timed(exposition, recorder)
    print(f"{args.hosts} hosts x {args.devices} devices x {args.tunables} tunables = {settings} settings; "
          f"scrape {size / 1e6:.1f} MB")
    print(f"first scrape (every host formatted): {first * 1000:.0f} ms")

    changed, unchanged = [], []
    for i in range(args.repeat):
        name = f"host-{i:05d}"
        fleet.put([dataclasses.replace(fleet.hosts[name], version=fleet.hosts[name].version + 1)])
        changed.append(timed(exposition, recorder)[0])
        unchanged.append(timed(exposition, recorder)[0])
    print(f"scrape after one host changed: median {statistics.median(changed) * 1000:.0f} ms")
    print(f"scrape of an unchanged fleet: median {statistics.median(unchanged) * 1000:.0f} ms")
    body = recorder.render() + exposition.render()
    started = time.perf_counter()
    packed = gzip.compress(body, compresslevel=1, mtime=0)  # as /metrics answers Prometheus
    print(f"gzip (what Prometheus asks for): +{(time.perf_counter() - started) * 1000:.0f} ms, "
          f"{len(packed) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
