"""End to end on a real loop device (issue 26, point 9): a value the kernel refuses only when it is
written (nr_requests 256 on a loop queue without a scheduler: EINVAL) is an error on that setting
alone. The server, a real agent over gRPC and the CLI run as processes; the other profile's
read_ahead_kb is applied, and put back after a hand change, and `stortune diff` names the error."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.e2e.test_blocked_setting_e2e import _delete, _start, _status
from tests.e2e.test_control_plane_e2e import Fleet, eventually, fleet  # noqa: F401


def test_hostile_a_value_the_kernel_refuses_when_written_blocks_only_itself(
        fleet: Fleet, loop_devices: Callable[[int], list[str]], tmp_path: Path) -> None:  # noqa: F811
    (dev,) = loop_devices(1)
    queue = Path("/sys/block") / dev / "queue"
    nr, ra = queue / "nr_requests", queue / "read_ahead_kb"
    (queue / "scheduler").write_text("none")  # at most 128 requests without an elevator
    original_nr, original_ra = nr.read_text().strip(), ra.read_text().strip()
    want = "2048" if original_ra != "2048" else "1024"

    files = _start(fleet, tmp_path, dev, {"deep": (20, "{nr_requests: 256}"),
                                          "reads": (0, f"{{read_ahead_kb: {want}}}")})
    applied = fleet.cli("apply", "-f", str(files))
    assert "storageprofile/deep created" in applied.stdout, applied.stdout + applied.stderr

    # -- the other profile's setting is applied; the error is on the host and the profile -------
    eventually("read_ahead_kb applied", lambda: ra.read_text().strip() == want)
    rejected = eventually("Applied=False Rejected", lambda: fleet.is_("loophost", "Applied", "False"))
    assert rejected["reason"] == "Rejected" and "every other setting is applied" in rejected["message"]
    assert "nr_requests=256" in rejected["message"] and "Invalid argument" in rejected["message"]
    assert nr.read_text().strip() == original_nr
    deep = eventually("deep's status", lambda: (s := _status(fleet, "deep")).get("phase") == "Failed" and s)
    assert deep["rejectedHosts"] == ["loophost"]

    # -- the CLI names it: exit 1 --------------------------------------------------------------
    error = f"loophost: {dev} nr_requests=256 (deep/the-loop) cannot be set"
    run = fleet.cli("diff", "-f", str(files))
    assert run.returncode == 1 and error in run.stderr, (run.stdout, run.stderr)

    # -- a hand change of the other profile's setting is put back --------------------------------
    ra.write_text("256")
    eventually("read_ahead_kb put back after the hand change", lambda: ra.read_text().strip() == want)
    assert nr.read_text().strip() == original_nr
    assert fleet.is_("loophost", "Applied", "False")["reason"] == "Rejected"  # type: ignore[index]

    # -- removed: the error is gone and everything put back ---------------------------------------
    _delete(fleet, "deep", "reads")
    eventually("read_ahead_kb original restored", lambda: ra.read_text().strip() == original_ra)
    eventually("Applied=True", lambda: fleet.is_("loophost", "Applied"))
    assert nr.read_text().strip() == original_nr
