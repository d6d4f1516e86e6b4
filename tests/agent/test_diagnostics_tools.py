"""The tool runner: timeouts kill the whole process group, output is capped, lookups use the given path."""

from __future__ import annotations

import os
import time
from pathlib import Path

from stortune.agent.diagnostics import ToolRunner, default_search_path
from tests.fixtures.diag_hosts import write_script


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def wait_dead(pids: list[int], seconds: float = 3.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def test_a_hung_tool_and_its_children_are_killed_at_the_timeout(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    tool = write_script(tmp_path / "hang", f"echo partial\nsleep 60 &\necho $$ $! > {pids}\nwait")
    result = ToolRunner([tmp_path], timeout=0.5).run([str(tool)])
    assert result.timed_out and result.exit_code is None and not result.abandoned
    assert result.stdout == b"partial\n"
    assert 0.5 <= result.duration < 5
    assert wait_dead([int(p) for p in pids.read_text().split()]) == []


def test_a_background_child_holding_the_pipe_does_not_hang_the_agent(tmp_path: Path) -> None:
    pid = tmp_path / "pid"
    tool = write_script(tmp_path / "daemonish", f"sleep 60 &\necho $! > {pid}\necho done")
    start = time.monotonic()
    result = ToolRunner([tmp_path], timeout=30).run([str(tool)])
    assert (result.exit_code, result.stdout, result.timed_out) == (0, b"done\n", False)
    assert time.monotonic() - start < 10
    assert wait_dead([int(pid.read_text())]) == []


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
