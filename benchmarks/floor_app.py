"""The floors for submit throughput: bare endpoints doing durable INSERTs and nothing else.

Same stack as the API (FastAPI, uvicorn, SQLAlchemy, psycopg 3, a pooled engine, a synchronous commit),
no auth, no validation beyond parsing JSON, no admission, no quota. ipucloud's submit throughput is reported
as a ratio of these.

- `POST /jobs`: one transaction with one INSERT per request (the one-INSERT floor);
- `POST /jobs-grouped`: the group-commit floor. One writer thread per process commits whatever requests
  arrived while it committed the last batch in one transaction, the rows as one executemany of one INSERT
  (psycopg 3 sends it pipelined and prepared: one round trip, one parse), and answers each after that
  commit, as the API's submitter does (scheduler/services/batch/submitter.py) without its admission;
- `POST /jobs-grouped-values`: the same with the batch's rows as one multi-row `INSERT ... VALUES (...),
  (...)` statement (SQLAlchemy's "insertmanyvalues"), to hold the two ways of writing a batch against
  each other (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import uuid
from concurrent.futures import Future
from typing import Any

from fastapi import FastAPI, Request
from sqlalchemy import JSON, Column, MetaData, String, Table, create_engine, insert, text

metadata = MetaData()
floor_jobs = Table("floor_jobs", metadata, Column("id", String(40), primary_key=True), Column("spec", JSON))

engine = create_engine(
    os.environ["FLOOR_DATABASE_URL"].replace("postgresql://", "postgresql+psycopg://", 1),
    pool_size=10,
    max_overflow=10,
)
with engine.begin() as conn:
    # Every uvicorn worker imports this module at once, and two CREATE TABLEs of one name race on
    # PostgreSQL's catalogue (a worker died of it, leaving the floor measured on one process): they
    # take turns under a transaction-scoped advisory lock.
    conn.execute(text("SELECT pg_advisory_xact_lock(20261207)"))
    metadata.create_all(conn, checkfirst=True)

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


Pending = queue.SimpleQueue[tuple[dict[str, Any], Future[None]]]


def _writer(pending: Pending, write: Any) -> None:
    while True:
        batch = [pending.get()]
        while len(batch) < 256:
            try:
                batch.append(pending.get_nowait())
            except queue.Empty:
                break
        try:
            with engine.begin() as conn:
                write(conn, [row for row, _ in batch])
        except Exception as exc:
            for _, f in batch:
                f.set_exception(exc)
            continue
        for _, f in batch:
            f.set_result(None)


_pending: Pending = queue.SimpleQueue()
_pending_values: Pending = queue.SimpleQueue()
threading.Thread(
    target=_writer,
    args=(_pending, lambda conn, rows: conn.execute(insert(floor_jobs), rows)),
    name="floor-writer",
    daemon=True,
).start()
# RETURNING makes SQLAlchemy send the rows as multi-row VALUES statements instead of an executemany.
threading.Thread(
    target=_writer,
    args=(
        _pending_values,
        lambda conn, rows: conn.execute(insert(floor_jobs).returning(floor_jobs.c.id), rows),
    ),
    name="floor-writer-values",
    daemon=True,
).start()


async def _grouped(request: Request, pending: Pending) -> dict[str, Any]:
    spec = await request.json()
    job_id = uuid.uuid4().hex
    done: Future[None] = Future()
    pending.put(({"id": job_id, "spec": spec}, done))
    await asyncio.wrap_future(done)
    return {"id": job_id, "state": "queued"}


@app.post("/jobs-grouped", status_code=202)
async def submit_grouped(request: Request) -> dict[str, Any]:
    return await _grouped(request, _pending)


@app.post("/jobs-grouped-values", status_code=202)
async def submit_grouped_values(request: Request) -> dict[str, Any]:
    return await _grouped(request, _pending_values)
