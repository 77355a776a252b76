"""The web dashboard: server-rendered HTML, a little JavaScript of our own, SVG drawn on the server."""

from api.dashboard.routes import router

__all__ = ["router"]
