"""/ui/ serves the dashboard's page and built assets: hostile paths first, then what is served.

Every response under /ui, errors included, carries the Content-Security-Policy (no inline
script or style, nothing from another origin, no framing), nosniff and no-referrer; only the
names read from the wheel at start are served, so no path, encoded or not, reaches the disk.
"""

from __future__ import annotations

import gzip
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from fastapi import FastAPI

from stortune.server import RecordingController, Settings, create_app, ui
from tests.server.support import TestClient

WEB = Path(ui.__file__).parent / "web"
ASSETS = sorted(p.name for p in ui.ASSET_DIR.iterdir() if p.name != ui.INDEX)


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FastAPI]:
    built = create_app(Settings(db_url=f"sqlite:///{tmp_path_factory.mktemp('ui') / 'ui.db'}"),
                       controller=RecordingController())
    yield built
    built.state.engine.dispose()


@pytest.fixture(scope="module")
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as test_client:
        yield test_client


def assert_secured(answer: object) -> None:
    headers = answer.headers  # type: ignore[attr-defined]
    assert headers["content-security-policy"] == ui.CONTENT_SECURITY_POLICY
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["referrer-policy"] == "no-referrer"
    assert headers["x-frame-options"] == "DENY"


def test_the_policy_allows_no_inline_script_or_style_nor_other_origins_nor_framing() -> None:
    directives = dict(d.strip().split(" ", 1) for d in ui.CONTENT_SECURITY_POLICY.split(";"))
    assert directives["default-src"] == "'self'" and directives["frame-ancestors"] == "'none'"
    for name in ("script-src", "style-src"):
        assert directives[name] == "'self'"
    assert "unsafe" not in ui.CONTENT_SECURITY_POLICY and "*" not in ui.CONTENT_SECURITY_POLICY


@pytest.mark.parametrize("path", [
    "/ui/../pyproject.toml",
    "/ui/..%2f..%2fpyproject.toml",
    "/ui/%2e%2e/%2e%2e/etc/passwd",
    "/ui/assets/../__init__.py",
    "/ui/assets/..%2f__init__.py",
    "/ui/assets/%2e%2e%2f%2e%2e%2fsettings.py",
    "/ui/assets/..%252f__init__.py",
    "/ui/assets/index.html%00.js",
    "/ui/assets/",
    "/ui/assets/.",
    "/ui/assets//etc/passwd",
    "/ui/web/package.json",
    "/ui/web/build.mjs",
    "/ui/assets/nope.js",
    "/ui/assets/" + "a" * 5000 + ".js",
    "/ui/index.html",
    "/ui/src/main.jsx",
])
def test_path_traversal_and_unknown_assets_are_404_with_the_policy(client: TestClient, path: str) -> None:
    answer = client.get(path)
    assert answer.status_code == 404, path
    assert b"[build-system]" not in answer.content and b"root:" not in answer.content
    assert b"import " not in answer.content and b"def " not in answer.content
    if answer.request.url.path.startswith("/ui"):  # the client may fold /ui/.. away itself
        assert_secured(answer)


def test_path_traversal_a_link_among_the_assets_is_never_served(tmp_path: Path) -> None:
    (tmp_path / ui.INDEX).write_text("<!DOCTYPE html><title>t</title>")
    (tmp_path / "secret.js").symlink_to("/etc/passwd")
    (tmp_path / "page.js").symlink_to(tmp_path / ui.INDEX)
    (tmp_path / "app.py").write_text("print('source')")  # not an asset type
    app = FastAPI()
    ui.install(app, tmp_path)
    with TestClient(app) as local:
        for name in ("secret.js", "page.js", "app.py"):
            answer = local.get(f"/ui/assets/{name}")
            assert answer.status_code == 404 and b"root:" not in answer.content, name
            assert_secured(answer)


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/ui"), ("GET", "/ui/"), ("POST", "/ui/"), ("DELETE", "/ui/assets/" + ASSETS[0]),
    ("GET", "/ui/nope"), *(("GET", f"/ui/assets/{name}") for name in ASSETS),
])
def test_csp_header_present_on_every_ui_response(client: TestClient, method: str, path: str) -> None:
    answer = client.request(method, path, follow_redirects=False)
    assert answer.status_code < 500
    assert_secured(answer)


