"""The dashboard against a real control plane and a real agent on a real loop device.

stortune-server (drift checks every second) and stortune-agent serve on this machine's /sys, a
loop device this test makes, real fio. In Debian's chromium (tests/ui/browser.py): a hand-made
read_ahead_kb change shows the host as drifted without a reload (the profile in audit mode, so
the drift stays to be seen), then corrected once the profile enforces; a benchmark's result page
draws its charts with the expected series, and comparing it with an earlier run names the
read-ahead that changed between them.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_control_plane_e2e import (
    Fleet,
    agent_proc,
    eventually,
    fleet,  # noqa: F401 - the fixture, used by name
    loop_profile,
)
from tests.ui.browser import Watched, artifacts, chromium, watch  # noqa: F401 - fixtures

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed (Debian package fio)"),
]
HOST = "uihost"


def bench_spec(tmp: Path, device: str) -> Path:
    path = tmp / "ui-seq.yaml"
    path.write_text(f"""apiVersion: stortune/v1
kind: BenchmarkSpec
metadata: {{name: ui-seq}}
spec:
  hostSelector: {{matchLabels: {{e2e: loop}}}}
  target: {{device: {{kind: [loop], name: [{device}]}}}}
  allowDestructive: true
  repeats: 2
  workloads: [{{preset: seq-1m, runtime: 1s, size: 16M}}]
""")
    return path


def run_bench(plane: Fleet, spec: Path) -> str:
    done = plane.cli("bench", "run", "-f", str(spec))
    assert done.returncode == 0, done.stdout + done.stderr
    line = next(line for line in done.stdout.splitlines() if " queued on " in line)
    return line.split()[0].removeprefix("benchmarkrun/")


def apply(plane: Fleet, tmp: Path, device: str, mode: str) -> None:
    (tmp / "loop.yaml").write_text(loop_profile(device, mode))
    done = plane.cli("apply", "-f", str(tmp / "loop.yaml"))
    assert done.returncode == 0, done.stdout + done.stderr
    eventually(f"the profile applied in {mode} mode", lambda: plane.converged(HOST, "e2e-loop"))


@pytest.fixture
def ui(chromium: Any, fleet: Fleet, artifacts: Path) -> Iterator[Watched]:  # noqa: F811
    context = chromium.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(60_000)
    watched = watch(context, artifacts, fleet.url)
    yield watched
    context.close()


def drawn(page: Any, chart: str) -> dict[str, Any]:
    """The series a chart's legend names and how many of its canvas pixels are painted."""
    page.wait_for_selector(f'[data-chart="{chart}"] canvas')
    return dict(page.evaluate("""chart => {
        const box = document.querySelector(`[data-chart="${chart}"]`);
        const canvas = box.querySelector('canvas');
        const pixels = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
        let painted = 0;
        for (let i = 3; i < pixels.length; i += 4) if (pixels[i]) painted += 1;
        const labels = [...box.querySelectorAll('.u-legend .u-series .u-label')].map(l => l.textContent);
        return {labels, painted};
    }""", chart))


def test_drift_shows_live_then_corrected_and_benchmark_charts_draw(
        fleet: Fleet, ui: Watched, loop_devices: Callable[[int], list[str]], tmp_path: Path) -> None:  # noqa: F811
    (dev,) = loop_devices(1)
    read_ahead = Path("/sys/block") / dev / "queue/read_ahead_kb"
    fleet.agents[HOST] = agent_proc(fleet, HOST, [], "e2e=loop")
    fleet.agents[HOST].start()
    eventually("the agent registered", lambda: fleet.condition(HOST, "Reachable"))
    apply(fleet, tmp_path, dev, "enforce")
    assert read_ahead.read_text().strip() == "4096"
    spec = bench_spec(tmp_path, dev)
    before = run_bench(fleet, spec)
    apply(fleet, tmp_path, dev, "audit")

    ui.sign_in(fleet.admin_token)
    ui.go("#/fleet?selector=e2e%3Dloop")
    row = f'tr[data-host="{HOST}"]'
    ui.page.wait_for_selector(f'{row} [data-condition="Drifted"][data-status="False"]')
    ui.page.evaluate("() => { window.__sameDocument = true }")  # gone if the page reloads
    read_ahead.write_text("128")  # by hand, behind stortune's back
    ui.page.wait_for_selector(f'{row} [data-condition="Drifted"][data-status="True"]')
    assert ui.page.evaluate("() => window.__sameDocument") is True
    ui.shot("e2e-fleet-drifted")
    ui.go(f"#/hosts/{HOST}")
    ui.page.wait_for_selector(f'[data-setting="{dev}/read_ahead_kb"] [data-observed] >> text=128')
    assert ui.page.text_content("[data-testid=drifted-for]") != "not drifted"
    ui.shot("e2e-host-drifted")

    after = run_bench(fleet, spec)  # measured at the drifted read-ahead
    apply(fleet, tmp_path, dev, "enforce")
    eventually("the drift corrected", lambda: read_ahead.read_text().strip() == "4096")
    ui.page.wait_for_selector(f'[data-setting="{dev}/read_ahead_kb"] [data-observed] >> text=4096')
    ui.page.wait_for_selector('[data-testid=drifted-for] >> text=not drifted')
    assert ui.page.evaluate("() => window.__sameDocument") is True
    ui.shot("e2e-host-corrected")

    ui.go(f"#/benchmarks/{after}")
    throughput = drawn(ui.page, "throughput")
    assert {"seq-1m read", "seq-1m write"} <= set(throughput["labels"]) and throughput["painted"] > 500
    latency = drawn(ui.page, "latency")
    assert {"p50", "p99"} <= set(latency["labels"]) and latency["painted"] > 500
    utilisation = drawn(ui.page, "utilisation")
    assert {"utilisation %", "slowest member"} <= set(utilisation["labels"]) and utilisation["painted"] > 500
    ui.shot("e2e-benchmark-result")

    ui.go(f"#/compare/{before}/{after}")
    changes = ui.page.wait_for_selector("[data-testid=context-changes]")
    assert "read_ahead_kb" in str(changes.text_content()) and "4096" in str(changes.text_content())
    ui.page.wait_for_selector('[data-chart="compare"] canvas')
    ui.shot("e2e-benchmark-compare")
    ui.go("#/benchmarks")
    ui.page.wait_for_selector(f'tr[data-run="{after}"]')
    ui.shot("e2e-benchmarks")
    ui.clean()
