"""The floor for submit throughput: a bare endpoint doing one durable INSERT and nothing else.

Same stack as the API (FastAPI, uvicorn, SQLAlchemy, psycopg 3, a pooled engine, a synchronous commit),
no auth, no validation beyond parsing JSON, no admission, no quota. ipucloud's submit throughput is reported
as a ratio of this.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

from fastapi import FastAPI, Request
from sqlalchemy import JSON, Column, MetaData, String, Table, create_engine, insert

metadata = MetaData()
floor_jobs = Table("floor_jobs", metadata, Column("id", String(40), primary_key=True), Column("spec", JSON))

engine = create_engine(
    os.environ["FLOOR_DATABASE_URL"].replace("postgresql://", "postgresql+psycopg://", 1),
    pool_size=10,
    max_overflow=10,
)
metadata.create_all(engine, checkfirst=True)

app = FastAPI()


@app.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@app.post("/jobs", status_code=202)
async def submit(request: Request) -> dict[str, Any]:
    spec = await request.json()
    job_id = uuid.uuid4().hex
    from anyio import to_thread

    def write() -> None:
        with engine.begin() as conn:
            conn.execute(insert(floor_jobs).values(id=job_id, spec=spec))

    await to_thread.run_sync(write)
    return {"id": job_id, "state": "queued"}
