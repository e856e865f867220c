"""The API documentation at ``/schema``, served from this process (never a CDN), and the
landing answer at ``/`` that points to it.

The page's script and style come from the pinned ``swagger-ui-bundle-v2`` package (the files of
``swagger-ui-dist`` of the same version), so the docs work offline and behind a firewall, and
nothing from another origin runs next to the console. A Content-Security-Policy admits only this
origin's files: the page has no inline script or style at all.
"""

from __future__ import annotations

import base64
import hashlib
from functools import lru_cache
from html import escape
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from litestar import Request, Response, Router, get
from litestar.datastructures import ResponseHeader
from litestar.enums import MediaType
from litestar.openapi.plugins import OpenAPIRenderPlugin
from swagger_ui_bundle import swagger_ui_path

from service.errors import NotFound

DOCS_PATH = "/schema"
CONSOLE_PATH = "/console"
_DIST = Path(str(swagger_ui_path))
# The version is in the asset URLs, so a cached file is never stale after an upgrade.
ASSETS_PREFIX = f"/{_DIST.name}"

# What the page loads: the bundle and its stylesheet, the page's own start-up script, an icon.
_STARTUP = "memoria-docs.js"
_MEDIA_TYPES = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "favicon-32x32.png": "image/png",
    _STARTUP: "text/javascript; charset=utf-8",
}

# Swagger UI fetches the document from this origin; "Try it out" calls this origin too. The
# validator badge would call a public service: it is switched off.
_STARTUP_SCRIPT = b"""\
"use strict";
window.ui = SwaggerUIBundle({
  url: document.getElementById("swagger-ui").dataset.spec,
  dom_id: "#swagger-ui",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  validatorUrl: null,
  presets: [SwaggerUIBundle.presets.apis],
  layout: "BaseLayout",
});
"""

# Only this origin's files (no inline script or style, no eval), images from here or inline in
# the stylesheet (its icons are data: URLs), calls only to this origin, never framed.
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)


@lru_cache(maxsize=len(_MEDIA_TYPES))
def asset(name: str) -> bytes:
    """One of the page's files, read once."""
    if name == _STARTUP:
        return _STARTUP_SCRIPT
    return (_DIST / name).read_bytes()


def _integrity(name: str) -> str:
    digest = hashlib.sha384(asset(name)).digest()
    return "sha384-" + base64.b64encode(digest).decode()


def _url(name: str) -> str:
    return f"{DOCS_PATH}{ASSETS_PREFIX}/{name}"


@lru_cache(maxsize=4)
def page(title: str, spec_url: str) -> bytes:
    """The documentation page: markup only, everything else by URL with its integrity."""

    def script(name: str) -> str:
        return f'<script src="{_url(name)}" integrity="{_integrity(name)}"></script>'

    css = "swagger-ui.css"
    html = f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)} API</title>
<link rel="icon" type="image/png" href="{_url("favicon-32x32.png")}">
<link rel="stylesheet" href="{_url(css)}" integrity="{_integrity(css)}">
</head>
<body>
<div id="swagger-ui" data-spec="{escape(spec_url)}"></div>
{script("swagger-ui-bundle.js")}
{script(_STARTUP)}
</body>
</html>
"""
    return html.encode()


class SwaggerPage(OpenAPIRenderPlugin):
    """Swagger UI at ``/schema`` and ``/schema/swagger``, from this process's own files."""

    def __init__(self) -> None:
        super().__init__(path=["/", "/swagger"], media_type=MediaType.HTML)

    def render(self, request: Request[Any, Any, Any], openapi_schema: dict[str, Any]) -> bytes:
        """The page; it fetches the document itself."""
        return page(str(openapi_schema["info"]["title"]), self.get_openapi_json_route(request))


@get(f"{ASSETS_PREFIX}/{{name:str}}", include_in_schema=False, sync_to_thread=False)
def docs_asset(name: str) -> Response[bytes]:
    """A file of the documentation page (only the few the page uses)."""
    media_type = _MEDIA_TYPES.get(name)
    if media_type is None:
        raise NotFound(f"no documentation file {name!r}", field="name")
    return Response(
        asset(name),
        media_type=media_type,
        headers={"Cache-Control": "public, max-age=31536000, immutable"},
    )


def docs_router() -> Router:
    """The router the OpenAPI document, the page and its files are served on."""
    return Router(
        path=DOCS_PATH,
        route_handlers=[docs_asset],
        include_in_schema=False,
        response_headers=[
            ResponseHeader(name="Content-Security-Policy", value=CONTENT_SECURITY_POLICY),
            ResponseHeader(name="X-Content-Type-Options", value="nosniff"),
            ResponseHeader(name="Referrer-Policy", value="no-referrer"),
        ],
    )


def service_version() -> str:
    """The installed package's version."""
    try:
        return version("memoria")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


@get("/", include_in_schema=False, sync_to_thread=False)
def landing(request: Request[Any, Any, Any]) -> Response[Any]:
    """Where to go from here: the console, the documentation, the health probes, the version.

    A browser gets a short page of links; anything else the same as JSON.
    """
    links = {
        "console": CONSOLE_PATH,
        "docs": DOCS_PATH,
        "openapi": f"{DOCS_PATH}/openapi.json",
        "health": "/healthz",
        "ready": "/readyz",
    }
    body = {"service": "memoria", "version": service_version(), **links}
    if request.accept.best_match([MediaType.JSON, MediaType.HTML]) != MediaType.HTML:
        return Response(body, media_type=MediaType.JSON)
    items = "".join(
        f'<li><a href="{escape(path)}">{escape(path)}</a> ({escape(name)})</li>'
        for name, path in links.items()
    )
    html = (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>Memoria</title>'
        f"</head><body><h1>Memoria {escape(body['version'])}</h1>"
        f"<p>A multi-tenant long-term memory service. The API lives under <code>/v1</code>"
        f" (an API key as <code>Authorization: Bearer mk_…</code>).</p><ul>{items}</ul>"
        f"</body></html>"
    )
    return Response(
        html,
        media_type=MediaType.HTML,
        headers={
            "Content-Security-Policy": "default-src 'none'; base-uri 'none'; "
            "form-action 'none'; frame-ancestors 'none'",
            "X-Content-Type-Options": "nosniff",
        },
    )
