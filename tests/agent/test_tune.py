"""`stortune-agent tune` on a fixture host, with fio replaced by a response surface at its seam.

Bad inputs first: each is exit 1 naming the field, and nothing runs (no fio, no write, no
state). Then the loop itself: the trial values are in effect while fio runs, the device is
back at its settings afterwards (or holds the winner with applyResult), the experiment
owns the host meanwhile, and a stop (SIGINT/SIGTERM) ends it cleanly.
"""

from __future__ import annotations

import contextvars
import json
import random
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from stortune.agent import cli, daemon, journal, local, tune
from stortune.agent.journal import ExperimentBusyError
from stortune.agent.tune import LocalExperiment, TuneError
from stortune.schemas.documents import parse_profile
from stortune.schemas.tuning.experiment import baseline_point, check_against_device, parse_experiment
from tests.agent.fakekernel import PickyKernel
from tests.agent.surfacefio import SurfaceFio
from tests.fixtures.agent_host import Host
from tests.fixtures.sysfs_builder import SysfsBuilder

MiB = 1 << 20


def experiment(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "target": {"device": {"kind": ["loop"]}},
        "workloads": [{"preset": "stream-32k", "runtime": "5s"}],
        "objective": {"metric": "read_bandwidth", "goal": "maximize"},
        "parameters": [{"tunable": "read_ahead_kb", "values": [0, 128, 1024, 4096]}],
        "strategy": "one-at-a-time",
        "repeats": {"min": 2, "max": 4},
        "budget": {"trials": 30},
    }
    body.update(spec)
    return {"apiVersion": "stortune/v1", "kind": "TuningExperiment",
            "metadata": {"name": "ra-sweep"}, "spec": body}


def readahead_surface(seed: int = 1) -> Callable[[Mapping[str, str]], float]:
    """Read-ahead 0 starves buffered streams; 1024 and up is best (2% noise)."""
    rng = random.Random(seed)
    table = {"0": 100 * MiB, "128": 300 * MiB, "1024": 500 * MiB, "4096": 510 * MiB}

    def response(settings: Mapping[str, str]) -> float:
        return table.get(settings["read_ahead_kb"], 200 * MiB) * rng.gauss(1.0, 0.02)

    return response


def with_node(host: Host) -> Host:
    node = host.fs.device_node("loop7")
    node.parent.mkdir(parents=True, exist_ok=True)
    with open(node, "wb") as fh:
        fh.truncate(64 * MiB)
    return host


def tune_cli(host: Host, tmp_path: Path, doc: Any, *extra: str) -> int:
    path = tmp_path / "exp.yaml"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump_all(doc if isinstance(doc, list)
                                                                        else [doc]))
    return cli.main(["tune", "-f", str(path), "--sysfs", str(host.fs.sysfs), "--procfs",
                     str(host.fs.procfs), "--state-dir", str(tmp_path / "state"), *extra])


def untouched(host: Host, tmp_path: Path) -> None:
    assert host.queue("read_ahead_kb") == "128" and host.queue("scheduler").startswith("[none]")
    state = tmp_path / "state"
    assert not (state / "originals.json").exists() and not (state / "bench").exists()
    assert journal.experiment_running(state) is None and journal.abandoned_experiment(state) is None


BAD: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("unknown tunable", lambda d: d["spec"]["parameters"][0].update(tunable="readahead"),
     "spec.parameters[0].tunable"),
    ("value out of range", lambda d: d["spec"]["parameters"][0].update(values=[0, -5]),
     "spec.parameters[0].values[1]"),
    ("no parameters", lambda d: d["spec"].update(parameters=[]), "spec.parameters"),
    ("grid too large", lambda d: d["spec"].update(strategy="grid", parameters=[
        {"tunable": "read_ahead_kb", "range": {"min": 1, "max": 65536, "steps": 100}},
        {"tunable": "nr_requests", "range": {"min": 4, "max": 4096, "steps": 100}}]), "spec.parameters"),
    ("scheduler not offered", lambda d: d["spec"].update(parameters=[
        {"tunable": "scheduler", "values": ["none", "deadline-iosched"]}]), "spec.parameters[0].values[1]"),
    ("nothing beneath", lambda d: d["spec"].update(parameters=[
        {"tunable": "scheduler", "at": "beneath", "values": ["none", "mq-deadline"]}]), "spec.parameters[0]"),
    ("no such device", lambda d: d["spec"].update(target={"device": {"kind": ["disk"]}}),
     "spec.target.device matches none"),
    ("wrong kind", lambda d: d.update(kind="StorageProfile"), "kind"),
]


