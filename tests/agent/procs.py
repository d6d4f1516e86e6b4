"""What is running, read from the real /proc: for tests that must leave no process behind."""

from __future__ import annotations

from pathlib import Path


def pids_in_group(pgid: int) -> list[int]:
    """Live members of the group: a zombie (killed, its parent gone, and an init here that may
    never reap it) runs nothing and holds nothing."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append(int(entry.name))
    return out


def processes_with(text: str) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    out.append(int(entry.name))
            except OSError:
                continue
    return out
