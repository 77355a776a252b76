"""The ASGI application object, for `uvicorn api.main:app` (one per API process)."""

import gc
import sys

from api.app import create_app

# The submission writer thread waits on the database a dozen times per batch; with the default
# 5 ms GIL switch interval each wait can cost it a whole interval behind the busy event loop.
sys.setswitchinterval(0.0005)

app = create_app()

# Everything built so far (FastAPI, pydantic models, SQLAlchemy metadata, the workload catalogue)
# lives as long as the process. Left to the collector, each full collection walks all of it: a
# 100-150 ms pause every few thousand requests, the whole of the submit path's p99.
gc.freeze()
