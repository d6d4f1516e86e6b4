"""Comparisons, baselines and charts of stored benchmark runs; what a support token sees.

Results are stored as an agent would send them (tests/server/benchfakes.py), so
the numbers compared are the schemas' own summaries over repeats.
"""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator

import pytest
from fastapi import FastAPI

from stortune.server.models import benchmarks
from tests.server.benchfakes import finished_run, queued_run, spec_doc, steady, streamers
from tests.server.builders import API, loop_topology, registration
from tests.server.support import TestClient, admin_client, bearer, issue_token

B = f"{API}/benchmarks"
PNG = b"\x89PNG\r\n\x1a\n"
SVG_NS = "{http://www.w3.org/2000/svg}"


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with admin_client(app) as test_client:
        for name, role in (("h1", "streamer"), ("h2", "streamer"), ("db1", "database")):
            body = registration(name, labels={"role": role}, topology=loop_topology(name))
            assert test_client.post(f"{API}/agents/register", json=body).status_code == 200
        yield test_client


def svg_texts(data: bytes) -> list[str]:
    root = ET.fromstring(data)  # noqa: S314 - our own server's output
    assert root.tag == f"{SVG_NS}svg"
    return ["".join(t.itertext()) for t in root.iter(f"{SVG_NS}text")]


def test_compare_says_which_changes_exceed_the_noise(app: FastAPI, client: TestClient) -> None:
    iozone = streamers("io", repeats=3, workloads=[{"preset": "iozone-seq", "size": "4M"}])
    before = finished_run(app, "h1", iozone, values=steady(1.0))
    after = finished_run(app, "h1", iozone, values=steady(1.25),
                         settings={"loop0": {"read_ahead_kb": 4096, "scheduler": "none"}})
    same = finished_run(app, "h1", iozone, values=steady(1.02))
    body = client.get(f"{B}/compare", params={"a": before, "b": after}).json()
    assert body["kind"] == "BenchmarkComparison" and body["a"]["id"] == before and body["b"]["id"] == after
    row = next(r for r in body["rows"]
               if r["step"] == "iozone-seq/t1/read" and r["metric"] == "read_bandwidth")
    assert row["unit"] == "bytes/s" and row["a"]["n"] == 3 and not row["a"]["noisy"]
    assert round(row["deltaPct"]) == 25 and row["significant"] and row["verdict"] == "better"
    lat = next(r for r in body["rows"] if r["step"] == "iozone-seq/t1/read" and r["metric"] == "read_lat_p99")
    assert lat["verdict"] == "better" and lat["deltaPct"] < 0  # lower latency is better
    assert body["summary"]["worse"] == 0 and body["summary"]["better"] > 0
    assert body["contextChanges"] == ["loop0 read_ahead_kb: 128 -> 4096"]

    within = client.get(f"{B}/compare", params={"a": before, "b": same}).json()
    row = next(r for r in within["rows"] if r["metric"] == "read_bandwidth")
    assert not row["significant"] and row["verdict"] == "within noise" and row["noisePct"] >= 5.0
    assert within["contextChanges"] == []

    pending = queued_run(app, "h1", iozone)
    refused = client.get(f"{B}/compare", params={"a": before, "b": pending})
    assert refused.status_code == 409 and "has no result yet" in refused.json()["message"]
    assert client.get(f"{B}/compare", params={"a": before, "b": "nope"}).status_code == 404


