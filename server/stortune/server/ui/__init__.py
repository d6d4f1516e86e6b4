"""The dashboard under /ui/: a page and its built assets, served from the wheel.

The page is a client of the public REST API and nothing else (docs/dashboard.md): it signs
in with a token through ``POST /api/v1/session`` (api/routes/sessions.py) and from then on
calls the API with the session cookie. What is served here needs no token: the page
and its scripts hold no data.

The assets are what ``web/build.mjs`` wrote into ``assets/`` (``./dev`` runs it; a test
checks the committed files are what the sources build to). They are read once at start,
into memory, gzip-compressed once, and served only by their exact names: nothing a request
says reaches the file system, so there is no path to traverse. Every /ui response, a 404
included, carries a Content-Security-Policy that allows scripts, styles and connections
from this origin only (no inline script or style, no framing).
"""

from __future__ import annotations

import gzip
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response

from stortune.server.api.handlers import error_response
from stortune.server.api.headers import PathHeaders
from stortune.server.errors import NotFound

UI_URL: Final = "/ui"
ASSET_DIR: Final = Path(__file__).parent / "assets"
INDEX: Final = "index.html"
_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_MEDIA_TYPES: Final = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
                       ".html": "text/html; charset=utf-8", ".svg": "image/svg+xml",
                       ".json": "application/json"}

CONTENT_SECURITY_POLICY: Final = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; font-src 'self'; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
#: On every /ui response.
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
}
#: Asset names carry their content's hash (build.mjs): a browser may keep them for good.
_IMMUTABLE: Final = "public, max-age=31536000, immutable"


@dataclass(frozen=True)
class Asset:
    body: bytes
    gzipped: bytes
    media_type: str
    etag: str

    @classmethod
    def of(cls, body: bytes, media_type: str) -> Asset:
        return cls(body, gzip.compress(body, compresslevel=9, mtime=0), media_type,
                   '"' + hashlib.sha256(body).hexdigest()[:32] + '"')

    def response(self, request: Request, cache_control: str) -> Response:
        headers = {"ETag": self.etag, "Cache-Control": cache_control, "Vary": "Accept-Encoding"}
        if self.etag in request.headers.get("if-none-match", ""):
            return Response(status_code=304, headers=headers)
        if "gzip" in request.headers.get("accept-encoding", ""):
            return Response(self.gzipped, media_type=self.media_type,
                            headers={**headers, "Content-Encoding": "gzip"})
        return Response(self.body, media_type=self.media_type, headers=headers)


def load_assets(directory: Path = ASSET_DIR) -> dict[str, Asset]:
    """Every built file by name (plain files of known types only; links are not followed)."""
    if not (directory / INDEX).is_file():  # a broken install: say so at start, not as a blank page
        raise RuntimeError(f"the dashboard's page is missing from {directory}: reinstall stortune, or "
                           "in a checkout run ./dev up (it builds the dashboard)")
    found = {}
    for path in sorted(directory.iterdir()):
        media_type = _MEDIA_TYPES.get(path.suffix)
        if media_type and _NAME.fullmatch(path.name) and path.is_file() and not path.is_symlink():
            found[path.name] = Asset.of(path.read_bytes(), media_type)
    return found


def install(app: FastAPI, directory: Path = ASSET_DIR) -> None:
    """Serve the dashboard at /ui/ (the page) and /ui/assets/NAME (its built files)."""
    assets = load_assets(directory)
    page = assets.pop(INDEX)

    @app.get(UI_URL, include_in_schema=False)
    def ui_root(request: Request) -> RedirectResponse:
        return RedirectResponse(request.scope.get("root_path", "") + UI_URL + "/", status_code=308)

    @app.get(UI_URL + "/", include_in_schema=False)
    def ui_page(request: Request) -> Response:
        # Revalidated every time: it names the current assets.
        return page.response(request, "no-cache")

    @app.get(UI_URL + "/assets/{name}", include_in_schema=False)
    def ui_asset(name: str, request: Request) -> Response:
        asset = assets.get(name)  # only names read at start: what is asked never reaches the disk
        if asset is None:
            return error_response(NotFound("DashboardAsset", name[:128]))
        return asset.response(request, _IMMUTABLE)

    app.add_middleware(PathHeaders, roots=(UI_URL,), headers=SECURITY_HEADERS)
