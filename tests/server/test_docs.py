"""/docs and /redoc work on a machine without internet: every asset comes from the control plane.

The pages used to load Swagger UI from a CDN and were blank offline. Checked three ways: the
HTML references nothing outside the control plane and every asset it references is served; the
asset route serves those names only; and Debian's headless Chromium, with every address but
loopback behind a proxy that does not exist, renders every operation and asks nothing else.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from stortune.server import RecordingController, Settings, create_app
from stortune.server.api.docs import ASSETS, CONTENT_SECURITY_POLICY
from tests.cli.conftest import ControlPlane, serve

PAGES = ("/docs", "/redoc")
#: Where an HTML page names what the browser will load.
_REFERENCES = re.compile(r"""(?:src|href|spec-url)=["']([^"']+)["']|\burl:\s*['"]([^'"]+)['"]""")


@pytest.fixture
def app(tmp_path: Path) -> FastAPI:
    return create_app(Settings(db_url=f"sqlite:///{tmp_path / 'docs.db'}"), controller=RecordingController())


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as test_client:
        yield test_client


def references(page: str) -> list[str]:
    return [a or b for a, b in _REFERENCES.findall(page)]


@pytest.mark.parametrize("page", PAGES)
def test_the_page_references_only_the_control_plane(client: TestClient, page: str) -> None:
    answer = client.get(page)  # no token: the API's description is public
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/html")
    assert answer.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    found = references(answer.text)
    assert "/openapi.json" in found and any(f.startswith("/docs/assets/") for f in found)
    external = [r for r in found if urlsplit(r).scheme or urlsplit(r).netloc or r.startswith("//")]
    assert external == []
    assert not re.search(r"https?://|cdn\.|googleapis", answer.text)


@pytest.mark.parametrize("page", PAGES)
def test_every_asset_a_page_references_is_served(client: TestClient, page: str) -> None:
    for ref in references(client.get(page).text):
        served = client.get(ref)
        assert served.status_code == 200, ref
        assert served.content, ref
        if ref.startswith("/docs/assets/"):
            name = ref.rsplit("/", 1)[1]
            assert served.headers["content-type"] == ASSETS[name], ref
    bundle = client.get("/docs/assets/swagger-ui-bundle.js").text
    assert "SwaggerUIBundle" in bundle
    assert client.get("/openapi.json").json()["openapi"].startswith("3.1")  # what Swagger UI 5 renders


@pytest.mark.parametrize("path", [
    "/docs/assets/../../pyproject.toml",
    "/docs/assets/..%2f..%2fpyproject.toml",
    "/docs/assets/%2e%2e/%2e%2e/etc/passwd",
    "/docs/assets/swagger-ui-bundle.js.map",  # a file of the package, but not one the pages use
    "/docs/assets/__init__.py",
    "/docs/assets/",
    "/docs/assets/favicon.png%00.py",
])
def test_hostile_asset_names_are_404(client: TestClient, path: str) -> None:
    answer = client.get(path)
    assert answer.status_code == 404, path
    assert b"[build-system]" not in answer.content and b"root:" not in answer.content


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/docs"), ("GET", "/redoc"), ("HEAD", "/docs"), ("POST", "/redoc"), ("GET", "/docs/"),
    ("GET", "/redoc/"), ("GET", "/docs/assets/swagger-ui.css"), ("GET", "/docs/assets/nope.js"),
    ("GET", "/docs/oauth2-redirect")])
def test_hostile_every_answer_of_the_docs_refuses_framing(client: TestClient, method: str, path: str) -> None:
    """A page of another site framing /docs (clickjacking) is refused by the browser on every
    answer the docs make, their errors and redirects included, and nothing is type-sniffed."""
    answer = client.request(method, path, follow_redirects=False)
    assert answer.headers.get("content-security-policy") == CONTENT_SECURITY_POLICY, (method, path)
    assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]
    assert answer.headers.get("x-frame-options") == "DENY"
    assert answer.headers.get("x-content-type-options") == "nosniff"


def test_the_dashboard_and_the_api_keep_their_own_headers(client: TestClient) -> None:
    assert "x-frame-options" not in client.get("/openapi.json").headers
    assert client.get("/ui/").headers["content-security-policy"] != CONTENT_SECURITY_POLICY


def test_behind_a_path_prefix_the_references_carry_it(app: FastAPI) -> None:
    with TestClient(app, root_path="/stortune") as prefixed:
        page = prefixed.get("/docs").text
    found = references(page)
    assert "/stortune/openapi.json" in found and "/stortune/docs/assets/swagger-ui-bundle.js" in found


# -- a real browser, offline -------------------------------------------------------------------------
CHROMIUM = shutil.which("chromium")


def render(url: str, profile: Path) -> tuple[str, list[tuple[str, str]]]:
    """Chromium's DOM of ``url`` once its scripts ran, and the (initiator, url) of every request
    the page made. Everything but loopback goes to a proxy on a port nothing listens on: the
    network is closed to the page."""
    netlog = profile / "netlog.json"
    done = subprocess.run(
        [CHROMIUM or "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile / 'user-data'}", "--proxy-server=http://127.0.0.1:9",
         f"--log-net-log={netlog}", "--virtual-time-budget=30000", "--dump-dom", url],
        capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    events = json.loads(netlog.read_text(errors="replace"))["events"]
    asked = {(str(e["params"].get("initiator")), str(e["params"]["url"])) for e in events
             if isinstance(e.get("params"), dict) and "url" in e["params"] and "initiator" in e["params"]}
    return done.stdout, sorted(asked)


@pytest.fixture
def served(app: FastAPI) -> Iterator[ControlPlane]:
    yield from serve(app)


@pytest.mark.slow(seconds=7)
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (./dev installs it)")
@pytest.mark.parametrize("page", PAGES)
def test_chromium_renders_every_operation_with_the_network_closed(
        served: ControlPlane, app: FastAPI, page: str, tmp_path: Path) -> None:
    operations = [(method.upper(), path) for path, item in app.openapi()["paths"].items() for method in item]
    dom, asked = render(served.url + page, tmp_path)
    if page == "/docs":
        shown = re.findall(r'class="opblock opblock-(\w+)[^"]*".*?data-path="([^"]+)"', dom)
        assert sorted((m.upper(), p) for m, p in shown) == sorted(operations)
    else:
        anchors = set(re.findall(r'id="(operation/[^"]+)"', dom))
        assert len(anchors) == len(operations)
    # what the page asked for (its initiator is the page's origin): the control plane only;
    # the browser's own update and account checks carry no page origin and are not the page's
    origin = served.url
    from_page = [u for who, u in asked if who == origin]
    assert f"{origin}/openapi.json" in from_page
    assert [u for u in from_page if not u.startswith(origin + "/")] == []