def test_hostile_a_baselines_selector_text_is_bounded_like_every_selector(
        app: FastAPI, client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hostile: hostSelector in the query syntax was bounded only by the body size (8 MiB), where
    the labelSelector parameter and a token's selector stop at 4096 characters; and the syntax was
    parsed in quadratic time: a 200 KB body held the control plane (GIL and all) for minutes. A
    text over the bound is refused by its length before the parser reads it (the parser's calls
    are recorded), so its cost no longer grows with the body."""
    parsed: list[int] = []
    real = benchmarks.parse_text
    monkeypatch.setattr(benchmarks, "parse_text", lambda text: parsed.append(len(text)) or real(text))
    reference = finished_run(app, "h1", streamers("stream", repeats=3), values=steady(1.0))
    at_bound = "role=streamer".center(benchmarks.MAX_SELECTOR_TEXT)
    accepted = client.put(f"{B}/baselines/big", json={"run": reference, "hostSelector": at_bound})
    assert accepted.status_code == 201, accepted.text
    assert accepted.json()["spec"]["hostSelector"] == {"matchLabels": {"role": "streamer"}}
    assert parsed == [4096]
    parsed.clear()
    hostile = " " * 1_000_000 + "!" + " " * 1_000_000 + "a b"  # hours for the old parser
    for text in (at_bound + " ", hostile):
        response = client.put(f"{B}/baselines/big", json={"run": reference, "hostSelector": text})
        assert response.status_code == 422, response.text
        (cause,) = response.json()["details"]["causes"]
        assert cause["field"] == "hostSelector" and "at most 4096 characters" in cause["message"]
    assert parsed == []


def test_a_baseline_judges_later_runs_of_its_class(app: FastAPI, client: TestClient) -> None:
    doc = streamers("stream", repeats=3)
    reference = finished_run(app, "h1", doc, values=steady(1.0))
    slower = finished_run(app, "h2", doc, values=steady(0.7))
    other_benchmark = finished_run(app, "h2", streamers("other", repeats=3), values=steady(0.7))
    on_db = finished_run(app, "db1", spec_doc("stream", repeats=3), values=steady(0.7))

    assert client.get(f"{B}/runs/{slower}/judgement").json()["baseline"] is None
    created = client.put(f"{B}/baselines/r750-reference", json={"run": reference,
                                                                "description": "the vendor's box"})
    assert created.status_code == 201, created.text
    baseline = created.json()
    assert baseline["spec"] == {"run": reference, "hostSelector": {"matchLabels": {"role": "streamer"}},
                                "benchmark": "stream", "description": "the vendor's box"}

    judged = client.get(f"{B}/runs/{slower}/judgement").json()
    assert judged["baseline"] == "r750-reference" and judged["baselineRun"]["id"] == reference
    assert judged["summary"]["worse"] > 0 and judged["summary"]["better"] == 0
    assert judged["message"] == f"{judged['summary']['worse']} metric(s) worse than baseline r750-reference"
    worst = next(r for r in judged["rows"] if r["metric"] == "read_bandwidth")
    assert round(worst["deltaPct"]) == -30 and worst["verdict"] == "worse"
    assert "hostname: h1 -> h2" in judged["contextChanges"]
    # Another benchmark, or a host outside the class: no baseline applies.
    assert client.get(f"{B}/runs/{other_benchmark}/judgement").json()["baseline"] is None
    assert client.get(f"{B}/runs/{on_db}/judgement").json()["baseline"] is None

    # A selector in the query syntax; replacing the baseline is 200.
    replaced = client.put(f"{B}/baselines/r750-reference", json={"run": reference, "hostSelector": "role"})
    assert replaced.status_code == 200
    assert replaced.json()["spec"]["hostSelector"] == {"matchExpressions": [{"key": "role",
                                                                             "operator": "Exists"}]}
    assert client.get(f"{B}/runs/{on_db}/judgement").json()["baseline"] == "r750-reference"
    assert [b["metadata"]["name"] for b in client.get(f"{B}/baselines").json()["items"]] == ["r750-reference"]
    assert client.delete(f"{B}/baselines/r750-reference").status_code == 200
    assert client.get(f"{B}/baselines/r750-reference").status_code == 404


def test_a_baseline_needs_a_finished_run_and_a_class(app: FastAPI, client: TestClient) -> None:
    pending = queued_run(app, "h1", streamers())
    one_host = finished_run(app, "h1", spec_doc())

    def cause(body: dict[str, object]) -> tuple[int, str]:
        r = client.put(f"{B}/baselines/ref", json=body)
        return r.status_code, r.json()["details"]["causes"][0]["field"] if r.status_code == 422 else ""

    assert cause({"run": pending}) == (422, "run")
    assert cause({"run": "missing"}) == (422, "run")
    assert cause({"run": one_host}) == (422, "hostSelector")  # asked for one host: no class known
    assert cause({"run": one_host, "hostSelector": "role in (a,"}) == (422, "hostSelector")
    assert cause({"run": one_host, "hostSelector": {"matchLabels": {"role": "streamer"}}}) == (201, "")


def test_charts_are_png_and_svg_with_the_expected_series(app: FastAPI, client: TestClient) -> None:
    iozone = streamers("io", repeats=2, workloads=[{"preset": "iozone-seq", "size": "4M"}])
    before = finished_run(app, "h1", iozone, values=steady(1.0))
    after = finished_run(app, "h1", iozone, values=steady(1.3),
                         settings={"loop0": {"read_ahead_kb": 4096, "scheduler": "none"}})

    png = client.get(f"{B}/runs/{before}/plot", params={"kind": "threads", "format": "png"})
    assert png.status_code == 200 and png.headers["content-type"] == "image/png"
    assert png.content.startswith(PNG) and len(png.content) > 5000

    threads = client.get(f"{B}/runs/{before}/plot", params={"kind": "threads", "format": "svg"})
    assert threads.headers["content-type"] == "image/svg+xml"
    texts = svg_texts(threads.content)
    assert {"write", "rewrite", "read", "reread", "threads", "bandwidth (MB/s)", "iozone-seq"} <= set(texts)
    assert {"1", "2", "10"} <= set(texts)  # the thread counts on the x axis
    assert any(t.startswith("io on h1: bandwidth by threads") for t in texts)

    chart = client.get(f"{B}/runs/{before}/plot", params={"kind": "latency", "format": "svg"})
    latency = set(svg_texts(chart.content))
    assert {"p50", "p95", "p99", "p99.9"} <= latency
    assert {"iozone-seq/t1/read (read)", "iozone-seq/t10/write (write)"} <= latency

    compared = client.get(f"{B}/compare/plot", params={"a": before, "b": after, "format": "svg"})
    texts = svg_texts(compared.content)
    assert {f"before: {before} on h1, kernel 6.1.0-test", f"after: {after} on h1, kernel 6.1.0-test",
            "iozone-seq/t2/reread"} <= set(texts)
    assert sum(t.endswith("better") for t in texts) == 12  # every step, bandwidth up 30%
    # what changed between the runs, not only their ids; and the noise each change is judged against
    assert {"What changed from before to after:", "  loop0 read_ahead_kb: 128 -> 4096"} <= set(texts)
    assert sum("(noise -" in t for t in texts) == 12
    same = client.get(f"{B}/compare/plot", params={"a": before, "b": before, "format": "svg"})
    assert "Nothing changed between the runs: same spec, settings, versions and topology." in svg_texts(
        same.content)
    assert client.get(f"{B}/compare/plot", params={"a": before, "b": after}).content.startswith(PNG)

    pending = queued_run(app, "h1", iozone)
    assert client.get(f"{B}/runs/{pending}/plot").status_code == 409
    assert client.get(f"{B}/runs/{before}/plot", params={"format": "gif"}).status_code == 422


def test_a_support_token_sees_runs_of_its_hosts_only(app: FastAPI, client: TestClient) -> None:
    mine = finished_run(app, "h1", streamers())
    theirs = finished_run(app, "db1", spec_doc())
    assert client.put(f"{B}/baselines/db-ref", json={"run": theirs, "hostSelector": "role=database"}
                      ).status_code == 201
    assert client.put(f"{B}/baselines/streamer-ref", json={"run": mine}).status_code == 201
    support = TestClient(app, headers=bearer(issue_token(app, "support", hosts="role=streamer",
                                                         expires_in="72h")))
    with support:
        listed = [i["metadata"]["name"] for i in support.get(f"{B}/runs").json()["items"]]
        assert listed == [mine]
        assert support.get(f"{B}/runs", params={"host": "db1"}).json()["items"] == []
        assert support.get(f"{B}/runs/{mine}").status_code == 200
        for path in (f"runs/{theirs}", f"runs/{theirs}/raw", f"runs/{theirs}/plot",
                     f"runs/{theirs}/judgement", "baselines/db-ref"):
            assert support.get(f"{B}/{path}").status_code == 404, path
        assert support.get(f"{B}/compare", params={"a": mine, "b": theirs}).status_code == 404
        names = [b["metadata"]["name"] for b in support.get(f"{B}/baselines").json()["items"]]
        assert names == ["streamer-ref"]
        schedules = support.get(f"{B}/schedules")
        assert schedules.status_code == 403 and "role support" in schedules.json()["message"]
        assert support.post(f"{B}/runs", json=streamers()).status_code == 403


def test_the_server_does_not_load_matplotlib_until_a_chart_is_asked_for(tmp_path: object) -> None:
    script = (
        "import sys\n"
        "from stortune.server import Settings, create_app\n"
        "from fastapi.testclient import TestClient\n"
        f"app = create_app(Settings(db_url='sqlite:///{tmp_path}/m.db'))\n"
        "with TestClient(app) as c:\n"
        "    assert c.get('/healthz').status_code == 200\n"
        "print('matplotlib' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    assert out.strip().splitlines()[-1] == "False"


def test_objective_metrics_lead_and_alone_count_as_regressions(app: FastAPI, client: TestClient) -> None:
    """A row is objective when the spec's thresholds name it for the step, or it is the step's own
    figure; cpu_sys tripling is beyond the noise but no regression of the workload."""
    doc = streamers("mixed", repeats=3, workloads=[{"preset": "seq-1m", "runtime": "1s"},
                                                   {"preset": "iometer-4k", "runtime": "1s"}],
                    thresholds=[{"metric": "read_lat_p999", "step": "iometer-4k/randread", "max": "50ms"}])
    before = finished_run(app, "h1", doc, values=steady())
    base = steady()

    def busier(step: object, repeat: int) -> dict[str, float]:
        values = base(step, repeat)  # type: ignore[arg-type]
        values["cpu_sys"] *= 3
        return values

    after = finished_run(app, "h1", doc, values=busier)
    body = client.get(f"{B}/compare", params={"a": before, "b": after}).json()
    objective = {(r["step"], r["metric"]) for r in body["rows"] if r["objective"]}
    assert {("seq-1m/read", "read_bandwidth"), ("seq-1m/write", "write_bandwidth"),
            ("iometer-4k/randread", "read_iops"), ("iometer-4k/randread", "read_lat_p99"),
            ("iometer-4k/randread", "read_lat_p999"),  # named by the threshold
            ("iometer-4k/oltp", "read_iops"), ("iometer-4k/oltp", "write_iops")} <= objective
    assert not any(metric.startswith("cpu_") for _, metric in objective)
    assert ("iometer-4k/randwrite", "read_lat_p999") not in objective  # the glob names one step
    assert body["summary"]["worse"] == 5 and body["summary"]["objectiveWorse"] == 0
    slower = finished_run(app, "h1", doc, values=steady(0.7))
    judged = client.get(f"{B}/compare", params={"a": before, "b": slower}).json()
    assert judged["summary"]["objectiveWorse"] == len(objective)


def test_what_changed_includes_the_spec(app: FastAPI, client: TestClient) -> None:
    three = streamers("stream", repeats=3)
    five = streamers("stream", repeats=5)
    before, after = finished_run(app, "h1", three), finished_run(app, "h1", five)
    changes = client.get(f"{B}/compare", params={"a": before, "b": after}).json()["contextChanges"]
    assert changes == ["spec.repeats: 3 -> 5"]
    other = finished_run(app, "h1", streamers("other", repeats=3))
    assert client.get(f"{B}/compare", params={"a": before, "b": other}).json()["contextChanges"] == [
        "benchmark: stream -> other"]
