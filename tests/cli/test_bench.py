"""stortune bench against the real control plane (uvicorn on 127.0.0.1) whose agent is the fake
seam: run and follow, list, show, compare with exit codes for CI, cancel, plot, baselines, schedules."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from stortune.cli import bench
from stortune.cli.client import BenchmarkRun, Client
from stortune.cli.render import Output
from stortune.schemas.topology import Device, DeviceKind, Mount
from stortune.server import RecordingController, Settings, create_app
from stortune.server.agentclient import AgentRejected, FakeAgentClients
from tests.cli.conftest import ControlPlane, Run, raid_volume, serve
from tests.server.benchfakes import BenchAgent, steady

ADDRESS = "127.0.0.1:9"  # what ControlPlane.register advertises


@pytest.fixture
def agent() -> BenchAgent:
    return BenchAgent(address=ADDRESS)


@pytest.fixture
def control_plane(tmp_path: Path, agent: BenchAgent) -> Iterator[ControlPlane]:
    """The control plane of tests/cli/conftest.py, with the benchmark dispatcher talking to ``agent``."""
    agents = FakeAgentClients()
    agents.add(agent)
    app = create_app(Settings(db_url=f"sqlite:///{tmp_path / 'control-plane.db'}", benchmark_interval_s=0.05),
                     controller=RecordingController(), agents=agents)
    yield from serve(app)


@pytest.fixture
def fleet(control_plane: ControlPlane) -> ControlPlane:
    control_plane.register("web-1", {"role": "streamer"})
    return control_plane


def spec_file(tmp_path: Path, name: str = "seq", *, thresholds: str = "", repeats: int = 3,
              workloads: str = "[{preset: seq-1m, runtime: 1s}]") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"""apiVersion: stortune/v1
