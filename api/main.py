"""The ASGI application object, for `uvicorn api.main:app` (one per API process)."""

from api.app import create_app

app = create_app()
