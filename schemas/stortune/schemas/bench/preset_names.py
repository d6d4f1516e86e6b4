"""The presets' names, apart from their expansions (``presets``).

The agent's parser offers them as ``bench --preset`` choices; every command builds
that parser, the serving agent included, which should not hold the step models and
the expansions for it (bench/agent_idle_rss.py).
"""

from __future__ import annotations

from typing import Literal, get_args

PresetName = Literal["iozone-seq", "iometer-4k", "iometer-64k", "seq-64k", "seq-1m", "stream-32k", "oltp-8k"]
PRESET_NAMES: tuple[str, ...] = get_args(PresetName)
