"""A submission batch's database writes, in process, on PostgreSQL: how to send a batch's job rows.

The API's submit writer (scheduler/services/batch/submitter.py) admits what arrives together in one
transaction and inserts the batch's `jobs` rows in one go (`jobs.submit_jobs`). This times the ways
of sending those rows, alternating between them batch by batch so that a machine's changing load
falls on all alike, for batches (`--sizes`, 16, 64 and 256 rows by default) of a real admitted
one-step job (42 columns):

- `executemany`: `conn.execute(insert(jobs), rows)`, what `submit_jobs` did until COPY. psycopg 3
  sends it in pipeline mode through a statement it prepares once per connection: one round trip, no parse or
  plan per row;
- `insertmanyvalues`: `conn.execute(insert(jobs).returning(jobs.c.id), rows)`: SQLAlchemy renders one
  `INSERT ... VALUES (...), (...), ...` statement per batch (what `sort_by_parameter_order` uses too);
- `values`: one `insert(jobs).values(rows)` statement, compiled by SQLAlchemy for the batch;
- `unnest`: `INSERT INTO jobs SELECT * FROM unnest(%s::varchar[], ...)`: one statement whose text
  never changes, the rows as one array per column;
- `driver`: the executemany straight on psycopg's cursor, without SQLAlchemy;
- `copy`: `COPY jobs (...) FROM STDIN`, psycopg writing each row in C (what `submit_jobs` did until
  the JSON rows), two round trips of its own;
- `json`: `INSERT INTO jobs (...) SELECT ... FROM json_to_recordset(%s)`, every row in one JSON
  parameter made in C by orjson (`scheduler.db.rows_insert`, what `submit_jobs` does now, there in one
  statement with the batch's events and its reservation).

It prints, per way and batch size, the median and range of wall-clock ms per batch and of the CPU
the benchmark's process spent in it (SQLAlchemy and psycopg), and the load average.

    .venv/bin/python benchmarks/submit_batch.py [--reps 30] [--sizes 16,64,256] [--db-name sb_batch]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import Connection, insert, select  # noqa: E402

from benchmarks.harness import PG_DEFAULT, fresh_database, prepare  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--database-url", default=os.environ.get("IPUCLOUD_BENCH_DATABASE_URL", PG_DEFAULT))
    ap.add_argument("--db-name", default="ipucloud_submit_batch", help="made (dropped first) on that server")
    ap.add_argument("--sizes", default="16,64,256")
    ap.add_argument(
        "--reps", type=int, default=30, help="timed batches per way and size (after 3 to warm up)"
    )
    args = ap.parse_args()
    os.environ.setdefault("IPUCLOUD_SECRET_KEY", "benchmark-secret-" + os.urandom(8).hex())

    from scheduler.db import Database, rows_insert, rows_json
    from scheduler.ids import new_id
    from scheduler.jobspec import JobSpec
    from scheduler.models import Job, Tenant
    from scheduler.services.batch import jobs

    print(f"# a batch's job rows, {time.strftime('%Y-%m-%d %H:%M:%S')}, load average {_load()}")
    print("# reproduce: .venv/bin/python benchmarks/submit_batch.py " + " ".join(sys.argv[1:]))
    db_url = fresh_database(args.database_url, args.db_name)
    prepare(db_url, pods=16)
    db = Database(db_url)  # the API's engine: psycopg 3, prepare_threshold 3
    with db.read() as s:
        tenant_id = s.execute(select(Tenant.id).where(Tenant.name == "bench")).scalar_one()
    spec = JobSpec.model_validate(
        {"name": "tiny", "workload": {"model": "mcmc", "task": "infer", "steps": 1}, "ipus": 1}
    )
    with db.write() as s:
        (admitted,) = jobs.submit_jobs(session=s, requests=[jobs.SubmitRequest(tenant_id, spec)])
    assert isinstance(admitted, jobs.Submitted)
    table = Job.__table__
    template = {c.key: getattr(admitted.job, c.key) for c in table.columns}

    dialect = db.engine.dialect
    columns = list(table.columns)
    processors = [c.type._cached_bind_processor(dialect) for c in columns]
    unnest_sql = (
        f"INSERT INTO {table.name} ({', '.join(c.name for c in columns)}) SELECT * FROM unnest("
        + ", ".join(f"%s::{c.type.compile(dialect=dialect)}[]" for c in columns)
        + ")"
    )

    def unnest(conn: Connection, rows: list[dict[str, Any]]) -> None:
        arrays = []
        for c, process in zip(columns, processors, strict=True):
            values = [row[c.key] for row in rows]
            arrays.append([process(v) for v in values] if process else values)
        conn.exec_driver_sql(unnest_sql, tuple(arrays))

    driver_sql = (
        f"INSERT INTO {table.name} ({', '.join(c.name for c in columns)}) VALUES ("
        + ", ".join("%s" for _ in columns)
        + ")"
    )

    def driver(conn: Connection, rows: list[dict[str, Any]]) -> None:
        pairs = list(zip(columns, processors, strict=True))
        params = [tuple(p(row[c.key]) if p else row[c.key] for c, p in pairs) for row in rows]
        raw = conn.connection.driver_connection
        assert raw is not None
        with raw.cursor() as cur:
            cur.executemany(driver_sql, params)

    copy_sql = f"COPY {table.name} ({', '.join(c.name for c in columns)}) FROM STDIN"

    def copy(conn: Connection, rows: list[dict[str, Any]]) -> None:
        pairs = list(zip(columns, processors, strict=True))
        raw = conn.connection.driver_connection
        assert raw is not None
        with raw.cursor() as cur, cur.copy(copy_sql) as out:
            for row in rows:
                values = (p(row[c.key]) if p else row[c.key] for c, p in pairs)
                # JSON columns' processor gives bytes, which COPY would write as bytea's hex.
                out.write_row([v.decode() if isinstance(v, bytes) else v for v in values])

    json_insert, json_plan = rows_insert(table, tuple(c.key for c in columns), "rows", dialect)

    def json_rows(conn: Connection, rows: list[dict[str, Any]]) -> None:
        conn.execute(json_insert, {"rows": rows_json(json_plan, rows)})

    ways: dict[str, Callable[[Connection, list[dict[str, Any]]], object]] = {
        "executemany": lambda conn, rows: conn.execute(insert(table), rows),
        "insertmanyvalues": lambda conn, rows: conn.execute(insert(table).returning(table.c.id), rows),
        "values": lambda conn, rows: conn.execute(insert(table).values(rows)),
        "unnest": unnest,
        "driver": driver,
        "copy": copy,
        "json": json_rows,
    }
    for size in (int(x) for x in args.sizes.split(",")):
        wall: dict[str, list[float]] = {w: [] for w in ways}
        cpu: dict[str, list[float]] = {w: [] for w in ways}
        for n in range(3 + args.reps):
            for name, write in ways.items():
                rows = [{**template, "id": new_id("job")} for _ in range(size)]
                with db.engine.begin() as conn:
                    w0, c0 = time.perf_counter(), time.process_time()
                    write(conn, rows)
                    w1, c1 = time.perf_counter(), time.process_time()
                if n >= 3:
                    wall[name].append((w1 - w0) * 1000)
                    cpu[name].append((c1 - c0) * 1000)
        for name in ways:
            w, c = wall[name], cpu[name]
            print(
                f"{size:>3} rows {name:<17} {statistics.median(w):7.1f} ms ({min(w):.1f}-{max(w):.1f}), "
                f"client CPU {statistics.median(c):6.1f} ms ({min(c):.1f}-{max(c):.1f}); "
                f"load average {_load()}",
                flush=True,
            )
    db.dispose()


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
