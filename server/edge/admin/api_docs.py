"""The API's own description, for operators: `GET /openapi.json` (the OpenAPI schema) and `GET /docs`
(Swagger UI over it) need an admin key or the dashboard's admin session. FastAPI serves both to anyone
by default; here they would hand every caller the full map of the admin, release and rights routes.
Swagger UI's script and style come from jsDelivr pinned to one version with Subresource Integrity (a
changed file on the CDN is refused by the browser, not run in an admin's session), and no favicon is
fetched from elsewhere. The hashes are the npm package's files':
`npm pack swagger-ui-dist@VERSION; openssl dgst -sha384 -binary package/FILE | openssl base64 -A`."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse

from liveloop.server.edge.auth import Principal, require_admin

router = APIRouter(include_in_schema=False)

SWAGGER_UI = "5.36.0"
_CDN = f"https://cdn.jsdelivr.net/npm/swagger-ui-dist@{SWAGGER_UI}"
ASSETS = {  # URL -> its sha384, as the page's integrity attribute
    f"{_CDN}/swagger-ui-bundle.js": "sha384-fUpRgC19yPykTqzdrUbdAg8NTiu16NEKf9U12J+IJWCg8/1mEI8f2+PEIz60Wyd+",
    f"{_CDN}/swagger-ui.css": "sha384-z/AtSaOHGn5MJ5auAHXUypohywlIWLBZo1jeGmhdpVIbCnFhxAH92cwdV41oyINc",
}


@router.get("/openapi.json")
async def openapi(request: Request, _: Principal = Depends(require_admin)) -> JSONResponse:
    return JSONResponse(request.app.openapi())


@router.get("/docs")
async def docs(request: Request, _: Principal = Depends(require_admin)) -> HTMLResponse:
    js, css = ASSETS
    page = get_swagger_ui_html(
        openapi_url="/openapi.json", title=f"{request.app.title} API", swagger_js_url=js, swagger_css_url=css,
        swagger_favicon_url="data:,",
    ).body.decode()
    for url, digest in ASSETS.items():
        tagged = page.replace(f'"{url}"', f'"{url}" integrity="{digest}" crossorigin="anonymous"')
        if tagged == page:  # FastAPI changed its page: never serve an asset without its hash
            raise RuntimeError(f"/docs: {url} is not on FastAPI's Swagger UI page")
        page = tagged
    return HTMLResponse(page)