@pytest.mark.parametrize(("mutate", "expected"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_experiment_is_exit_1_naming_the_field_and_nothing_runs(
        host: Host, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        mutate: Callable[[dict[str, Any]], None], expected: str) -> None:
    doc = experiment()
    mutate(doc)
    assert tune_cli(with_node(host), tmp_path, doc) == 1
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err, err
    untouched(host, tmp_path)


@pytest.mark.parametrize(("case", "expected"), [
    (("", ()), "holds no TuningExperiment"),
    (("a: [unclosed", ()), "exp.yaml"),
    (([experiment(), experiment()], ()), "holds 2 experiments"),
    ((experiment(), ("--device", "sda")), "--device sda: no such block device"),
])
def test_bad_files_and_options_are_exit_1_and_nothing_runs(
        host: Host, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        case: tuple[Any, tuple[str, ...]], expected: str) -> None:
    doc, extra = case
    assert tune_cli(with_node(host), tmp_path, doc, *extra) == 1
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err, err
    untouched(host, tmp_path)


def test_a_missing_file_is_exit_1(host: Host, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["tune", "-f", str(tmp_path / "nope.yaml"), "--sysfs", str(host.fs.sysfs),
                     "--state-dir", str(tmp_path / "state")]) == 1
    assert "nope.yaml" in capsys.readouterr().err


def test_a_desired_profile_that_would_beat_the_trials_is_refused(host: Host, tmp_path: Path) -> None:
    state = tmp_path / "state"
    top = parse_profile({"apiVersion": "stortune/v1", "kind": "StorageProfile", "metadata": {"name": "a-top"},
                         "spec": {"priority": 1000, "rules": [{"name": "r", "match": {"kind": ["loop"]},
                                                               "settings": {"nr_requests": 64}}]}})
    assert local.converge(host.fs, [top], state).ok
    with pytest.raises(TuneError, match="a-top"):
        LocalExperiment(host.fs, state, parse_experiment(experiment()))


def run_experiment(host: Host, tmp_path: Path, doc: dict[str, Any],
                   response: Callable[[Mapping[str, str]], float] | None = None,
                   **kw: Any) -> tuple[LocalExperiment, SurfaceFio]:
    fio = SurfaceFio(host.fs, "loop7", response or readahead_surface())
    exp = LocalExperiment(with_node(host).fs, tmp_path / "state", parse_experiment(doc), runner=fio, **kw)
    return exp, fio


def test_a_sweep_measures_each_value_in_place_and_puts_the_device_back(host: Host, tmp_path: Path) -> None:
    (host.fs.sysfs / "block/loop7/queue/read_ahead_kb").write_text("0")
    exp, fio = run_experiment(host, tmp_path, experiment())
    result = exp.run()

    # Every run measured the values its trial asked for, and nothing else was left set.
    asked = [t.measurement.point["read_ahead_kb"] for t in result.trials]
    assert [int(s["read_ahead_kb"]) for s in fio.seen] == asked
    assert asked[:2] == [0, 0] and asked[-2:] == [0, 0]  # the baseline at both ends
    assert {128, 1024, 4096} <= set(asked)
    assert host.queue("read_ahead_kb") == "0" and result.left == "settings"
    assert journal.load_originals(tmp_path / "state") == {}
    assert local.saved_desired(tmp_path / "state") is None  # a trial is never the desired state
    assert journal.experiment_running(tmp_path / "state") is None
    assert journal.abandoned_experiment(tmp_path / "state") is None
    assert not list((tmp_path / "state" / "bench").iterdir())  # the runs' files are not kept

    rec = result.recommendation
    assert result.finished == "done" and not rec.keepCurrent and rec.significant
    assert rec.values["read_ahead_kb"] in (1024, 4096)
    assert rec.gain is not None and rec.gain.low > 100  # 5x the baseline, give or take the noise
    assert result.profile["kind"] == "StorageProfile"
    assert result.profile["spec"]["rules"][0]["settings"] == {"read_ahead_kb": rec.values["read_ahead_kb"]}
    assert all(t.overhead_s >= 0 for t in result.trials) and result.overhead_s is not None


def test_a_flat_surface_keeps_the_current_settings(host: Host, tmp_path: Path) -> None:
    rng = random.Random(3)
    exp, _ = run_experiment(host, tmp_path, experiment(), lambda s: 300 * MiB * rng.gauss(1.0, 0.02))
    result = exp.run()
    assert result.recommendation.keepCurrent and result.recommendation.values == {"read_ahead_kb": 128}
    assert host.queue("read_ahead_kb") == "128"


def test_apply_result_leaves_the_winner_applied_and_desired(host: Host, tmp_path: Path) -> None:
    exp, _ = run_experiment(host, tmp_path, experiment(applyResult=True))
    result = exp.run()
    assert result.left == "recommendation"
    assert host.queue("read_ahead_kb") == str(result.recommendation.values["read_ahead_kb"])
    saved = local.saved_desired(tmp_path / "state")
    assert saved is not None and [p.name for p in saved.profiles] == ["ra-sweep"]


def test_the_host_belongs_to_the_experiment_while_it_runs_and_a_stop_ends_it(host: Host,
                                                                              tmp_path: Path) -> None:
    state = tmp_path / "state"
    base = parse_profile({"apiVersion": "stortune/v1", "kind": "StorageProfile", "metadata": {"name": "base"},
                          "spec": {"rules": [{"name": "r", "match": {"kind": ["loop"]},
                                              "settings": {"nr_requests": 64}}]}})
    assert local.converge(host.fs, [base], state).ok
    stop = threading.Event()
    exp, fio = run_experiment(host, tmp_path, experiment(), stop=stop)
    fio.hold_if = lambda settings: settings["read_ahead_kb"] != "128"  # the first trial off the baseline
    results: list[Any] = []
    runner = threading.Thread(target=lambda: results.append(exp.run()))
    runner.start()
    try:
        assert fio.running.wait(30)
        while not fio.seen or fio.seen[-1]["read_ahead_kb"] == "128":
            assert runner.is_alive()
            fio.running.wait(0.01)
        # The daemon's re-apply (another context than the experiment's) is refused meanwhile.
        with pytest.raises(ExperimentBusyError, match=f"experiment {exp.id} running"):
            contextvars.Context().run(daemon.converge, host.fs, state)
        # The trial's value is in effect, the desired state under it.
        assert host.queue("read_ahead_kb") == fio.seen[-1]["read_ahead_kb"] == "0"
        assert host.queue("nr_requests") == "64"
    finally:
        stop.set()  # what SIGINT/SIGTERM do
        runner.join(60)
    (result,) = results
    assert result.finished == "interrupted"
    assert len(result.trials) == len(fio.seen) - 1  # the run cut short is no measurement
    assert host.queue("read_ahead_kb") == "128" and host.queue("nr_requests") == "64"
    saved = local.saved_desired(state)
    assert saved is not None and [p.name for p in saved.profiles] == ["base"]
    assert journal.experiment_running(state) is None and journal.abandoned_experiment(state) is None


def test_json_output_carries_the_recommendation(host: Host, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    fio = SurfaceFio(host.fs, "loop7", readahead_surface())
    made = tune.BenchmarkManager

    def manager(*args: Any, **kw: Any) -> Any:  # the CLI's manager, with fio replaced at its seam
        return made(*args, **{**kw, "runner": fio})

    monkeypatch.setattr(tune, "BenchmarkManager", manager)
    out = tmp_path / "profile.yaml"
    assert tune_cli(with_node(host), tmp_path, experiment(), "-o", "json", "--profile-out", str(out)) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    rec = data["recommendation"]
    assert set(rec) >= {"values", "gain", "keepCurrent"} and set(rec["gain"]) >= {"pct", "low", "high"}
    assert "trial 1 of" in captured.err and "leader" in captured.err
    profile = yaml.safe_load(out.read_text())
    assert profile["kind"] == "StorageProfile" and profile["metadata"]["name"] == "ra-sweep"


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tuning" / "local-demo-readahead.yaml"


def test_the_demo_experiment_tunes_dev_ups_scratch_device_only(tmp_path: Path) -> None:
    """The README's walk: the example picks the loop device over state/stortune-demo.img, at
    read-ahead 0 as `./dev up` leaves it, and no other loop device of the host."""
    b = SysfsBuilder(tmp_path / "host", hostname="laptop", kernel="6.12.0")
    b.loop(3, size=2 << 30, backing_file="/home/me/stortune/state/stortune-demo.img")
    b.loop(4, size=1 << 30, backing_file="/var/lib/snapd/snaps/core_1.snap")
    fs = b.finish()
    (fs.sysfs / "block/loop3/queue/read_ahead_kb").write_text("0")
    exp = tune.read_experiment(str(EXAMPLE))
    topology = local.discover(fs)
    device = tune.choose_device(exp, topology, None)
    assert device.name == "loop3"
    assert check_against_device(exp, device) == []
    assert baseline_point(exp, device) == {"read_ahead_kb": 0}


def test_a_trial_that_cannot_run_is_a_failed_measurement_not_a_crash(host: Host, tmp_path: Path) -> None:
    exp, fio = run_experiment(host, tmp_path, experiment())
    node = host.fs.device_node("loop7")

    def vanish(settings: Mapping[str, str]) -> float:
        node.unlink(missing_ok=True)  # the device node goes away after the first run
        return 300 * MiB

    fio.response = vanish
    result = exp.run()
    failures = [t.measurement for t in result.trials if not t.measurement.ok]
    assert len(fio.seen) == 1 and failures
    assert all("device node" in m.message for m in failures)
    assert result.recommendation.keepCurrent  # nothing measured beats the baseline: keep it
    assert host.queue("read_ahead_kb") == "128"
    assert journal.abandoned_experiment(tmp_path / "state") is None


def test_an_error_mid_run_puts_the_settings_back_before_it_surfaces(host: Host, tmp_path: Path) -> None:
    def broken(event: tune.Event) -> None:
        if event.done is not None and event.request.purpose != "baseline":
            raise RuntimeError("the terminal went away")

    exp, fio = run_experiment(host, tmp_path, experiment(), listener=broken)
    with pytest.raises(RuntimeError, match="terminal went away"):
        exp.run()
    assert fio.seen[-1]["read_ahead_kb"] != "128"  # it failed with a trial value in place ...
    assert host.queue("read_ahead_kb") == "128"  # ... which was put back
    assert journal.abandoned_experiment(tmp_path / "state") is None
    assert journal.load_originals(tmp_path / "state") == {}


def test_hostile_a_trial_value_the_device_stops_offering_is_a_failed_trial_not_a_measurement(
        host: Host, tmp_path: Path) -> None:
    """The rest of a plan is applied around a value the device refuses (issue 26.9), but a trial
    whose own value is refused must not be measured as if it were in place."""
    doc = experiment(parameters=[{"tunable": "scheduler", "values": ["none", "mq-deadline"]}])
    exp, fio = run_experiment(host, tmp_path, doc, lambda s: 300 * MiB)
    (host.fs.sysfs / "block/loop7/queue/scheduler").write_text("[none]\n")  # mq-deadline went away
    result = exp.run()
    asked = [t.measurement for t in result.trials if t.measurement.point["scheduler"] == "mq-deadline"]
    assert asked and all(not m.ok and "'mq-deadline' is not offered" in m.message for m in asked)
    assert {s["scheduler"] for s in fio.seen} == {"none"}  # fio ran only for the baseline's trials
    assert len(fio.seen) == len(result.trials) - len(asked)


def test_hostile_a_trial_value_the_kernel_refuses_when_written_is_a_failed_trial(
        host: Host, tmp_path: Path) -> None:
    """A value refused only at write time (EINVAL) is rolled back and the rest applied around it
    (issue 26.9); the trial asking for it still fails, and is not measured."""
    doc = experiment(parameters=[{"tunable": "nr_requests", "values": [64, 256]}])
    exp, fio = run_experiment(host, tmp_path, doc, lambda s: 300 * MiB)
    exp.fs = PickyKernel.over(exp.fs, refuses={"nr_requests": 128})  # a queue without a scheduler
    result = exp.run()
    asked = [t.measurement for t in result.trials if t.measurement.point["nr_requests"] == 256]
    # Refused when written, then remembered: each such trial fails, naming the kernel's reason.
    assert len(asked) >= 2 and all(not m.ok and "Invalid argument (EINVAL)" in m.message for m in asked)
    assert len(fio.seen) == len(result.trials) - len(asked)
    assert host.queue("nr_requests") == "128"
