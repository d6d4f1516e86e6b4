"""/docs (Swagger UI) and /redoc, served whole by the control plane: no CDN, no internet.

FastAPI's own pages load their scripts from a CDN, so on a machine without
internet /docs was blank. The pages here reference only the control plane:
the scripts, stylesheet and icon come from the ``fastapi-offline`` package's
static files (Swagger UI 5 and ReDoc 2, the first versions that render the
OpenAPI 3.1 FastAPI writes), installed with stortune like any dependency and
served from /docs/assets/. Swagger UI's online validator is off: it would
send the API description to validator.swagger.io; and a Content-Security-Policy
keeps both pages to the control plane. Every answer under /docs and /redoc (its 404s,
405s and redirects too) refuses to be framed by another site and to be type-sniffed.
"""

from __future__ import annotations

import html
from importlib.resources import files
from pathlib import Path
from typing import Final

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse

from stortune.server.api.headers import PathHeaders
from stortune.server.errors import NotFound

DOCS_URL: Final = "/docs"
REDOC_URL: Final = "/redoc"
ASSETS_URL: Final = "/docs/assets"
#: What the pages load, and the media type each is served with.
ASSETS: Final = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "redoc.standalone.js": "text/javascript; charset=utf-8",
    "favicon.png": "image/png",
}
_CACHE: Final = {"Cache-Control": "public, max-age=86400"}
#: The pages may load only from the control plane: a library that reaches for the internet anyway
#: (ReDoc's footer logo) is stopped by the browser instead of waiting on a network that is not there.
CONTENT_SECURITY_POLICY: Final = (
    "default-src 'none'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
#: On every answer under /docs and /redoc. X-Frame-Options for browsers that predate frame-ancestors.
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
_REDOC_PAGE: Final = """<!DOCTYPE html>
<html>
<head>
<meta charset="utf-8"/>
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<link rel="shortcut icon" href="{favicon}">
<style>
  body {{ margin: 0; padding: 0; }}
  /* ReDoc's footer logo is on a CDN, which the page's policy does not reach */
  a[href*="redocly.com"] img {{ display: none; }}
</style>
</head>
<body>
<noscript>ReDoc needs JavaScript; /docs and /openapi.json describe the same API.</noscript>
<redoc spec-url="{spec}"></redoc>
<script src="{script}"></script>
</body>
</html>
"""


def asset_dir() -> Path:
    """Where the installed assets are (a directory of the fastapi_offline package)."""
    return Path(str(files("fastapi_offline") / "static"))


def install(app: FastAPI, openapi_url: str = "/openapi.json") -> None:
    """Add /docs, /redoc and their assets to ``app`` (created with docs_url=None, redoc_url=None)."""
    directory = asset_dir()
    missing = [name for name in ASSETS if not (directory / name).is_file()]
    if missing:  # a broken install: say so at start, not as a blank page later
        raise RuntimeError(f"API documentation assets missing from {directory}: {', '.join(missing)}; "
                           "reinstall stortune (its dependency fastapi-offline carries them)")

    @app.get(DOCS_URL, include_in_schema=False)
    def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        page = get_swagger_ui_html(
            openapi_url=root + openapi_url, title=f"{app.title}: API",
            swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
            swagger_ui_parameters={"validatorUrl": None})
        return page

    @app.get(REDOC_URL, include_in_schema=False)
    def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        page = _REDOC_PAGE.format(title=html.escape(f"{app.title}: API reference"),
                                  favicon=html.escape(f"{root}{ASSETS_URL}/favicon.png"),
                                  spec=html.escape(root + openapi_url),
                                  script=html.escape(f"{root}{ASSETS_URL}/redoc.standalone.js"))
        return HTMLResponse(page)

    @app.get(ASSETS_URL + "/{name}", include_in_schema=False)
    def asset(name: str) -> FileResponse:
        media_type = ASSETS.get(name)
        if media_type is None:  # only the names above: what is asked never reaches the file system
            raise NotFound("DocsAsset", name)
        return FileResponse(directory / name, media_type=media_type, headers=_CACHE)

    app.add_middleware(PathHeaders, roots=(DOCS_URL, REDOC_URL), headers=SECURITY_HEADERS)
