"""The reconciler with the real agent over gRPC, on a fixture host whose kernel refuses a value only
when it is written (EINVAL: nr_requests above what a queue without a scheduler takes).

That setting is reported like one the planner knows the device refuses (issue 26, point 9): on
the host's settings table and its Applied condition, and on its profile's status; the other
profile's setting is applied and put back after a hand change, and the refused value is not
written again at every reconcile.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from stortune.agent.serve import Agent
from stortune.schemas.plan import KERNEL_REFUSED, Rejection
from stortune.schemas.planner import plan
from stortune.schemas.profile import StorageProfile
from stortune.server.agentclient import AgentClients, GrpcAgentClient, Timeouts
from stortune.server.reconciler.decide import HostView
from stortune.server.reconciler.report import conclude
from tests.agent.fakekernel import PickyKernel
from tests.fixtures.agent_host import BOOT_ID, Host, serving
from tests.server.builders import API, profile_doc, with_changes
from tests.server.conftest import Eventually
from tests.server.support import AppFactory, admin_client
from tests.server.test_reconcile_decide import decision_for, profile, seen, topology, view


class CountingClients(AgentClients):
    """The real gRPC clients, counting the calls made to the agents by method."""

    def __init__(self) -> None:
        super().__init__(timeouts=Timeouts(read=5, apply=10))
        self.calls: Counter[str] = Counter()

    def for_address(self, address: str, host: str | None = None) -> GrpcAgentClient:
        return _Counted(address, self, Timeouts(read=5, apply=10), host)


class _Counted(GrpcAgentClient):
    async def _call(self, method: str, request: Any, timeout: float, decode: Callable[[Any], Any]) -> Any:
        assert isinstance(self._clients, CountingClients)
        self._clients.calls[method] += 1
        return await super()._call(method, request, timeout, decode)


@pytest.fixture
def picky(host: Host) -> PickyKernel:
    return PickyKernel.over(host.fs, refuses={"nr_requests": 128})  # loop7 has no scheduler


@pytest.fixture
def picky_agent(picky: PickyKernel, tmp_path: Path) -> Iterator[Agent]:
    with serving(picky, tmp_path / "state") as running:
        yield running


def test_hostile_a_value_the_kernel_refuses_when_written_shows_on_the_host_and_its_profile(
    make_app: AppFactory, picky_agent: Agent, picky: PickyKernel, host: Host, eventually: Eventually,
) -> None:
    agents = CountingClients()
    app = make_app(agents=agents, reconcile_interval_s=0.5)
    with admin_client(app) as client:
        assert client.post(f"{API}/agents/register", json={
            "name": "rpc-host", "address": picky_agent.address, "labels": {"role": "streamer"},
            "facts": {"boot_id": BOOT_ID}}).status_code == 200
        # all-at-once: in waves a refused value halts the rollout and rolls it back (issue 27).
        docs = [with_changes(d, rollout={"strategy": "all-at-once"})
                for d in (profile_doc("deep", settings={"nr_requests": 256}), profile_doc())]
        for doc in docs:
            assert client.post(f"{API}/profiles", json=doc).status_code == 201

        def host_status() -> dict[str, Any]:
            return dict(client.get(f"{API}/hosts/rpc-host/status").json())

        def settled() -> tuple[dict[str, Any], dict[str, Any]] | None:
            """(Applied condition, settings table) once both profiles are through an apply."""
            st = host_status()
            applied = next((c for c in st["conditions"] if c["type"] == "Applied"), None)
            table = {d["tunable"]: d for d in st["devices"]}
            done = (st["appliedGenerations"] == {"deep": 1, "streaming": 1}
                    and table.get("read_ahead_kb", {}).get("inSync") and "nr_requests" in table)
            return (applied, table) if done and applied and applied["reason"] == "Rejected" else None

        applied, table = eventually(settled, what="Applied=False Rejected, read_ahead_kb applied")
        assert applied["status"] == "False"
        assert "every other setting is applied" in applied["message"]
        assert "loop7 nr_requests=256 (deep/loops)" in applied["message"]
        assert "Invalid argument (EINVAL)" in applied["message"]
        assert table["nr_requests"]["message"].startswith("rejected: the kernel refused it")
        assert table["nr_requests"]["profile"] == "deep"
        assert host.queue("read_ahead_kb") == "4096" and host.queue("nr_requests") == "128"

        deep = eventually(lambda: (s := client.get(f"{API}/profiles/deep").json()["status"])
                          .get("phase") == "Failed" and s, what="deep's status Failed")
        assert deep["rejectedHosts"] == ["rpc-host"]

        # A dry run of the same documents (stortune apply --dry-run, diff) names it as an error too.
        dry = client.post(f"{API}/plans", json={"profiles": docs, "delete": []})
        assert dry.status_code == 200, dry.text
        planned = dry.json()["plans"]["rpc-host"]
        assert planned["changes"] == []
        assert [(r["tunable"], r["fatal"], r["reason"].startswith(KERNEL_REFUSED))
                for r in planned["rejections"]] == [("nr_requests", True, True)]

        # Later passes look at the host without asking for an apply: the agent would only report the
        # same refusal again (before, every pass applied, and added an Applied event).
        looks, applies = agents.calls["GetObserved"], agents.calls["Apply"]
        eventually(lambda: agents.calls["GetObserved"] >= looks + 3, what="three more looks")
        assert agents.calls["Apply"] == applies

        # A hand change of the other profile's setting is put back; the refused value stays unwritten.
        picky.writes.clear()
        (host.fs.sysfs / "block/loop7/queue/read_ahead_kb").write_text("256")
        eventually(lambda: host.queue("read_ahead_kb") == "4096", what="read_ahead_kb put back")
        assert [w for w in picky.writes if w[1] == "nr_requests"] == []
        assert eventually(settled, what="still Rejected, read_ahead_kb in sync")[1] is not None


# -- as data: deciding on what the agent reported ---------------------------------------------------
REFUSED = f"{KERNEL_REFUSED}write failed: Invalid argument (EINVAL); choose a value this device takes"
REACHABLE = {"Reachable": {"status": "True", "reason": "AgentRegistered", "message": ""}}


def _reported(p: StorageProfile, reason: str = REFUSED) -> HostView:
    """The host after an apply in which read_ahead_kb 4096 was refused, as the agent's plan says."""
    wanted = plan([p], topology(128))
    (want,) = wanted.desired
    refused = Rejection(device=want.device, device_id=want.device_id, tunable=want.tunable,
                        value=want.desired, reason=reason, fatal=True, source=want.source)
    return view((p,), {"streaming": p.metadata.generation or 0}, previous=wanted.holding([refused]),
                conditions=REACHABLE)


