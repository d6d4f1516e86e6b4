"""The dashboard in a real browser against a real control plane with real agents.

One `stortune-server` process, 200 hollow hosts (bench/hollow.py: the agent's real service,
registrar and identity per host over fixture trees) and one real in-process agent over a
fixture whose NVMe disk calls itself ``<img src=x onerror=alert(1)>``. Debian's chromium, driven
by Playwright, signs in and looks at every page as an admin, an operator, a viewer and a
support token; each page leaves a screenshot (tests/ui/browser.py says where).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench import fleet
from bench.hollow import host_name
from tests.fixtures.sysfs_builder import PcieLink, Queue, SysfsBuilder
from tests.ui.browser import DESKTOP, PHONE, Watched, artifacts, chromium, undocumented, watch  # noqa: F401

pytestmark = [pytest.mark.slow(seconds=6), pytest.mark.together]

HOSTS = 200
HOSTILE = "<img src=x onerror=alert(1)>"
XSS_HOST = "xss-host"
TIMEOUT_MS = 30_000
HOSTS_SHOWN = "() => document.querySelector('[data-count=hosts] .count-n').textContent === '{n}'"
#: Pages with nothing to write for anyone while the fleet has no runs or experiments.
READ_ONLY_PAGES = ("#/fleet", "#/benchmarks", "#/experiments")


@dataclass
class Plane:
    base: str
    admin: str
    tokens: dict[str, str]
    openapi: dict[str, Any]
    calls: list[tuple[str, str]]

    def call(self, method: str, path: str, body: Any = None, token: str | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(  # noqa: S310 - loopback only
            self.base + path, data=data, method=method,
            headers={"Authorization": f"Bearer {token or self.admin}", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310 - loopback only
            text = answer.read()
        return json.loads(text) if text else None


def hostile_host(root: Path) -> Any:
    """A host whose NVMe disk reports an HTML tag as its model string."""
    b = SysfsBuilder(root, hostname=XSS_HOST)
    pci = b.pci("0000:00:1d.0", "0000:05:00.0", link=PcieLink("8.0 GT/s PCIe", 4))
    b.nvme_namespace(pci, 0, 1, model=HOSTILE, serial="XSS0001", firmware="1.0", wwid="eui.00253800000001",
                     size=2 * 1024 * 2048 * 1024, queue=Queue.nvme())
    return b.finish()


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    from stortune.agent.serve import Agent, ServeOptions

    args = argparse.Namespace(agents="hollow", procs=2, replicas=1, db=None, interval=5.0, heartbeat=None,
                              server_arg=[], keep=False)
    with contextlib.ExitStack() as stack:
        running = fleet.launch(args, HOSTS, stack)
        base = running.urls[0]
        admin = (running.work / "server-0/admin.token").read_text().strip()
        work = tmp_path_factory.mktemp("xss")
        agent = Agent(hostile_host(work / "sys"), work / "state", ServeOptions(
            listen="127.0.0.1:0", server=base, name=XSS_HOST, labels={"zone": "lab"}, workers=2,
            rescan_interval=300, token=(running.work / "server-0/agent-bootstrap.token").read_text().strip()))
        agent.start()
        stack.callback(agent.stop)
        fleet.wait_for("every host registered", lambda: fleet.registered(base) >= HOSTS + 1, 120, 0.5)
        plane = Plane(base, admin, {}, {}, [])
        fleet.wait_for("the hostile host's topology", lambda: _topology(plane) is not None, 60, 0.2)
        for role, hosts in (("operator", None), ("viewer", None), ("support", "zone=lab")):
            scope = {"hostSelector": hosts, "expiresIn": "1h"} if hosts else {}
            body = {"role": role, "name": f"ui-{role}", **scope}
            plane.tokens[role] = plane.call("POST", "/api/v1/tokens", body)["token"]
        plane.call("POST", "/api/v1/profiles", {
            "apiVersion": "stortune/v1", "kind": "StorageProfile", "metadata": {"name": "fleet-loops"},
            "spec": {"hostSelector": {"matchLabels": {"role": "fleet"}}, "mode": "audit",
                     "rules": [{"name": "loops", "match": {"kind": ["loop"]},
                                "settings": {"read_ahead_kb": 256}}]}})
        with urllib.request.urlopen(base + "/openapi.json", timeout=30) as answer:  # noqa: S310
            plane.openapi = json.loads(answer.read())
        yield plane


def _topology(plane: Plane) -> Any:
    try:
        return plane.call("GET", f"/api/v1/hosts/{XSS_HOST}/topology")
    except OSError:
        return None


@pytest.fixture
def browse(chromium: Any, plane: Plane, artifacts: Path) -> Iterator[Any]:  # noqa: F811
    """browse(size=DESKTOP) -> a watched page in a fresh browser context (no cookies)."""
    opened: list[Any] = []

    def make(size: dict[str, int] = DESKTOP) -> Watched:
        context = chromium.new_context(viewport=size)
        context.set_default_timeout(TIMEOUT_MS)
        opened.append(context)
        watched = watch(context, artifacts, plane.base)
        opened.append(watched)
        return watched

    yield make
    for thing in opened:
        if isinstance(thing, Watched):
            plane.calls.extend(thing.api_calls)
        else:
            thing.close()


def count(page: Any, key: str) -> str:
    return str(page.text_content(f'[data-count="{key}"] .count-n'))


def listed(page: Any) -> list[str]:
    page.wait_for_selector('table.hosts[data-loaded="true"]')
    names = page.eval_on_selector_all("tr[data-host]", "rows => rows.map(r => r.dataset.host)")
    return [str(n) for n in names]


def test_sign_in_and_the_fleet_page_lists_200_simulated_hosts_a_page_at_a_time(
        browse: Any, plane: Plane) -> None:
    ui = browse()
    ui.sign_in(plane.admin)
    page = ui.page
    page.wait_for_function(HOSTS_SHOWN.format(n=HOSTS + 1))
    # the token went to the server once and is nowhere a script can read it
    held = page.evaluate("() => [document.cookie, JSON.stringify(localStorage),"
                         " JSON.stringify(sessionStorage), document.documentElement.outerHTML].join(' ')")
    assert plane.admin not in held and "stortune_session" not in held
    ui.go("#/fleet?limit=100")
    seen: list[str] = []
    for _ in range(3):
        page.wait_for_function("() => document.querySelectorAll('tr[data-host]').length > 0")
        seen += listed(page)
        if page.is_disabled("text=Next →"):
            break
        first = seen[-len(listed(page))]
        page.click("text=Next →")
        page.wait_for_function(f"() => !document.querySelector('tr[data-host=\"{first}\"]')")
    assert {host_name(i) for i in range(HOSTS)} <= set(seen)
    assert len(seen) == len(set(seen)) == HOSTS + 1
    ui.shot("fleet-desktop")
    ui.clean()


def test_the_fleet_filters_by_label_selector_and_by_condition(browse: Any, plane: Plane) -> None:
    ui = browse()
    ui.sign_in(plane.admin)
    ui.page.fill("input[name=selector]", "zone=lab")
    ui.page.click("text=Filter")
    ui.page.wait_for_function(HOSTS_SHOWN.format(n=1))
    assert listed(ui.page) == [XSS_HOST]
    ui.go("#/fleet?selector=role%3Dfleet&condition=Reachable%3DFalse")
    ui.page.wait_for_selector("text=No host matches.")
    assert count(ui.page, "hosts") == "200"
    ui.shot("fleet-filtered")
    ui.clean()


def test_a_host_whose_disk_model_is_html_shows_that_text_and_runs_nothing(browse: Any, plane: Plane) -> None:
    ui = browse()
    ui.sign_in(plane.admin)
    ui.go(f"#/hosts/{XSS_HOST}")
    model = ui.page.wait_for_selector(".tree .model")
    assert model.text_content() == HOSTILE
    assert ui.page.evaluate("() => document.querySelectorAll('img').length") == 0
    assert ui.page.is_visible("text=nvme0n1")
    ui.page.wait_for_selector("#events .timeline li, #events p")
    ui.shot("host-xss")
    ui.clean()


def test_a_viewer_sees_no_write_controls_on_any_page(browse: Any, plane: Plane) -> None:
    for role, writes in (("viewer", False), ("operator", True)):
        ui = browse()
        ui.sign_in(plane.tokens[role])
        for fragment, ready in (("#/fleet", 'table.hosts[data-loaded="true"]'),
                                (f"#/hosts/{host_name(3)}", "#settings table.settings"),  # no placeholder
                                ("#/profiles", "text=fleet-loops"),
                                ("#/profiles/fleet-loops", "[data-testid=yaml]"),
                                ("#/benchmarks", "text=No runs yet."),
                                ("#/experiments", "text=No experiments yet.")):
            ui.go(fragment)
            ui.page.wait_for_selector(ready)
            controls = ui.page.locator("[data-write]").count()
            assert (controls > 0) == writes or fragment in READ_ONLY_PAGES, (role, fragment)
            if not writes:
                assert controls == 0, fragment
                for label in ("Edit", "New profile", "Set label", "Delete…"):
                    assert ui.page.get_by_text(label, exact=True).count() == 0, (fragment, label)
            ui.shot(f"{role}-{fragment.strip('#/').replace('/', '-')}")
        ui.clean()


def test_a_support_token_sees_only_its_hosts(browse: Any, plane: Plane) -> None:
    ui = browse()
    ui.sign_in(plane.tokens["support"])
    ui.page.wait_for_function(HOSTS_SHOWN.format(n=1))
    assert listed(ui.page) == [XSS_HOST]
    ui.go(f"#/hosts/{host_name(0)}")
    ui.page.wait_for_selector(".error >> text=not found")
    ui.shot("support-other-host")
    ui.go(f"#/hosts/{XSS_HOST}")
    ui.page.wait_for_selector(".tree .model")
    assert ui.page.locator("text=Download diagnostics").count() == 1  # support may download its hosts'
    ui.shot("support-host")


def test_profile_editing_shows_schema_and_server_errors_at_their_lines_then_the_dry_run_plan(
        browse: Any, plane: Plane) -> None:
    ui = browse()
    ui.sign_in(plane.tokens["operator"])
    ui.go("#/profiles/_new")
    editor = ui.page.wait_for_selector("textarea")
    broken = ("apiVersion: stortune/v1\nkind: StorageProfile\nmetadata:\n  name: ui-edit\nspec:\n"
              "  hostSelector: {matchLabels: {role: fleet}}\n  mode: sometimes\n  rules:\n"
              "    - name: loops\n      match: {kind: [loop]}\n      settings: {read_ahead_kb: 4096}\n")
    editor.fill(broken)
    problem = ui.page.wait_for_selector("[data-testid=problems] li")
    assert problem.get_attribute("data-line") == "7" and "mode" in str(problem.get_attribute("data-field"))
    assert ui.page.locator(".gutter .bad-line").text_content() == "7\n"
    ui.shot("profile-editor-schema-error")
    # the schema cannot tell a pattern RE2 cannot run: the server's 422 names the field, shown at its line
    unrunnable = 'match: {kind: [loop], model: "(unclosed"}'
    editor.fill(broken.replace("sometimes", "audit").replace("match: {kind: [loop]}", unrunnable))
    ui.page.wait_for_selector("text=The document is valid")
    ui.page.click("text=Plan (dry run)")
    server = ui.page.wait_for_selector("[data-testid=problems] li")
    assert server.get_attribute("data-line") == "10", server.text_content()
    assert "spec.rules[0].match.model" in str(server.get_attribute("data-field"))
    ui.shot("profile-editor-server-error")
    editor.fill(broken.replace("sometimes", "audit"))
    ui.page.click("text=Plan (dry run)")
    ui.page.wait_for_selector("[data-testid=plans] .plan")
    assert ui.page.locator("[data-testid=plans] .plan").count() == HOSTS
    ui.shot("profile-dry-run")
    ui.clean()


def test_readable_at_phone_width_with_nothing_wider_than_the_screen(browse: Any, plane: Plane) -> None:
    ui = browse(PHONE)
    ui.sign_in(plane.admin)
    listed(ui.page)
    # the table scrolls inside its box; the page itself does not
    assert ui.page.evaluate("() => document.documentElement.scrollWidth") <= PHONE["width"]
    ui.shot("fleet-phone")
    ui.go(f"#/hosts/{XSS_HOST}")
    ui.page.wait_for_selector(".tree .model")
    assert ui.page.evaluate("() => document.documentElement.scrollWidth") <= PHONE["width"]
    ui.shot("host-phone")


def test_keyboard_alone_reaches_a_host_page(browse: Any, plane: Plane) -> None:
    ui = browse()
    ui.sign_in(plane.admin)
    listed(ui.page)
    target = host_name(0)
    for _ in range(60):
        ui.page.keyboard.press("Tab")
        if ui.page.evaluate("() => document.activeElement.textContent") == target:
            break
    ui.page.keyboard.press("Enter")
    ui.page.wait_for_selector(f"h1 >> text={target}")


def test_live_updates_without_reload_and_no_layout_shift(browse: Any, plane: Plane) -> None:
    ui = browse()
    ui.sign_in(plane.admin)
    listed(ui.page)
    ui.page.evaluate("""() => { window.__shift = 0; new PerformanceObserver(l => {
        for (const e of l.getEntries()) if (!e.hadRecentInput) window.__shift += e.value
    }).observe({type: 'layout-shift', buffered: false}); }""")
    before = ui.page.evaluate("() => performance.getEntriesByType('navigation').length")
    plane.call("PATCH", f"/api/v1/hosts/{host_name(1)}/labels", {"labels": {"ui-live": "yes"}})
    ui.page.wait_for_selector(f'tr[data-host="{host_name(1)}"] >> text=ui-live=yes', timeout=TIMEOUT_MS)
    assert ui.page.evaluate("() => performance.getEntriesByType('navigation').length") == before
    assert ui.page.evaluate("() => window.__shift") < 0.01


ROLLOUT = "ui-rollout"


def rollout_of(plane: Plane, name: str) -> Any:
    try:
        return plane.call("GET", f"/api/v1/profiles/{name}/rollout")
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise


def test_a_profile_shows_its_rollout_an_operator_pauses_it_and_a_viewer_sees_no_buttons(
        browse: Any, plane: Plane) -> None:
    # A canary of one host, then the other 199 after an hour's soak: the rollout stays open.
    plane.call("POST", "/api/v1/profiles", {
        "apiVersion": "stortune/v1", "kind": "StorageProfile", "metadata": {"name": ROLLOUT},
        "spec": {"hostSelector": {"matchLabels": {"role": "fleet"}}, "priority": 200,
                 "rules": [{"name": "loops", "match": {"kind": ["loop"]},
                            "settings": {"read_ahead_kb": 512}}],
                 "rollout": {"waves": [{"hosts": 1}, {"percent": 100}], "soak": "1h"}}})
    fleet.wait_for("the rollout", lambda: rollout_of(plane, ROLLOUT), 60, 0.2)
    assert [w["hosts"] for w in rollout_of(plane, ROLLOUT)["waves"]] == [1, HOSTS - 1]

    ui = browse()
    ui.sign_in(plane.tokens["operator"])
    ui.go(f"#/profiles/{ROLLOUT}")
    page = ui.page
    page.wait_for_selector("[data-testid=rollout][data-phase=Progressing]")
    rows = page.locator("table.waves tr[data-wave]")
    assert rows.count() == 2
    assert rows.nth(0).get_attribute("aria-current") == "step"  # the open wave
    assert page.text_content('tr[data-wave="2"] td:nth-child(2)') == str(HOSTS - 1)
    assert page.text_content('tr[data-wave="2"] td[data-stage="pending"]') == str(HOSTS - 1)
    assert page.locator("[data-testid=rollout-actions] button").all_text_contents() == ["Pause", "Undo…"]
    ui.shot("rollout-progressing")

    page.click("[data-testid=rollout-actions] >> text=Pause")
    page.wait_for_selector("[data-testid=rollout][data-phase=Paused]")
    assert rollout_of(plane, ROLLOUT)["phase"] == "Paused"
    assert page.locator("[data-testid=rollout-actions] button").all_text_contents() == ["Resume", "Undo…"]
    # Undo asks first; keeping it sends nothing
    page.click("text=Undo…")
    dialog = page.wait_for_selector("[role=dialog][aria-label='Confirm undo']")
    assert "generation 0" in str(dialog.text_content())  # the profile held nothing before
    page.click("[role=dialog] >> text=Keep it")
    assert page.locator("[role=dialog]").count() == 0
    assert ("POST", f"/api/v1/profiles/{ROLLOUT}/rollout/undo") not in ui.api_calls
    assert ("POST", f"/api/v1/profiles/{ROLLOUT}/rollout/pause") in ui.api_calls
    ui.shot("rollout-paused")
    ui.clean()

    viewer = browse()
    viewer.sign_in(plane.tokens["viewer"])
    viewer.go(f"#/profiles/{ROLLOUT}")
    viewer.page.wait_for_selector("[data-testid=rollout][data-phase=Paused]")
    assert viewer.page.locator("table.waves tr[data-wave]").count() == 2
    assert viewer.page.locator("[data-write]").count() == 0
    for label in ("Pause", "Resume", "Undo…"):
        assert viewer.page.get_by_role("button", name=label, exact=True).count() == 0, label
    viewer.shot("rollout-viewer")
    viewer.clean()


REFUSED = "ui-refused"
#: Hollow hosts have no disks to benchmark: the analysis list is added to the server's own answer.
ANALYSIS = [
    {"host": host_name(5), "before": "run-before-1", "after": "run-after-1", "verdict": "failed",
     "reused": False, "objectives": [{"metric": "read_iops", "changePct": -18.5}], "reason": HOSTILE,
     "context": []},
    {"host": HOSTILE, "before": "run-before-2", "after": None, "verdict": None, "reused": True,
     "objectives": [], "reason": None, "context": []},
]


def test_a_halted_rollout_shows_its_failed_hosts_why_and_the_analysis_with_links_to_the_runs(
        browse: Any, plane: Plane) -> None:
    # a scheduler no loop device offers: the canary refuses it, one failure is past maxFailures 0
    plane.call("POST", "/api/v1/profiles", {
        "apiVersion": "stortune/v1", "kind": "StorageProfile", "metadata": {"name": REFUSED},
        "spec": {"hostSelector": {"matchLabels": {"role": "fleet"}},
                 "rules": [{"name": "loops", "match": {"kind": ["loop"]},
                            "settings": {"scheduler": "bfq-turbo"}}],
                 "rollout": {"waves": [{"hosts": 1}, {"percent": 100}]}}})
    fleet.wait_for("the halt", lambda: (rollout_of(plane, REFUSED) or {}).get("phase") == "Halted", 90, 0.2)
    halted = rollout_of(plane, REFUSED)
    assert halted["reason"] == "FailureLimit"
    (canary,) = [h["name"] for h in halted["hosts"] if h["stage"] == "failed" or h["failure"]]

    ui = browse()

    def with_analysis(route: Any) -> None:
        answer = route.fetch()
        body = answer.json()
        body["analysis"] = ANALYSIS
        route.fulfill(response=answer, json=body)

    ui.page.route(f"**/api/v1/profiles/{REFUSED}/rollout", with_analysis)
    ui.sign_in(plane.tokens["operator"])
    ui.go(f"#/profiles/{REFUSED}")
    page = ui.page
    page.wait_for_selector("[data-testid=rollout][data-phase=Halted]")
    assert page.text_content("[data-testid=rollout-reason]") == "FailureLimit"
    failed = page.wait_for_selector(f'[data-testid=failed-hosts] li[data-host="{canary}"]')
    assert "blocked" in str(failed.text_content()), failed.text_content()
    assert page.get_attribute(f'[data-testid=failed-hosts] a[href="#/hosts/{canary}"]', "href")
    table = page.wait_for_selector("[data-testid=analysis]")
    assert page.locator('[data-testid=analysis] a[href="#/benchmarks/run-before-1"]').count() == 1
    assert page.locator('[data-testid=analysis] a[href="#/benchmarks/run-after-1"]').count() == 1
    assert page.locator('[data-testid=analysis] a[href="#/compare/run-before-1/run-after-1"]').count() == 1
    text = str(table.text_content())
    assert "failed" in text and "read_iops" in text and "waiting" in text and "(reused)" in text
    assert HOSTILE in text  # shown as text, run as nothing
    assert page.evaluate("() => document.querySelectorAll('img').length") == 0
    # rolled back: neither resume nor undo moves the hosts again, a new generation does
    assert page.locator("[data-testid=rollout-actions] button").count() == 0
    assert page.is_visible("[data-testid=rolled-back]")
    ui.shot("rollout-halted")
    ui.clean()
    # what the alert StortuneRolloutHalted reads, from the same server
    scrape = urllib.request.Request(  # noqa: S310 - loopback only
        plane.base + "/metrics", headers={"Authorization": f"Bearer {plane.admin}"})
    with urllib.request.urlopen(scrape, timeout=30) as answer:  # noqa: S310 - loopback only
        scraped = answer.read().decode()
    assert f'stortune_rollout_halted{{profile="{REFUSED}"}} 1' in scraped
    assert f'stortune_rollout_info{{profile="{REFUSED}",phase="Halted",reason="FailureLimit"}} 1' in scraped


def test_the_page_called_only_the_public_api(plane: Plane) -> None:
    """Every call the pages made above is a documented operation of /openapi.json."""
    assert len(plane.calls) > 20
    assert undocumented(plane.calls, plane.openapi) == []
