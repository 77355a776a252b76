"""The web dashboard: server-rendered HTML, a little JavaScript of our own, SVG drawn on the server."""

from api.dashboard.routes import router
from api.dashboard.web import STATIC_DIR

__all__ = ["STATIC_DIR", "router"]
