"""--stripe-cache-ram-share on the agent's commands: a bad share is refused naming the option;
a share given changes what plan, apply, the hot-plug re-apply (serve --once) and analyze refuse
or warn about, on the md RAID5 file server fixture (md126: 5 disks, 31.3 GiB of RAM). The control
plane's share sent with an Apply (over real gRPC) can only tighten the agent's own, and holds for
the re-applies of what it sent."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from stortune.agent import journal, local
from stortune.agent.cli import main
from stortune.agent.kernelfs import KernelFS
from stortune.agent.serve import Agent
from stortune.api.agent.wire import ApplyResult
from stortune.schemas.documents import parse_profile
from stortune.server.agentclient import AgentRejected
from tests.fixtures.agent_host import serving
from tests.fixtures.scenarios import SCENARIOS
from tests.rpc.conftest import call

# 4096 x 4 KiB x 5 disks = 80 MiB: 0.25 % of the fixture's RAM, well inside the default 25 %.
PROFILE = """\
apiVersion: stortune/v1
kind: StorageProfile
metadata: {name: arrays}
spec:
  rules:
    - name: arrays
      match: {kind: [md]}
      settings: {stripe_cache_size: 4096}
"""


@pytest.fixture
def host(tmp_path: Path) -> KernelFS:
    return SCENARIOS["md_raid5_fileserver"](tmp_path / "host")


def run(fs: KernelFS, *args: str, profile: Path | None = None, state: Path | None = None) -> int:
    argv = [args[0], "--sysfs", str(fs.sysfs), "--procfs", str(fs.procfs), *args[1:]]
    if profile is not None:
        argv += ["-f", str(profile)]
    if state is not None:
        argv += ["--state-dir", str(state)]
    return main(argv)


@pytest.fixture
def profile(tmp_path: Path) -> Path:
    path = tmp_path / "arrays.yaml"
    path.write_text(PROFILE)
    return path


@pytest.mark.parametrize("command", ["plan", "apply", "explain", "udev-rules", "serve", "analyze", "tune"])
@pytest.mark.parametrize("value", ["0", "-0.25", "1.01", "nan", "inf", "a quarter", ""])
def test_a_bad_share_is_refused_naming_the_option(command: str, value: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([command, "--stripe-cache-ram-share", value])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert "--stripe-cache-ram-share" in err and "more than 0 and at most 1" in err


def test_plan_refuses_the_cache_above_the_share_given(host: KernelFS, profile: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state"
    refused = run(host, "plan", "--stripe-cache-ram-share", "0.001", "-o", "json", profile=profile,
                  state=state)
    doc = json.loads(capsys.readouterr().out)
    assert refused == 1
    [rejection] = doc["rejections"]
    assert (rejection["device"], rejection["tunable"], rejection["fatal"]) == (
        "md126", "stripe_cache_size", True)
    assert "more than the 0.1 % allowed" in rejection["reason"]
    # the default share (and a share of all the RAM) let it through: changes pending
    assert run(host, "plan", "-o", "json", profile=profile, state=state) == 2
    assert not json.loads(capsys.readouterr().out)["rejections"]
    assert run(host, "plan", "--stripe-cache-ram-share", "1", profile=profile, state=state) == 2


def test_apply_and_the_re_apply_of_serve_hold_to_the_share(host: KernelFS, profile: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state"
    cache = host.sysfs / "block" / "md126" / "md" / "stripe_cache_size"
    assert run(host, "apply", "--stripe-cache-ram-share", "0.001", profile=profile, state=state) == 1
    assert "more than the 0.1 % allowed" in capsys.readouterr().err
    assert cache.read_text().strip() == "256"  # nothing was changed
    assert run(host, "apply", profile=profile, state=state) == 0
    assert cache.read_text().strip() == "4096"
    cache.write_text("256\n")  # drifted: the re-apply would set it again, unless the share forbids it
    assert run(host, "serve", "--once", "--stripe-cache-ram-share", "0.001", state=state) == 1
    assert cache.read_text().strip() == "256"
    assert run(host, "serve", "--once", state=state) == 0
    assert cache.read_text().strip() == "4096"


def test_analyze_warns_about_a_cache_above_the_share_given(host: KernelFS, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    def check(*share: str) -> dict[str, str]:
        assert run(host, "analyze", *share, "-o", "json", state=tmp_path / "s") == 0
        md = next(d for d in json.loads(capsys.readouterr().out)["devices"] if d["device"] == "md126")
        found: dict[str, str] = next(c for c in md["checks"] if c["code"] == "stripe-cache-ram")
        return found

    assert check()["severity"] == "info"
    # 256 x 4 KiB x 5 disks = 5 MiB, 0.016 % of the RAM
    over = check("--stripe-cache-ram-share", "0.0001")
    assert over["severity"] == "warning" and "more than the 0.01 % allowed" in over["message"]


# -- the control plane's share, sent with an Apply ------------------------------------------------
# The array's read-ahead goes with the cache, so an apply always has something to write.
BOTH = PROFILE.replace("settings: {stripe_cache_size: 4096}",
                       "settings: {stripe_cache_size: 4096, read_ahead_kb: 8192}")


def _apply(agent: Agent, ram_share: float | None) -> ApplyResult:
    profile = parse_profile(yaml.safe_load(BOTH))
    return call(lambda c: c.for_address(agent.address).apply([profile], {"arrays": 1}, "a",
                                                               ram_share=ram_share))


def _md(fs: KernelFS, attr: str) -> str:
    return (fs.sysfs / "block" / "md126" / attr).read_text().strip()


def _rejected(result: ApplyResult) -> list[tuple[str, str]]:
    return [(r["tunable"], r["message"]) for r in result.report["rows"] if r["status"] == "rejected"]


@pytest.mark.parametrize("share", [0.0, -0.25, 1.01, math.nan, math.inf])
def test_hostile_a_share_that_is_not_one_is_invalid_argument_naming_the_field(
        host: KernelFS, tmp_path: Path, share: float) -> None:
    with serving(host, tmp_path / "state") as agent, pytest.raises(AgentRejected) as refused:
        _apply(agent, share)
    assert refused.value.code == "INVALID_ARGUMENT"
    assert "stripe_cache_ram_share" in refused.value.message
    assert "more than 0 and at most 1" in refused.value.message
    assert (_md(host, "md/stripe_cache_size"), _md(host, "queue/read_ahead_kb")) == ("256", "4096")


def test_hostile_a_request_asking_for_a_larger_share_than_the_agents_is_ignored(
        host: KernelFS, tmp_path: Path) -> None:
    # The host allows 0.1 %; a control plane asking for all of the RAM cannot loosen that.
    with serving(host, tmp_path / "state", stripe_cache_ram_share=0.001) as agent:
        result = _apply(agent, 1.0)
    [(tunable, why)] = _rejected(result)
    assert tunable == "stripe_cache_size" and "more than the 0.1 % allowed" in why
    assert (_md(host, "md/stripe_cache_size"), _md(host, "queue/read_ahead_kb")) == ("256", "8192")


def test_the_control_planes_smaller_share_bounds_the_apply_and_every_re_apply(
        host: KernelFS, tmp_path: Path) -> None:
    state = tmp_path / "state"
    with serving(host, state) as agent:  # its own share: the default 25 %, which fits the cache
        result = _apply(agent, 0.001)
    [(tunable, why)] = _rejected(result)
    assert tunable == "stripe_cache_size" and "more than the 0.1 % allowed" in why
    assert (_md(host, "md/stripe_cache_size"), _md(host, "queue/read_ahead_kb")) == ("256", "8192")
    assert result.plan.changes == []  # what the agent reports is what it did: nothing pending
    # A re-apply of the stored desired state (restart, hot-plug) holds to the same share.
    (host.sysfs / "block" / "md126" / "queue" / "read_ahead_kb").write_text("4096\n")
    assert run(host, "serve", "--once", state=state) == 1  # the cache is still an error
    assert (_md(host, "md/stripe_cache_size"), _md(host, "queue/read_ahead_kb")) == ("256", "8192")


def test_a_control_plane_that_sends_no_share_leaves_the_agents_own(host: KernelFS, tmp_path: Path) -> None:
    with serving(host, tmp_path / "state") as agent:
        result = _apply(agent, None)
    assert _rejected(result) == []
    assert (_md(host, "md/stripe_cache_size"), _md(host, "queue/read_ahead_kb")) == ("4096", "8192")


@pytest.mark.parametrize("stored", [0, 2.5, True, "0.1", None])
def test_hostile_a_stored_share_that_is_not_one_makes_the_desired_state_unreadable(
        tmp_path: Path, stored: object) -> None:
    doc = local.DesiredState([parse_profile(yaml.safe_load(BOTH))], {"arrays": 1}, 0.001).document()
    assert local.saved_desired(_stored(tmp_path, doc)) == local.DesiredState(
        [parse_profile(yaml.safe_load(BOTH))], {"arrays": 1}, 0.001)
    if stored is None:  # a desired state stored before the field: the agent's own share
        del doc["stripe_cache_ram_share"]
        assert local.saved_desired(_stored(tmp_path, doc)).ram_share is None  # type: ignore[union-attr]
        return
    doc["stripe_cache_ram_share"] = stored
    with pytest.raises(local.AgentError, match="stripe_cache_ram_share"):
        local.saved_desired(_stored(tmp_path, doc))


def _stored(state: Path, doc: dict[str, object]) -> Path:
    journal.save_desired(state, doc)
    return state
