"""The adapter seam: what each vendor tool's adapter offers, and running a tool for JSON or text."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Protocol

from pydantic import ValidationError

from stortune.agent.tools import ToolResult, ToolRunner
from stortune.schemas.controllers import (
    AdapterName,
    Controller,
    ControllerError,
    ControllerSetting,
    VirtualDrive,
)

#: A tool's whole answer for all its controllers; real ones are tens of kB per controller.
MAX_TOOL_OUTPUT = 8 << 20


class ToolFailure(Exception):
    """The tool could not give a usable answer (hang, exit status, garbage, wrong shape)."""


#: what reading one controller's answer may raise: an error for that controller only (a
#: pydantic ValidationError is a ValueError; the rest are gaps of a parser met by junk numbers)
UNREADABLE = (ToolFailure, ValueError, ArithmeticError)


def unreadable(exc: Exception) -> str:
    """The message for a controller whose answer raised one of ``UNREADABLE``."""
    if isinstance(exc, ToolFailure):
        return str(exc)
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        return f"value out of range: {where}: {err['msg']} (got {err.get('input')!r})"
    return f"unreadable value: {exc}"


class PolicyUnsupported(ToolFailure):
    """This controller offers no such setting or value (Smart Array: no per-volume read-ahead)."""


class ControllerAdapter(Protocol):
    name: AdapterName
    #: executables that speak this adapter's language, first found wins
    tools: tuple[str, ...]

    def discover(self, runner: ToolRunner, tool: str) -> tuple[list[Controller], list[ControllerError]]:
        """Every controller ``tool`` answers for; failures are returned, not raised."""
        ...

    def set_policy(self, runner: ToolRunner, tool: str, controller: Controller, vd: VirtualDrive,  # noqa: PLR0917
                   setting: ControllerSetting, value: str) -> None:
        """Writes one policy of one virtual drive in the tool's own syntax; ``value`` is the
        normalised word (``read-ahead``, ``write-back``, ``enabled`` ...). Raises ToolFailure
        (PolicyUnsupported when the controller does not offer it); the caller reads back."""
        ...


def run_json(runner: ToolRunner, argv: Sequence[str]) -> object:
    """Runs ``argv`` and returns its stdout parsed as JSON, or raises ToolFailure saying why."""
    result = run_ok(runner, argv)
    try:
        return loads_json(result.stdout)
    except ToolFailure as exc:
        raise ToolFailure(f"`{' '.join(argv)}` {exc}{_detail(result)}") from None


def loads_json(data: bytes) -> object:
    """``data`` parsed as JSON, or a ToolFailure saying why not. Not only JSONDecodeError: a
    number of more than 4,300 digits is a plain ValueError, deep nesting a RecursionError."""
    try:
        return json.loads(data)
    except RecursionError:  # small but nested thousands deep: not something storcli prints
        raise ToolFailure("printed JSON nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, the int digit limit
        raise ToolFailure(f"did not print JSON ({str(exc)[:200]})") from None


def digits(text: str) -> bool:
    """ASCII digits only: ``str.isdigit`` also takes ``²`` (which int() refuses) and Arabic-Indic digits."""
    return text.isascii() and text.isdigit()


def run_ok(runner: ToolRunner, argv: Sequence[str], *, ok_exit: tuple[int, ...] = (0,)) -> ToolResult:
    """Runs ``argv``; a tool that could not start, hung, flooded or exited outside ``ok_exit``
    is a ToolFailure (ssacli exits 1 on a host without controllers: its caller looks closer)."""
    result = runner.run(argv)
    cmd = " ".join(argv)
    if result.error:
        raise ToolFailure(result.error)
    if result.timed_out:
        raise ToolFailure(f"`{cmd}` did not finish within {runner.timeout:g} s and was killed"
                          + (" (stuck in the kernel: abandoned)" if result.abandoned else ""))
    if result.truncated:
        raise ToolFailure(f"`{cmd}` printed more than {runner.max_output} bytes: output dropped")
    if result.exit_code not in ok_exit:
        raise ToolFailure(f"`{cmd}` exited with status {result.exit_code}{_detail(result)}")
    return result


def where(controller: Controller, vd: VirtualDrive, setting: ControllerSetting, value: str) -> str:
    """How a write names itself in every error: which controller, volume, setting and value."""
    return (f"{controller.adapter} controller {controller.index} virtual drive {vd.id}:"
            f" setting {setting} to {value!r}")


def unsupported(controller: Controller, vd: VirtualDrive, setting: ControllerSetting, value: str, *,
                offered: Mapping[str, Mapping[str, object]], why: str = "") -> PolicyUnsupported:
    """The refusal for a setting or value outside the adapter's table, raised before any run."""
    values = offered.get(setting)
    choice = (f"this controller offers {', '.join(sorted(values))}" if values
              else "this controller has no such per-volume setting")
    return PolicyUnsupported(f"{where(controller, vd, setting, value)}: not supported ({why or choice})")


def run_write(runner: ToolRunner, argv: Sequence[str], context: str, *,
              ok_exit: tuple[int, ...] = (0,)) -> ToolResult:
    """Runs a write; any failure (cannot start, hang, exit status) is a ToolFailure led by ``context``."""
    try:
        return run_ok(runner, argv, ok_exit=ok_exit)
    except ToolFailure as exc:
        raise ToolFailure(f"{context}: {exc}") from None


def _detail(result: ToolResult) -> str:
    text = (result.stderr or result.stdout).decode("utf-8", "replace").strip()
    return f": {text[:200]}" if text else ""
