"""Suite-wide options and fixtures.

``--update-golden`` rewrites golden files from the current output instead of
comparing against them. Goldens are never edited by hand: regenerate, then
review the diff like any other change.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

GOLDEN_DIR = Path(__file__).parent / "golden"

# Real loop devices for any test that asks (agent, rpc, e2e).
pytest_plugins = ["tests.loopdev", "tests.fixtures.agent_host"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="rewrite golden files under tests/golden/ instead of comparing against them",
    )
    parser.addoption(
        "--shard",
        default=None,
        metavar="K/N",
        help="run only every N-th collected test, starting at the K-th (1-based): ./dev test runs"
             " the control plane's tests as N such processes side by side",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    shard = config.getoption("--shard")
    if shard is None:
        return
    try:
        k, n = (int(part) for part in shard.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--shard {shard!r}: expected K/N, e.g. 1/2") from None
    if not 1 <= k <= n:
        raise pytest.UsageError(f"--shard {shard!r}: K must be between 1 and N")
    # The slow ones (marked slow, with their rough seconds) first, each to the shard with the
    # fewest seconds so far (largest first), then the rest dealt round, not cut in blocks, so
    # that each shard gets its share of both. A module marked `together` (one browser and one
    # fleet for all its tests) is one unit.
    units: list[list[pytest.Item]] = []
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        if item.get_closest_marker("together") is None:
            units.append([item])
        elif item.nodeid.split("::")[0] in modules:
            modules[item.nodeid.split("::")[0]].append(item)
        else:
            units.append(modules.setdefault(item.nodeid.split("::")[0], [item]))
    slow = sorted((u for u in units if any(_slow_seconds(item) for item in u)),
                  key=lambda u: -sum(_slow_seconds(item) for item in u))
    rest = [u for u in units if not any(_slow_seconds(item) for item in u)]
    loads = [0.0] * n
    mine: set[int] = set()
    for unit in slow:
        lightest = loads.index(min(loads))
        loads[lightest] += sum(_slow_seconds(item) for item in unit)
        if lightest == k - 1:
            mine.update(id(item) for item in unit)
    mine.update(id(item) for i, unit in enumerate(rest) if i % n == k - 1 for item in unit)
    config.hook.pytest_deselected(items=[item for item in items if id(item) not in mine])
    items[:] = [item for item in items if id(item) in mine]


def _slow_seconds(item: pytest.Item) -> float:
    """0 for a test not marked slow; else its rough seconds (``slow(seconds=N)``, 10 unsaid)."""
    marker = item.get_closest_marker("slow")
    return 0.0 if marker is None else float(marker.kwargs.get("seconds", 10))


@dataclass(frozen=True)
class Golden:
    update: bool

    def check(self, rel: str, data: object) -> None:
        """Compare ``data`` as pretty, key-sorted JSON with ``tests/golden/<rel>``."""
        path = GOLDEN_DIR / rel
        text = json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        if self.update:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            return
        if not path.exists():
            pytest.fail(f"golden file {path} is missing: run pytest --update-golden and review it")
        expected = path.read_text(encoding="utf-8")
        if text != expected:
            diff = list(difflib.unified_diff(
                expected.splitlines(), text.splitlines(), f"golden/{rel}", "actual", lineterm="",
            ))
            shown = "\n".join(diff[:120]) + ("\n..." if len(diff) > 120 else "")
            pytest.fail(
                f"output differs from golden/{rel}; if the change is intended, run"
                f" pytest --update-golden and review the diff\n{shown}",
                pytrace=False,
            )


@pytest.fixture
def golden(request: pytest.FixtureRequest) -> Golden:
    return Golden(update=bool(request.config.getoption("--update-golden")))


def _real_device_settings() -> dict[str, str]:
    """Every writable queue/md attribute of this host's non-loop block devices."""
    values: dict[str, str] = {}
    for dev in sorted(Path("/sys/block").glob("*")):
        if dev.name.startswith("loop"):
            continue  # tests create (and restore) their own loop devices
        for sub in ("queue", "md", "device"):
            directory = dev / sub
            if not directory.is_dir():
                continue
            for attr in sorted(directory.iterdir()):
                try:
                    if not attr.is_file() or not attr.stat().st_mode & 0o222:
                        continue
                    values[f"{dev.name}/{sub}/{attr.name}"] = attr.read_text().strip()
                except OSError:
                    continue
    return values


@pytest.fixture(scope="session", autouse=True)
def host_devices_untouched() -> object:
    """Fails the run if any test changed a device it did not create (vda, zram ...)."""
    before = _real_device_settings()
    yield
    after = _real_device_settings()
    changed = {k: (v, after.get(k)) for k, v in before.items() if after.get(k) != v}
    assert not changed, f"tests changed settings of devices they did not create: {changed}"
