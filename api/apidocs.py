"""`/docs`: Swagger UI for the API, served from this server under the dashboard's security headers.

Swagger UI's assets come from the `fastapi-offline` package, pinned in pyproject.toml, rather than
from a public CDN: the page loads nothing from another site, its Content-Security-Policy is the
dashboard's (no inline script or style: the start-up script is our own `docs.js`), and each asset
carries its Subresource Integrity hash, so an asset that is not the pinned one is refused by the
browser (tests/browser/test_dashboard_http.py checks the hashes against the served files).
"""

from __future__ import annotations

import html
from pathlib import Path

import fastapi_offline
from fastapi import APIRouter
from fastapi.responses import FileResponse, HTMLResponse, Response

from api.dashboard.web import asset, security_headers
from scheduler.errors import NotFound

ASSET_DIR = Path(fastapi_offline.__file__).parent / "static"
# The pinned release's files (fastapi-offline 1.7.7: Swagger UI 5.32.6) and their SRI hashes.
ASSETS: dict[str, tuple[str, str]] = {
    "swagger-ui-bundle.js": (
        "text/javascript",
        "sha384-EYdOaiRwn44zNjrw+Tfs06qYz9BGQVo2f4/pLY5i7VorbjnZNhdplAbTBk8FXHUJ",
    ),
    "swagger-ui.css": (
        "text/css",
        "sha384-9Q2fpS+xeS4ffJy6CagnwoUl+4ldAYhOs9pgZuEKxypVModhmZFzeMlvVsAjf7uT",
    ),
}

router = APIRouter(include_in_schema=False)


def page(title: str) -> str:
    js, css = ASSETS["swagger-ui-bundle.js"][1], ASSETS["swagger-ui.css"][1]
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)} API reference</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/docs/assets/swagger-ui.css" integrity="{css}">
</head>
<body>
<main id="swagger-ui" data-spec="/openapi.json"></main>
<script src="/docs/assets/swagger-ui-bundle.js" integrity="{js}"></script>
<script src="{asset("docs.js")}"></script>
</body>
</html>
"""


@router.get("/docs", response_class=HTMLResponse)
def docs() -> Response:
    response = HTMLResponse(page("ipucloud"))
    security_headers(response)
    return response


@router.get("/docs/assets/{name}")
def docs_asset(name: str) -> Response:
    if name not in ASSETS:
        raise NotFound(f"No asset {name!r}.")
    media_type, _ = ASSETS[name]
    response = FileResponse(ASSET_DIR / name, media_type=media_type)
    # The files change only with the pinned package, and the page names them by hash.
    response.headers["Cache-Control"] = "public, max-age=86400"
    security_headers(response)
    return response
