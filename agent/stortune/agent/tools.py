"""Running external storage tools (diagnostics' collectors, the benchmark signature probe):
looked up on an injected search path, each with a timeout.

A tool that is not installed is an answer (``which`` returns None), not an
error. A tool that hangs is killed with its whole process group at the
timeout and what it printed so far is kept; one stuck in uninterruptible I/O
(a dying disk) cannot be killed at all, so it is abandoned rather than waited
for. Output past ``max_output`` bytes is dropped: a runaway tool must not
exhaust the agent's memory.

Every tool runs in a private working directory (a fresh temporary one per run unless the
caller names one): vendor tools drop files where they stand (arcconf writes ``UcliEvt.log``
on every call), and the agent's own directory is not theirs to litter.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

# Where storage tools live besides $PATH: sbin for mdadm/multipath/xfs_info when the
# agent runs with a user's PATH, and the vendor directories storcli/perccli install into.
EXTRA_DIRS = (
    "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin",
    "/opt/MegaRAID/storcli", "/opt/MegaRAID/perccli", "/opt/lsi/storcli",
)
_KILL_WAIT = 5.0  # seconds to wait for a SIGKILLed tool before abandoning it
_DRAIN_WAIT = 2.0  # seconds to wait for pipes to close after the tool exited


def default_search_path() -> list[str]:
    """The process PATH, then the usual sbin and vendor directories."""
    dirs: list[str] = []
    for d in [*os.environ.get("PATH", "").split(os.pathsep), *EXTRA_DIRS]:
        if d and d not in dirs:
            dirs.append(d)
    return dirs


@dataclass(frozen=True)
class ToolResult:
    argv: list[str]
    exit_code: int | None  # None: it did not exit (killed at the timeout, or could not start)
    stdout: bytes = b""
    stderr: bytes = b""
    duration: float = 0.0
    timed_out: bool = False
    abandoned: bool = False  # still alive after SIGKILL: stuck in uninterruptible I/O
    truncated: bool = False
    error: str | None = None  # could not be started


class _Drain(threading.Thread):
    """Reads one pipe to EOF, keeping at most ``cap`` bytes."""

    def __init__(self, pipe: IO[bytes], cap: int) -> None:
        super().__init__(daemon=True)
        self.fd = pipe.fileno()
        self.pipe = pipe
        self.cap = cap
        self.chunks: list[bytes] = []
        self.size = 0
        self.truncated = False

    def run(self) -> None:
        try:
            while chunk := os.read(self.fd, 65536):
                keep = chunk[: max(0, self.cap - self.size)]
                self.truncated |= len(keep) < len(chunk)
                if keep:
                    self.chunks.append(keep)
                    self.size += len(keep)
        except OSError:
            pass
        finally:
            self.pipe.close()

    def data(self) -> bytes:
        return b"".join(self.chunks)


class ToolRunner:
    """Finds executables on ``search_path`` (default: ``default_search_path()``) and runs them."""

    def __init__(self, search_path: Sequence[str | Path] | str | None = None, *,
                 timeout: float = 30.0, max_output: int = 64 << 20,
                 cwd: str | Path | None = None) -> None:
        if search_path is None:
            self.search_path = default_search_path()
        elif isinstance(search_path, str):
            self.search_path = [d for d in search_path.split(os.pathsep) if d]
        else:
            self.search_path = [str(d) for d in search_path]
        self.timeout = timeout
        self.max_output = max_output
        #: where tools run; None: a temporary directory made for each run and removed after it
        self.cwd = None if cwd is None else str(cwd)
        # C locale: the numbers and messages support expects, whatever the agent's locale
        self.env = {**os.environ, "LC_ALL": "C", "LANG": "C"}

    def which(self, name: str) -> str | None:
        for directory in self.search_path:
            path = os.path.join(directory, name)
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path
        return None

    def run(self, argv: Sequence[str]) -> ToolResult:
        if self.cwd is not None:
            return self._run(argv, self.cwd)
        import tempfile  # lazily: the agent's serve path imports this module

        with tempfile.TemporaryDirectory(prefix="stortune-tool-", ignore_cleanup_errors=True) as cwd:
            return self._run(argv, cwd)

    def _run(self, argv: Sequence[str], cwd: str) -> ToolResult:
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=self.env, cwd=cwd, start_new_session=True, close_fds=True,
            )
        except OSError as exc:
            return ToolResult(list(argv), None, error=f"cannot run {argv[0]}: {exc.strerror or exc}")
        assert proc.stdout is not None and proc.stderr is not None
        drains = [_Drain(proc.stdout, self.max_output), _Drain(proc.stderr, self.max_output)]
        for d in drains:
            d.start()
        timed_out = abandoned = False
        try:
            proc.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc.pid)
            try:
                proc.wait(timeout=_KILL_WAIT)
            except subprocess.TimeoutExpired:
                abandoned = True
        if not _joined(drains, _DRAIN_WAIT):
            # something the tool started still holds the pipe open: it is ours, end it
            _kill_group(proc.pid)
            _joined(drains, _DRAIN_WAIT)
        return ToolResult(
            argv=list(argv),
            exit_code=None if timed_out else proc.returncode,
            stdout=drains[0].data(),
            stderr=drains[1].data(),
            duration=time.monotonic() - start,
            timed_out=timed_out,
            abandoned=abandoned,
            truncated=drains[0].truncated or drains[1].truncated,
        )


def _joined(drains: list[_Drain], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    for d in drains:
        d.join(max(0.0, deadline - time.monotonic()))
    return not any(d.is_alive() for d in drains)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