kind: BenchmarkSpec
metadata: {{name: {name}}}
spec:
  hostSelector: {{matchLabels: {{role: streamer}}}}
  target: {{device: {{kind: [disk], name: [sda]}}}}
  allowDestructive: true
  repeats: {repeats}
  workloads: {workloads}
{thresholds}""")
    return path


def run_id(out: str) -> str:
    """The id in 'benchmarkrun/ID queued on HOST'."""
    line = next(line for line in out.splitlines() if " queued on " in line)
    return line.split()[0].removeprefix("benchmarkrun/")


def test_run_follows_to_the_end_then_list_and_show(stortune: Run, fleet: ControlPlane,
                                                   tmp_path: Path) -> None:
    done = stortune("bench", "run", "-f", str(spec_file(tmp_path)))
    assert done.code == 0, done.err
    rid = run_id(done.out)
    assert f"benchmarkrun/{rid} on web-1: done" in done.out.splitlines()  # said once, not "done: done"
    assert f"{rid} web-1: done  100%" in done.out  # the plain progress line, piped

    listed = stortune("bench", "list")
    header, row = listed.out.splitlines()
    assert header.split() == ["ID", "NAME", "HOST", "STATE", "PROGRESS", "AGE", "MESSAGE"]
    assert row.split()[:4] == [rid, "seq", "web-1", "done"]

    shown = stortune("bench", "show", rid)
    assert shown.code == 0, shown.err
    text = shown.out
    assert "Versions:       kernel 6.1.0-test, fio-3.33, agent 0.1.0" in text
    assert "Profiles:       streaming (generation 1)" in text
    read = next(line for line in text.splitlines() if line.strip().startswith("seq-1m/read"))
    assert read.split()[1:4] == ["read", "400.0", "MB/s"] and "±" in read and read.split()[-1] == "3"
    assert "Settings in effect when the run started:" in text
    assert any(line.split() == ["loop0", "read_ahead_kb", "128"] for line in text.splitlines())
    as_json = json.loads(stortune("bench", "show", rid, "-o", "json").out)
    assert as_json["kind"] == "BenchmarkRun" and as_json["status"]["result"]["state"] == "done"


def test_exit_codes_of_run(stortune: Run, fleet: ControlPlane, agent: BenchAgent, tmp_path: Path) -> None:
    strict = spec_file(tmp_path, "strict", thresholds="  thresholds:\n"
                                                      "    - {metric: read_bandwidth, min: 10GB/s}\n")
    failed_check = stortune("bench", "run", "-f", str(strict))
    assert failed_check.code == 2
    assert "done (thresholds failed)" not in failed_check.out  # the final line says done, in red on a tty
    rid = run_id(failed_check.out)
    shown = stortune("bench", "show", rid).out
    assert "FAIL  seq-1m/read: read_bandwidth 400.0 MB/s is below 10.0 GB/s" in shown

    agent.fail("start_benchmark", AgentRejected(ADDRESS, "fio is not installed ('fio' not found on PATH): "
                                                         "install Debian's package fio"))
    refused = stortune("bench", "run", "-f", str(spec_file(tmp_path)))
    assert refused.code == 1
    assert "on web-1: failed (refused by the agent: fio is not installed" in refused.out
    agent.fail("start_benchmark", None)

    queued = stortune("bench", "run", "--no-wait", "-f", str(spec_file(tmp_path)))
    assert queued.code == 0 and " queued on web-1" in queued.out


def test_an_invalid_spec_names_the_field_and_sends_nothing(stortune: Run, fleet: ControlPlane,
                                                           tmp_path: Path) -> None:
    typo = spec_file(tmp_path, workloads="[{preset: seq-1m, runtime: 1q}]")
    bad = stortune("bench", "run", "-f", str(typo))
    assert bad.code == 1
    assert "spec.workloads[0].runtime: '1q' is not a duration" in bad.err
    assert stortune("bench", "list").err.strip() == "No benchmark runs found."
    missing = stortune("bench", "run", "-f", str(tmp_path / "nope.yaml"))
    assert missing.code == 1 and "nope.yaml" in missing.err


def test_hostile_a_dry_run_write_on_the_mounted_root_disk_is_refused_and_exit_1(
        stortune: Run, control_plane: ControlPlane, tmp_path: Path) -> None:
    vda = Device(name="vda", kind=DeviceKind.DISK, id="name:vda", devno="254:0",
                 mounts=[Mount(mountpoint="/", fstype="ext4", source="/dev/vda", options=["rw"])])
    control_plane.register("web-1", {"role": "streamer"}, devices=[vda])
    spec = spec_file(tmp_path)
    spec.write_text(spec.read_text().replace("kind: [disk], name: [sda]", "name: [vda]"))
    shown = stortune("bench", "run", "--dry-run", "-f", str(spec))
    assert shown.code == 1, shown.out + shown.err
    assert "web-1: refused: vda holds /: a protected device, no benchmark runs on it" in shown.err
    assert "web-1: refused: vda is mounted at / (ext4)" in shown.err
    as_json = stortune("bench", "run", "--dry-run", "-f", str(spec), "-o", "json")
    assert as_json.code == 1 and len(json.loads(as_json.out)["hosts"][0]["refusals"]) == 2
    assert stortune("bench", "list").err.strip() == "No benchmark runs found."


def test_dry_run_shows_the_steps(stortune: Run, fleet: ControlPlane, tmp_path: Path) -> None:
    shown = stortune("bench", "run", "--dry-run", "-f", str(spec_file(tmp_path)))
    assert shown.code == 0, shown.err
    assert "host/web-1: target sda" in shown.out
    assert any(line.split()[:4] == ["seq-1m/read", "read", "1048576", "4"] for line in shown.out.splitlines())
    assert stortune("bench", "list").err.strip() == "No benchmark runs found."


def test_compare_exit_code_is_a_ci_gate(stortune: Run, fleet: ControlPlane, agent: BenchAgent,
                                        tmp_path: Path) -> None:
    spec = str(spec_file(tmp_path))
    before = run_id(stortune("bench", "run", "-f", spec).out)
    agent.values = steady(1.3)
    agent.settings = {"loop0": {"read_ahead_kb": 4096, "scheduler": "none"}}
    after = run_id(stortune("bench", "run", "-f", spec).out)

    better = stortune("bench", "compare", before, after)
    assert better.code == 0, better.out + better.err
    row = next(line for line in better.out.splitlines() if "read_bandwidth" in line)
    assert "+30.0%" in row and "-5.0%..+5.0%" in row and row.split()[-1] == "better"
    assert "  loop0 read_ahead_kb: 128 -> 4096" in better.out
    worse = stortune("bench", "compare", after, before)
    assert worse.code == 2
    assert "-23.1%" in next(line for line in worse.out.splitlines() if "read_bandwidth" in line)
    as_json = json.loads(stortune("bench", "compare", after, before, "-o", "json").out)
    assert as_json["summary"]["worse"] > 0
    assert stortune("bench", "compare", before, "no-such-run").code == 1


def test_plot_writes_png_and_svg(stortune: Run, fleet: ControlPlane, tmp_path: Path) -> None:
    spec = str(spec_file(tmp_path))
    a, b = run_id(stortune("bench", "run", "-f", spec).out), run_id(stortune("bench", "run", "-f", spec).out)
    svg, png = tmp_path / "t.svg", tmp_path / "c.png"
    assert stortune("bench", "plot", a, "-o", str(svg)).code == 0
    assert svg.read_text().lstrip().startswith("<?xml") and "seq-1m" in svg.read_text()
    assert stortune("bench", "plot", "--compare", a, b, "-o", str(png)).code == 0
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    wrong = stortune("bench", "plot", a, "-o", str(tmp_path / "t.gif"))
    assert wrong.code == 1 and "must end in .png or .svg" in wrong.err
    both = stortune("bench", "plot", a, "--compare", a, b, "-o", str(svg))
    assert both.code == 1 and "give a run ID, or --compare A B" in both.err


def test_baselines_judge_later_runs_and_schedules_are_managed(
        stortune: Run, fleet: ControlPlane, agent: BenchAgent, tmp_path: Path) -> None:
    spec = str(spec_file(tmp_path))
    reference = run_id(stortune("bench", "run", "-f", spec).out)
    set_ = stortune("bench", "baseline", "set", "r750-ref", "--run", reference)
    assert set_.code == 0, set_.err
    assert f"run {reference} is the reference of seq on hosts role=streamer" in set_.out
    assert "r750-ref" in stortune("bench", "baseline", "show").out
    agent.values = steady(0.6)
    later = run_id(stortune("bench", "run", "-f", spec).out)
    shown = stortune("bench", "show", later).out
    assert f"Against baseline r750-ref (run {reference} on web-1): 0 better," in shown
    assert stortune("bench", "baseline", "delete", "r750-ref").code == 0
    assert stortune("bench", "baseline", "set", "x").code == 1

    created = stortune("bench", "schedule", "create", "nightly", "--cron", "0 3 * * *", "-f", spec)
    assert created.code == 0, created.err
    assert "benchmarkschedule/nightly created; next run " in created.out
    listed = stortune("bench", "schedule", "list").out
    assert any(line.split()[:6] == ["nightly", "0", "3", "*", "*", "*"] for line in listed.splitlines())
    bad = stortune("bench", "schedule", "create", "hourly", "--cron", "61 * * * *", "-f", spec)
    assert bad.code == 1 and "spec.schedule" in bad.err
    assert stortune("bench", "schedule", "delete", "nightly").code == 0


def test_cancel_stops_a_running_run(stortune: Run, fleet: ControlPlane, agent: BenchAgent,
                                    tmp_path: Path) -> None:
    agent.auto = False
    rid = run_id(stortune("bench", "run", "--no-wait", "-f", str(spec_file(tmp_path))).out)
    with httpx.Client(base_url=fleet.url, headers={"Authorization": f"Bearer {fleet.admin_token}"}) as http:
        for _ in range(500):
            if http.get(f"/api/v1/benchmarks/runs/{rid}").json()["status"]["state"] == "running":
                break
            http.get("/healthz")
    cancelled = stortune("bench", "cancel", rid)
    assert cancelled.code == 0, cancelled.err
    assert f"benchmarkrun/{rid}: cancel sent to the agent on web-1" in cancelled.out
    assert cancelled.out.rstrip().endswith("cancelled")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_live_progress_bar_on_a_terminal(fleet: ControlPlane, agent: BenchAgent, tmp_path: Path) -> None:
    agent.auto = False
    document = yaml.safe_load(spec_file(tmp_path).read_text())
    screen = _Terminal()
    out = Output(screen, io.StringIO())
    with Client(fleet.url, token=fleet.admin_token) as client:
        (run,) = client.start_benchmarks(document).items
        steps: list[Any] = []

        def advance(_seconds: float) -> None:
            """Between two polls: the run moves on, and the server has stored it before the next."""
            if not steps and run.id in agent.started:
                agent.running(run.id, percent=42.0)
                steps.append("running")
                wanted = lambda r: r.progress.get("percent") == 42.0  # noqa: E731
            elif steps == ["running"]:
                agent.finish(run.id)
                steps.append("done")
                wanted = lambda r: r.state == "done"  # noqa: E731
            else:
                wanted = lambda r: r.id in agent.started  # noqa: E731
            for _ in range(2000):
                if wanted(client.get_benchmark_run(run.id)):
                    return

        final = bench._follow(client, out, [run.id], 0.01, sleep=advance)
    assert [r.state for r in final] == ["done"]
    shown = screen.getvalue()
    assert "web-1" in shown and "42%" in shown and "400.0 MB/s" in shown and "step 1/2 seq-1m/read" in shown
    assert "100%" in shown


def test_device_rows_mark_the_slowest_member() -> None:
    def stats(device: str, await_ms: float, slowest: bool = False) -> dict[str, Any]:
        return {"device": device, "relation": "md-member", "read_iops": 100.0, "write_iops": 0.0,
                "read_bytes_per_s": 4e6, "write_bytes_per_s": 0.0, "await_ms": await_ms,
                "queue_depth": 1.0, "util_percent": 50.0, "slowest": slowest}

    result = {"runs": [{"step": "seq-1m/read", "devices": [stats("sda", 1.0), stats("sdb", 9.0, True)]},
                       {"step": "seq-1m/read", "devices": [stats("sda", 3.0), stats("sdb", 7.0)]}]}
    headers, rows, styles = bench.device_rows(result)
    assert headers[:3] == ["STEP", "DEVICE", "RELATION"]
    assert [list(r)[:3] for r in rows] == [["seq-1m/read", "sda", "md-member"],
                                          ["seq-1m/read", "sdb SLOWEST", "md-member"]]
    assert [list(r)[7] for r in rows] == ["2.0", "8.0"]  # await, mean of the repeats
    assert styles == ["", "red"]


def test_iozone_rows_flag_noisy_phases() -> None:
    table = {"workload": "iozone-seq", "phases": ["write", "rewrite", "read", "reread"],
             "rows": [{"threads": 1, "bandwidth": {"write": 2e8, "read": 4e8}, "noisy": ["read"]}]}
    headers, rows = bench.iozone_rows(table)
    assert headers == ["THREADS", "WRITE MB/s", "REWRITE MB/s", "READ MB/s", "REREAD MB/s"]
    cells = [c if isinstance(c, str) else c.text for c in rows[0]]
    assert cells == ["1", "200.0", "-", "400.0 ~noisy", "-"]


# -- a newcomer's view: -o json, the summary, compare leading with what the steps are for ----------
MIXED = "[{preset: seq-1m, runtime: 1s}, {preset: iometer-4k, runtime: 1s}]"


def test_run_o_json_prints_the_results_alone_on_stdout(stortune: Run, fleet: ControlPlane,
                                                       tmp_path: Path) -> None:
    strict = spec_file(tmp_path, "strict", thresholds="  thresholds:\n"
                                                      "    - {metric: read_bandwidth, min: 10GB/s}\n")
    done = stortune("bench", "run", "-f", str(strict), "-o", "json")
    assert done.code == 2  # the exit code is the same whatever the output: a threshold failed
    document = json.loads(done.out)  # stdout is the document and nothing else
    assert document["kind"] == "BenchmarkRunList"
    (run,) = document["items"]
    assert run["status"]["state"] == "done" and run["status"]["passed"] is False
    result = run["status"]["result"]
    assert {s["step"] for s in result["summaries"]} == {"seq-1m/read", "seq-1m/write"}
    assert result["verdict"]["outcomes"][0]["passed"] is False
    assert f"benchmarkrun/{run['metadata']['name']} queued on web-1" in done.err  # what went by
    assert f"{run['metadata']['name']} web-1: done  100%" in done.err

    as_yaml = stortune("bench", "run", "-f", str(spec_file(tmp_path)), "-o", "yaml")
    assert as_yaml.code == 0 and yaml.safe_load(as_yaml.out)["items"][0]["status"]["state"] == "done"
    queued = stortune("bench", "run", "--no-wait", "-f", str(spec_file(tmp_path)), "-o", "json")
    assert queued.code == 0 and json.loads(queued.out)["items"][0]["status"]["state"] in ("queued", "running",
                                                                                         "done")
    planned = stortune("bench", "run", "--dry-run", "-f", str(spec_file(tmp_path)), "-o", "json")
    assert planned.code == 0 and json.loads(planned.out)["hosts"][0]["host"] == "web-1"


def test_run_ends_with_a_summary_of_what_each_step_is_for(stortune: Run, fleet: ControlPlane,
                                                          tmp_path: Path) -> None:
    spec = spec_file(tmp_path, "mixed", workloads=MIXED, thresholds=(
        "  thresholds:\n    - {metric: read_bandwidth, step: seq-1m/read, min: 10GB/s}\n"
        "    - {metric: read_lat_p99, step: 'iometer-4k/*', max: 20ms}\n"))
    done = stortune("bench", "run", "-f", str(spec))
    assert done.code == 2
    rid = run_id(done.out)
    lines = done.out.splitlines()
    assert "done: done" not in done.out
    start = lines.index(f"benchmarkrun/{rid} on web-1: done")
    summary = lines[start:]
    rows = {tuple(line.split()[:2]) for line in summary}
    assert {("seq-1m/read", "read_bandwidth"), ("seq-1m/write", "write_bandwidth"),
            ("iometer-4k/randread", "read_iops"), ("read_lat_p99", "2.00")} <= rows
    assert not any("cpu_usr" in line or "read_lat_p999" in line for line in summary)
    assert "  thresholds: 2 of 3 met" in summary
    assert any(line.strip() == "FAIL  seq-1m/read: read_bandwidth 400.0 MB/s is below 10.0 GB/s"
               for line in summary)
    assert any(line.strip().startswith(f"stortune bench show {rid}") for line in summary)
    assert any(line.strip().startswith(f"stortune bench compare EARLIER {rid}") for line in summary)


def test_run_message_does_not_repeat_the_state() -> None:
    def run(state: str, message: str) -> BenchmarkRun:
        status = {"state": state, "message": message}
        return BenchmarkRun.parse({"metadata": {"name": "r1"}, "status": status})

    assert bench.run_message(run("done", "done: 36 step run(s)")) == "36 step run(s)"
    assert bench.run_message(run("done", "done")) == ""
    assert bench.run_message(run("failed", "refused by the agent: no fio")) == "refused by the agent: no fio"
    assert bench.run_message(run("failed", "failed to start fio")) == "failed to start fio"


def noisy_tail(step: Any, repeat: int) -> dict[str, float]:
    """Steady figures, except the p99.9 latency, which jumps between repeats."""
    values = steady()(step, repeat)
    for direction in ("read", "write"):
        if f"{direction}_lat_p999" in values:
            values[f"{direction}_lat_p999"] *= (1.0, 1.6, 0.6)[repeat % 3]
    return values


def test_show_names_the_figure_that_made_a_step_noisy(stortune: Run, fleet: ControlPlane,
                                                      agent: BenchAgent, tmp_path: Path) -> None:
    agent.values = noisy_tail
    rid = run_id(stortune("bench", "run", "-f", str(spec_file(tmp_path))).out)
    shown = stortune("bench", "show", rid).out
    read = next(line for line in shown.splitlines() if line.strip().startswith("seq-1m/read"))
    assert "1.0% NOISY: P99.9" in read  # the bandwidth's CV is 1%: the noise is the tail's
    assert any(line.strip().startswith("seq-1m/read read: P99.9 CV ") for line in shown.splitlines())


def worse_cpu(step: Any, repeat: int) -> dict[str, float]:
    values = steady()(step, repeat)
    values["cpu_sys"] *= 3
    return values


def test_compare_leads_with_the_objective_and_says_which_metric_made_it_exit_2(
        stortune: Run, fleet: ControlPlane, agent: BenchAgent, tmp_path: Path) -> None:
    spec = str(spec_file(tmp_path, "mixed", workloads=MIXED))
    before = run_id(stortune("bench", "run", "-f", spec).out)
    agent.values = worse_cpu
    busier = run_id(stortune("bench", "run", "-f", spec).out)
    agent.values = steady(0.7)
    slower = run_id(stortune("bench", "run", "-f", spec).out)

    # cpu_sys tripled: beyond the noise, but not what any step is for: no regression
    informative = stortune("bench", "compare", before, busier)
    assert informative.code == 0, informative.out
    lines = informative.out.splitlines()
    assert "cpu_sys" not in informative.out.split("other metric(s) compared")[0]
    assert any("other metric(s) compared" in line and "beyond the noise" in line for line in lines)
    assert lines[-1].startswith("no objective metric worse beyond the noise")
    listed = stortune("bench", "compare", before, busier, "--all").out
    assert "Other metrics (they do not set the exit code):" in listed
    assert any(line.split()[:2] == ["seq-1m/read", "cpu_sys"] and line.split()[-1] == "worse"
               for line in listed.splitlines())

    worse = stortune("bench", "compare", before, slower)
    assert worse.code == 2
    lines = worse.out.splitlines()
    table = lines.index(next(line for line in lines if line.startswith("What the steps are for")))
    assert lines[table + 1].split() == ["STEP", "METRIC", "A", "B", "CHANGE", "NOISE", "VERDICT"]
    assert lines[table + 2].split()[:2] == ["seq-1m/read", "read_bandwidth"]  # leads the table
    verdict = lines.index(next(line for line in lines if line.startswith("exit 2:")))
    assert "objective metric(s) worse beyond the noise" in lines[verdict]
    assert "  seq-1m/read read_bandwidth -30.0%, outside the noise -5.0%..+5.0%" in lines[verdict + 1:]
    assert "  iometer-4k/randread read_lat_p99 +42.9%, outside the noise -5.0%..+5.0%" in lines[verdict + 1:]
    as_json = json.loads(stortune("bench", "compare", before, slower, "-o", "json").out)
    assert as_json["summary"]["objectiveWorse"] == 10
    objective = {(r["step"], r["metric"]) for r in as_json["rows"] if r["objective"]}
    assert ("seq-1m/read", "read_bandwidth") in objective and ("seq-1m/read", "cpu_sys") not in objective


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def demo_loop(backing: str, name: str = "loop7") -> Device:
    """The scratch loop device of `./dev up`, as discovery reports it (id: its backing file)."""
    return Device(name=name, kind=DeviceKind.LOOP, id=f"loop:{backing}", size_bytes=256 << 20,
                  rotational=False)


@pytest.mark.parametrize("example", sorted((EXAMPLES / "benchmarks").glob("*.yaml")), ids=lambda p: p.name)
def test_the_benchmark_examples_run_on_dev_ups_scratch_loop_device_only(
        stortune: Run, control_plane: ControlPlane, example: Path) -> None:
    """A newcomer's first benchmark: the example selects the agent `./dev up` starts, and on it the
    loop device over state/stortune-demo.img, not another device of the host."""
    control_plane.register("laptop", {"stortune.dev/demo": "true"}, devices=[
        demo_loop("/home/me/stortune/state/stortune-demo.img"), demo_loop("/var/lib/images/vm.img", "loop8"),
        raid_volume()])
    control_plane.register("web-1", {"role": "streamer"})  # not a demo host: not selected
    planned = stortune("bench", "run", "--dry-run", "-f", str(example), "-o", "json")
    assert planned.code == 0, planned.err
    (host,) = json.loads(planned.out)["hosts"]
    assert host["host"] == "laptop" and host["problems"] == []
    assert host["target"] == "loop7"
    assert {s["repeats"] for s in host["steps"]} == {3}


def test_apply_passes_over_the_benchmark_examples(stortune: Run, control_plane: ControlPlane) -> None:
    """`stortune apply -f examples/` (the README's first step) applies the profiles; the
    BenchmarkSpecs in examples/benchmarks/ are for `bench run`, not an error."""
    assert len(list((EXAMPLES / "benchmarks").glob("*.yaml"))) >= 1  # a newcomer has one to run
    applied = stortune("apply", "-f", str(EXAMPLES))
    assert applied.code == 0, applied.err
    assert not any("local-demo-seq" in line for line in applied.out.splitlines())
    only_specs = stortune("apply", "-f", str(EXAMPLES / "benchmarks"))
    assert only_specs.code == 1 and "no StorageProfile documents found" in only_specs.err
