"""Debian's chromium driven by Playwright for Python, for the dashboard's browser tests.

Never `playwright install`: the system browser at /usr/bin/chromium, headless, with the
network closed to everything but loopback (a proxy that does not exist for the rest), so a
page that reached for a CDN would fail here. Each test's page records what would betray a
problem: dialogs (an injected script's alert), console errors, Content-Security-Policy
violations and every API call the page made (the public API only). Screenshots go to
$STORTUNE_UI_ARTIFACTS (default: a directory of the test session's tmp dir), named in the
test output.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run",
        "--proxy-server=http://127.0.0.1:9", "--proxy-bypass-list=<-loopback>;127.*"]
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}

def playwright_or_skip() -> Any:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:  # pragma: no cover - a dev install has it
        pytest.skip("playwright is not installed (pip install -e '.[dev]')")
    return sync_playwright


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = Path(os.environ.get("STORTUNE_UI_ARTIFACTS") or tmp_path_factory.mktemp("ui-artifacts"))
    where.mkdir(parents=True, exist_ok=True)
    print(f"\ndashboard screenshots: {where}")
    return where


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """One browser for a module's tests; each test opens a context (cookies) of its own."""
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed (./dev test installs it)")
    with playwright_or_skip()() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser
        browser.close()


@dataclass
class Watched:
    """A page with what it did recorded."""

    page: Any
    artifacts: Path
    base: str
    dialogs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    api_calls: list[tuple[str, str]] = field(default_factory=list)

    def open(self, fragment: str = "") -> None:
        self.page.goto(f"{self.base}/ui/{fragment}")

    def go(self, fragment: str) -> None:
        """Another page of the dashboard without a reload (the fragment changes)."""
        self.page.evaluate("f => { location.hash = f }", fragment)

    def shot(self, name: str) -> Path:
        path = self.artifacts / f"{re.sub(r'[^a-z0-9-]+', '-', name.lower())}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def sign_in(self, token: str) -> None:
        self.open()
        self.page.fill("#token", token)
        self.page.click("button[type=submit]")
        self.page.wait_for_selector("header.top .who")

    def clean(self) -> None:
        """No dialog opened, nothing failed in the console, no policy was violated."""
        assert self.dialogs == [], self.dialogs
        assert self.errors == [], self.errors


def watch(context: Any, artifacts: Path, base: str, size: dict[str, int] | None = None) -> Watched:
    page = context.new_page()
    if size:
        page.set_viewport_size(size)
    watched = Watched(page, artifacts, base)

    def on_dialog(dialog: Any) -> None:
        watched.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    def on_console(message: Any) -> None:
        # An API answer the page shows as an error (a 404 asked for on purpose) is the page's
        # business; what is not: script errors and policy violations.
        if message.type == "error" and "Failed to load resource" not in message.text:
            watched.errors.append(message.text)

    def on_request(request: Any) -> None:
        path = request.url.split("?", 1)[0].removeprefix(base)
        if path.startswith("/api/"):
            watched.api_calls.append((request.method, path))

    page.on("dialog", on_dialog)
    page.on("console", on_console)
    page.on("pageerror", lambda exc: watched.errors.append(f"page error: {exc}"))
    page.on("request", on_request)
    # CSP violations are reported to the page as events: turn them into console errors.
    page.add_init_script("document.addEventListener('securitypolicyviolation', e =>"
                         " console.error('CSP violation: ' + e.violatedDirective + ' ' + e.blockedURI))")
    return watched


def undocumented(calls: list[tuple[str, str]], openapi: dict[str, Any]) -> list[tuple[str, str]]:
    """The calls whose method and path the API's description does not name ({x}: one segment)."""
    methods = {(p, m.upper()) for p, item in openapi["paths"].items() for m in item}
    out = []
    for method, path in calls:
        documented = [p for p in openapi["paths"] if re.fullmatch(re.sub(r"\{[^}]+\}", "[^/]+", p), path)]
        if not documented or not any((p, method) in methods for p in documented):
            out.append((method, path))
    return out
