"""The API's own description, for operators: `GET /openapi.json` (the OpenAPI schema) and `GET /docs`
(Swagger UI over it) need an admin key or the dashboard's admin session. FastAPI serves both to anyone
by default; here they would hand every caller the full map of the admin, release and rights routes."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse

from liveloop.server.edge.auth import Principal, require_admin

router = APIRouter(include_in_schema=False)


@router.get("/openapi.json")
async def openapi(request: Request, _: Principal = Depends(require_admin)) -> JSONResponse:
    return JSONResponse(request.app.openapi())


@router.get("/docs")
async def docs(request: Request, _: Principal = Depends(require_admin)) -> HTMLResponse:
    return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{request.app.title} API")
