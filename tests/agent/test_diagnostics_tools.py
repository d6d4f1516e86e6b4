"""The tool runner: timeouts kill the whole process group, output is capped, lookups use the given path."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stortune.agent.diagnostics import ToolRunner, default_search_path
from tests.fixtures.diag_hosts import write_script


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def wait_dead(pids: list[int], seconds: float = 60.0) -> list[int]:
    """The pids still alive once all are dead or ``seconds`` passed (a generous poll: a killed
    process is gone at once, one left running lives for the test scripts' 600 s)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


@pytest.fixture
def leftovers() -> Iterator[list[int]]:
    """Pids of the test scripts' children, SIGKILLed at the end whatever the test found."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_hung_tool_and_its_children_are_killed_at_the_timeout(tmp_path: Path, leftovers: list[int]) -> None:
    pids = tmp_path / "pids"
    tool = write_script(tmp_path / "hang", f"echo partial\nsleep 600 &\necho $$ $! > {pids}\nwait")
    result = ToolRunner([tmp_path], timeout=0.5).run([str(tool)])
    leftovers += [int(p) for p in pids.read_text().split()]
    assert result.timed_out and result.exit_code is None and not result.abandoned
    assert result.stdout == b"partial\n"
    assert result.duration >= 0.5  # a lower bound only: it ran to its timeout, however slowly
    assert wait_dead(leftovers) == []  # the tool and its 600-s child: killed, not left running


def test_a_background_child_holding_the_pipe_does_not_hang_the_agent(tmp_path: Path,
                                                                      leftovers: list[int]) -> None:
    """The tool exits while a child it started still holds its stdout: the runner kills the
    tool's group instead of waiting for the pipe to close. A runner that waited would return
    after 600 s with the child's "late" in the output; this one returns without it, and the
    child is dead although it had 600 s to go."""
    pid = tmp_path / "pid"
    tool = write_script(tmp_path / "daemonish", f"(sleep 600; echo late) &\necho $! > {pid}\necho done")
    result = ToolRunner([tmp_path], timeout=30).run([str(tool)])
    leftovers.append(int(pid.read_text()))
    assert (result.exit_code, result.stdout, result.timed_out) == (0, b"done\n", False)
    assert wait_dead(leftovers) == []


@pytest.mark.skipif(shutil.which("setsid") is None, reason="setsid is not installed (util-linux)")
def test_a_child_that_left_the_tools_group_is_not_waited_for(tmp_path: Path, leftovers: list[int]) -> None:
    """Hostile: the child holding the pipe left the tool's process group (setsid), so killing
    the group misses it. The runner still returns, with what the tool printed, while that child
    is alive and holding the pipe: it did not wait for it."""
    pid = tmp_path / "pid"
    tool = write_script(tmp_path / "escapes", f"setsid sleep 600 &\necho $! > {pid}\necho done")
    result = ToolRunner([tmp_path], timeout=30).run([str(tool)])
    leftovers.append(int(pid.read_text()))
    assert (result.exit_code, result.stdout, result.timed_out) == (0, b"done\n", False)
    assert alive(leftovers[0]), "the escaped child ended before the runner returned"


def test_output_beyond_the_cap_is_dropped(tmp_path: Path) -> None:
    tool = write_script(tmp_path / "chatty", "head -c 100000 /dev/zero\necho oops >&2")
    result = ToolRunner([tmp_path], max_output=1000).run([str(tool)])
    assert (len(result.stdout), result.truncated) == (1000, True)
    assert (result.stderr, result.exit_code) == (b"oops\n", 0)


def test_tools_run_in_the_c_locale_with_no_stdin(tmp_path: Path) -> None:
    tool = write_script(tmp_path / "env", 'echo "$LC_ALL $LANG"; cat; echo "rc=$?"')
    assert ToolRunner([tmp_path]).run([str(tool)]).stdout == b"C C\nrc=0\n"


def test_lookup_uses_only_the_search_path(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("not executable")
    write_script(tmp_path / "mytool", "true")
    (tmp_path / "adir").mkdir(mode=0o755)
    runner = ToolRunner([tmp_path])
    assert runner.which("mytool") == str(tmp_path / "mytool")
    assert runner.which("plain") is None and runner.which("adir") is None and runner.which("sh") is None
    assert ToolRunner(f"{tmp_path / 'nowhere'}{os.pathsep}{tmp_path}").which("mytool") == str(
        tmp_path / "mytool")
    default = default_search_path()
    assert {"/usr/sbin", "/sbin", "/opt/MegaRAID/storcli", "/opt/MegaRAID/perccli"} <= set(default)
    assert len(default) == len(set(default))


def test_a_tool_that_cannot_start_is_an_error_not_an_exception(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.write_bytes(b"\x7fELF garbage")
    broken.chmod(0o755)
    result = ToolRunner([tmp_path]).run([str(broken)])
    assert result.exit_code is None and result.error is not None
    assert result.error.startswith(f"cannot run {broken}: Exec format error")