def test_csp_header_present_on_not_modified_answers(client: TestClient) -> None:
    first = client.get("/ui/")
    again = client.get("/ui/", headers={"If-None-Match": first.headers["etag"]})
    assert again.status_code == 304
    assert_secured(again)


@pytest.mark.parametrize("query", [
    "x=" + "A" * 16_000,
    "%ff%fe%00=%00",
    "a=1&" * 2000,
    "<script>alert(1)</script>",
    "redirect=https://evil.example",
])
def test_huge_and_odd_query_strings_change_nothing(client: TestClient, query: str) -> None:
    page = client.get(f"/ui/?{query}")
    assert page.status_code == 200 and "<script>alert" not in page.text and "evil" not in page.text
    assert_secured(page)
    asset = client.get(f"/ui/assets/{ASSETS[0]}?{query}")
    assert asset.status_code == 200


def test_ui_without_slash_redirects_to_the_page(client: TestClient) -> None:
    answer = client.get("/ui", follow_redirects=False)
    assert answer.status_code == 308 and answer.headers["location"] == "/ui/"


def references(page: str) -> list[str]:
    return re.findall(r"""(?:src|href)=["']([^"']+)["']""", page)


def test_the_page_loads_only_its_own_assets_with_no_inline_script_or_style(client: TestClient) -> None:
    page = client.get("/ui/")
    assert page.headers["cache-control"] == "no-cache"
    found = references(page.text)
    assert found and all(r.startswith("assets/") for r in found)
    assert not any(urlsplit(r).scheme or urlsplit(r).netloc for r in found)
    # every <script> has a src and no body; no <style> element or style attribute
    assert re.findall(r"<script(?![^>]*\bsrc=)[^>]*>", page.text) == []
    assert "<style" not in page.text and "style=" not in page.text and "javascript:" not in page.text
    for ref in found:
        asset = client.get(f"/ui/{ref}", headers={"Accept-Encoding": "gzip"})
        assert asset.status_code == 200 and asset.headers["cache-control"].endswith("immutable")
        assert asset.headers["content-type"].startswith(("text/javascript", "text/css"))


def test_assets_are_served_gzipped_to_clients_that_accept_it(client: TestClient) -> None:
    name = next(n for n in ASSETS if n.endswith(".js"))
    plain = client.get(f"/ui/assets/{name}", headers={"Accept-Encoding": "identity"})
    raw = client.get(f"/ui/assets/{name}", headers={"Accept-Encoding": "gzip"}, extensions={})
    assert plain.headers.get("content-encoding") is None
    assert raw.headers["content-encoding"] == "gzip" and raw.headers["vary"] == "Accept-Encoding"
    assert raw.content == plain.content  # the client decoded it
    assert len(gzip.compress(plain.content)) < len(plain.content)


def test_the_sources_never_write_html_or_evaluate_text() -> None:
    """Values from hosts are text children (JSX escapes them); nothing builds HTML or code."""
    forbidden = re.compile(r"dangerouslySetInnerHTML|innerHTML|outerHTML|insertAdjacentHTML|document\.write"
                           r"|\beval\(|new Function|setAttribute\(\s*['\"]style")
    offenders = [f"{path.name}: {m.group(0)}" for path in sorted((WEB / "src").rglob("*.js*"))
                 for m in forbidden.finditer(path.read_text())]
    assert offenders == []


def test_the_sources_call_only_the_public_api_under_its_prefix() -> None:
    calls = set()
    for path in (WEB / "src").rglob("*.jsx"):
        calls |= set(re.findall(r"""\bapi(?:Url)?\(\s*[`'"]([a-z/]+)""", path.read_text()))
    assert calls, "no API calls found: the pattern is out of date"
    assert all(not c.startswith(("/", "..", "internal", "private")) for c in calls), calls


NODE = shutil.which("node")


@pytest.mark.skipif(NODE is None or not (WEB / "node_modules").is_dir(),
                    reason="Node or the dashboard's packages are missing (./dev test installs them: npm ci)")
def test_the_committed_assets_are_what_the_sources_build_to() -> None:
    done = subprocess.run([NODE or "node", "build.mjs", "--check"], cwd=WEB, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr + done.stdout
