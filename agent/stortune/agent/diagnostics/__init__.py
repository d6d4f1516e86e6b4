"""Diagnostics for vendor support: collect an unredacted bundle on this host.

``collect(fs, tools=ToolRunner(...))`` returns a ``stortune.schemas.bundle.Bundle``;
redact it with ``stortune.schemas.redact`` and pack it with ``stortune.schemas.bundle.pack``.
"""

from stortune.agent.diagnostics import save
from stortune.agent.diagnostics.collect import Command, collect, commands, storage_lines
from stortune.agent.tools import ToolResult, ToolRunner, default_search_path

__all__ = [
    "Command", "ToolResult", "ToolRunner", "collect", "commands", "default_search_path",
    "save", "storage_lines",
]
