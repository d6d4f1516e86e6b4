"""Issue 26, point 2 for `stortune-agent tune`: a trial whose fio read another device than the one
it tuned stops the experiment, and a device whose stable id another device shares is not taken.

On the fixture host (loop7 over /var/tmp/rpc-test.img), fio replaced at its seam.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from stortune.agent import journal, local
from stortune.agent.tune import LocalExperiment, TuneError
from stortune.schemas.tuning.experiment import parse_experiment
from tests.agent.surfacefio import SurfaceFio
from tests.agent.test_tune import MiB, experiment, with_node
from tests.fixtures.agent_host import Host, build_host

OTHER = "/var/tmp/someone-else.img"


def test_hostile_a_trial_whose_fio_read_another_device_stops_the_experiment_and_puts_it_back(
        host: Host, tmp_path: Path) -> None:
    backing = host.fs.sysfs / "block/loop7/loop/backing_file"
    state = tmp_path / "state"

    def response(settings: Mapping[str, str]) -> float:
        if len(fio.seen) == 3:  # while the third run reads: loop7 becomes another file's device
            backing.write_text(OTHER + "\n")
        return 300 * MiB

    fio = SurfaceFio(host.fs, "loop7", response)
    exp = LocalExperiment(with_node(host).fs, state, parse_experiment(experiment()), runner=fio)
    with pytest.raises(TuneError, match=f"fio read loop:{OTHER}") as raised:
        exp.run()
    assert "settings are back" in str(raised.value)
    assert len(fio.seen) == 4  # the run that read the other device was the last
    assert len(exp.trials) == 3  # and it is no measurement
    assert journal.experiment_running(state) is None and journal.abandoned_experiment(state) is None
    assert local.saved_desired(state) is None


def test_hostile_a_loop_device_over_the_same_file_as_another_is_not_taken(tmp_path: Path) -> None:
    host = build_host(tmp_path / "host")
    host.builder.loop(8, size=131072, backing_file="/var/tmp/rpc-test.img")
    host.builder.finish()
    doc = experiment(target={"device": {"kind": ["loop"], "name": ["loop7"]}})
    with pytest.raises(TuneError, match="loop8 has the id of loop7"):
        LocalExperiment(with_node(host).fs, tmp_path / "state", parse_experiment(doc),
                        runner=SurfaceFio(host.fs, "loop7", lambda _s: 300 * MiB))
    assert host.queue("read_ahead_kb") == "128" and not (tmp_path / "state" / "originals.json").exists()