def test_hostile_a_value_the_agent_reported_refused_is_not_asked_for_at_every_pass() -> None:
    v = _reported(profile())

    d = decision_for(v, 128)

    assert not d.apply and [(r.tunable, r.reason) for r in d.rejected] == [("read_ahead_kb", REFUSED)]
    assert d.new_drift == ()
    update = conclude(v, seen(topology(128)), d, None)
    assert update.conditions["Applied"][:2] == ("False", "Rejected")
    assert REFUSED in update.conditions["Applied"][2]
    assert update.devices is None  # the table stays as the agent's apply left it


@pytest.mark.parametrize("change", ["another value", "a reboot", "a planned error", "a busy device"])
def test_it_is_asked_for_again_when_the_want_or_the_boot_changed_or_it_was_no_lasting_refusal(
        change: str) -> None:
    v = _reported(profile())
    boot = "boot-1"
    if change == "another value":
        v = replace(v, profiles=(profile(generation=2, read_ahead_kb=2048),))
    elif change == "a reboot":
        boot = "boot-2"
    elif change == "a planned error":  # the device may offer it now: the planner says so
        v = _reported(profile(), "scheduler 'bfq' is not offered by this kernel for this device")
    else:
        v = _reported(profile(), "the write failed: Device or resource busy (EBUSY); tried again")

    d = decision_for(v, 128, boot_id=boot)

    assert d.apply and d.rejected == ()
