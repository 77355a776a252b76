"""Engines and transactions.

SQLite (the embedded default) runs with WAL, foreign keys and a busy timeout, and its write
transactions take the write lock at BEGIN (`BEGIN IMMEDIATE`): a deferred transaction that reads
and then writes can fail with SQLITE_BUSY halfway, which would turn every guarded update into a
retry loop. Read-only transactions stay deferred so readers never queue behind writers.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar, cast

import orjson
from sqlalchemy import (
    JSON,
    CursorResult,
    Engine,
    Executable,
    Insert,
    String,
    Table,
    Text,
    bindparam,
    column,
    create_engine,
    event,
    func,
    insert,
    literal_column,
    select,
    text,
    update,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.exc import DisconnectionError, OperationalError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

_BEGIN_OPTION = "ipucloud_sqlite_begin"

log = logging.getLogger("ipucloud.db")

_P = ParamSpec("_P")
_T = TypeVar("_T")

# PostgreSQL's deadlock_detected and serialization_failure: it rolled the transaction back whole, and
# running it again is the remedy it documents.
RETRYABLE_SQLSTATES = frozenset({"40P01", "40001"})


def retryable(exc: BaseException) -> bool:
    """Whether `exc` is a transaction PostgreSQL aborted to break a deadlock or a serialization
    conflict, which the same transaction run again may pass."""
    return isinstance(exc, OperationalError) and getattr(exc.orig, "sqlstate", None) in RETRYABLE_SQLSTATES


def retry_conflicts(fn: Callable[_P, _T], *, tries: int = 4) -> Callable[_P, _T]:
    """`fn` run again (up to `tries` times in all, after a short random wait) when PostgreSQL aborted
    its transaction as `retryable`. Only for a call whose writes are all in transactions it opens
    itself and that does nothing outside them before the last commits: a rolled-back transaction
    leaves nothing behind (not even its messages, `bus.publish_after_commit`), so a second run is
    the first one's. Keeps a request that lost a lock race from being answered 503."""

    @functools.wraps(fn)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        for attempt in range(1, tries + 1):
            try:
                return fn(*args, **kwargs)
            except OperationalError as exc:
                if attempt == tries or not retryable(exc):
                    raise
                log.warning("%s: %s; running it again", fn.__qualname__, str(exc.orig).splitlines()[0])
                time.sleep(random.uniform(0.01, 0.05) * attempt)
        raise AssertionError("unreachable")

    return run


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def normalise_url(url: str) -> str:
    """Accept the usual `postgresql://` spelling and use psycopg 3 for it."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://") :]
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    return url


def make_engine(
    url: str, *, pool_size: int = 10, echo: bool = False, idle_tx_timeout_s: float = 3.0
) -> Engine:
    """`idle_tx_timeout_s`: a client cut off mid-transaction keeps its row locks on the server until
    PostgreSQL notices; API and worker transactions never sit idle, so a short limit frees those locks
    long before any lease runs out."""
    url = normalise_url(url)
    if is_sqlite(url):
        engine = create_engine(
            url,
            echo=echo,
            connect_args={"check_same_thread": False, "timeout": 30},
            # SQLite connections are cheap; pooling them across forks (Celery prefork) is not safe.
            poolclass=NullPool,
        )
        _configure_sqlite(engine)
        return engine
    engine = create_engine(
        url,
        echo=echo,
        json_serializer=_json_dumps,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_recycle=1800,
        connect_args={
            # Prepared statements on the server for the hot, repeated queries.
            "prepare_threshold": 3,
            "options": f"-c idle_in_transaction_session_timeout={round(idle_tx_timeout_s * 1000)}",
            "keepalives": 1,
            "keepalives_idle": 10,
            "keepalives_interval": 5,
            "keepalives_count": 3,
        },
    )
    _ping_idle_connections(engine)
    return engine


def _json_dumps(value: Any) -> bytes | str:
    """JSON columns' text for PostgreSQL (psycopg takes bytes): orjson where it can, else the standard
    library's, so that what orjson does not take (non-string keys, a float subclass) is written as
    before. The same values either way; only the text's spacing and escaping differ.

    A submission writes eight JSON values per job (spec, options, event data, ...); with the standard
    library's encoder they were a tenth of the submit writer's time per batch (cProfile)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value)


# A connection used moments ago is alive: pinging it on every checkout (pool_pre_ping) would cost a
# round trip per transaction, a fifth of a submission's. One idle for longer may have outlived a
# server restart or a cut link, and is pinged before use.
PING_IF_IDLE_S = 1.0


def _ping_idle_connections(engine: Engine) -> None:
    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_conn: Any, record: Any) -> None:
        record.info["checked_in_at"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        last = record.info.get("checked_in_at")
        if last is not None and time.monotonic() - last < PING_IF_IDLE_S:
            return
        try:
            engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:
            # The pool discards this connection and checks out another (up to three times).
            raise DisconnectionError() from exc


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Take transaction control away from pysqlite so BEGIN is ours to issue.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        mode = conn.get_execution_options().get(_BEGIN_OPTION, "IMMEDIATE")
        conn.exec_driver_sql(f"BEGIN {mode}")


class Database:
    """One engine and the two kinds of transaction every component uses."""

    def __init__(self, url: str, *, pool_size: int = 10, idle_tx_timeout_s: float = 3.0) -> None:
        self.url = normalise_url(url)
        self.engine = make_engine(self.url, pool_size=pool_size, idle_tx_timeout_s=idle_tx_timeout_s)
        self.sqlite = is_sqlite(self.url)
        self._write = sessionmaker(bind=self.engine, expire_on_commit=False)
        read_bind = (
            self.engine.execution_options(**{_BEGIN_OPTION: "DEFERRED"}) if self.sqlite else self.engine
        )
        self._read = sessionmaker(bind=read_bind, expire_on_commit=False)

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A write transaction: committed when the block ends, rolled back on any exception."""
        with self._write() as session, session.begin():
            yield session

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self._read() as session, session.begin():
            yield session

    def dispose(self) -> None:
        self.engine.dispose()


def insert_returning_keys(session: Session, table: Table, rows: list[dict[str, Any]]) -> list[int]:
    """INSERT many rows and return their generated primary keys, in order.

    On PostgreSQL the keys are drawn from the column's sequence first, in one statement, and the
    rows then go in as one pipelined executemany of a single prepared INSERT. An INSERT ... RETURNING
    of thousands of rows would instead be sent as a few huge statements whose text psycopg parses
    anew each time, which cost a scheduling pass placing 10,000 jobs most of its time. SQLite
    returns the keys from INSERT ... RETURNING.
    """
    if not rows:
        return []
    (key,) = table.primary_key.columns
    if session.get_bind().dialect.name != "postgresql":
        result = session.execute(insert(table).returning(key, sort_by_parameter_order=True), rows)
        return [int(k) for k in result.scalars()]
    keys = [
        int(k)
        for k in session.execute(
            select(func.nextval(func.pg_get_serial_sequence(table.name, key.name))).select_from(
                func.generate_series(1, len(rows))
            )
        ).scalars()
    ]
    session.execute(insert(table), [{**row, key.name: k} for row, k in zip(rows, keys, strict=True)])
    return keys


@functools.lru_cache(maxsize=64)
def rows_insert(table: Table, names: tuple[str, ...], param: str, dialect: Any) -> tuple[Insert, RowsPlan]:
    """`INSERT INTO table (names) SELECT ... FROM json_to_recordset(:param)` for PostgreSQL, and how
    `rows_json` makes that parameter: every row of a batch in one JSON text, so that the INSERT is one
    statement of constant text (prepared once per connection), and, unlike COPY (two round trips
    of its own, and in half the client CPU of a pipelined executemany), it can go in one statement
    with others (a CTE of a data-modifying statement).

    The values are the columns' bind processors' (as an executemany's are); a JSON
    column's text is embedded as it is, and JSON's `null` stays a JSON `null` (what SQLAlchemy writes
    for None), not the SQL NULL `json_to_recordset` would make of it. Text columns are read as `text`,
    so that a value too long for its column is refused by the INSERT, as any INSERT refuses it."""
    columns = [table.c[n] for n in names]
    record = [column(c.name, Text if isinstance(c.type, String) else c.type) for c in columns]
    rs = (
        func.json_to_recordset(sql_cast(bindparam(param, type_=Text), JSON))
        .table_valued(*record)
        .render_derived(name="r", with_types=True)
    )
    picked = [
        func.coalesce(rs.c[c.name], literal_column("'null'::json"))
        if isinstance(c.type, JSON)
        else rs.c[c.name]
        for c in columns
    ]
    plan = RowsPlan(
        names,
        tuple(c.type.bind_processor(dialect) for c in columns),
        tuple(isinstance(c.type, JSON) for c in columns),
    )
    return insert(table).from_select(list(names), select(*picked)), plan


@dataclasses.dataclass(frozen=True)
class RowsPlan:
    names: tuple[str, ...]
    processors: tuple[Callable[[Any], Any] | None, ...]
    is_json: tuple[bool, ...]


def rows_json(plan: RowsPlan, rows: Sequence[Mapping[str, Any]]) -> str:
    """The parameter of a `rows_insert` statement: `rows` as one JSON array of objects, in C (orjson)."""
    fields = tuple(zip(plan.names, plan.processors, plan.is_json, strict=True))
    out = [
        {
            n: (orjson.Fragment(p(row[n])) if j else p(row[n])) if p is not None else row[n]
            for n, p, j in fields
        }
        for row in rows
    ]
    return orjson.dumps(out).decode()


def insert_columns(session: Session, table: Table, columns: dict[str, list[Any]]) -> None:
    """INSERT many rows of a narrow table given column by column (lists of equal length).

    On PostgreSQL they go as one `INSERT ... SELECT FROM unnest(...)` of one array per column: for a
    table of two or three plain columns that is one statement for PostgreSQL to run and no per-row
    work in Python, against a pipelined executemany's per-row parameter handling and execution
    (18,500 IPU assignments: 0.07 s against 0.27 s with psycopg alone, measured 2026-12-07; more
    through SQLAlchemy). Wide rows, JSON columns or timestamps stay with executemany, which is
    faster there (`scheduler/services/batch/jobs/submit.py`)."""
    names = list(columns)
    count = len(columns[names[0]]) if names else 0
    if not count:
        return
    if session.get_bind().dialect.name != "postgresql":
        rows = zip(*columns.values(), strict=True)
        session.execute(insert(table), [dict(zip(names, values, strict=True)) for values in rows])
        return
    dialect = session.get_bind().dialect
    arrays = ", ".join(f"CAST(:c{i} AS {table.c[n].type.compile(dialect)}[])" for i, n in enumerate(names))
    session.execute(
        text(f"INSERT INTO {table.name} ({', '.join(names)}) SELECT * FROM unnest({arrays})"),
        {f"c{i}": columns[n] for i, n in enumerate(names)},
    )


def update_by_key(
    session: Session,
    table: Table,
    key: str,
    rows: dict[Any, dict[str, Any]],
    same: dict[str, Any] | None = None,
) -> None:
    """UPDATE many rows, each by its key to values of its own (the same columns in every row) and to
    `same` (values every row gets), in one statement on PostgreSQL: `UPDATE ... FROM unnest(...)` of
    one array per column, rather than one execution per row. Per-row values must be plain (no JSON,
    no type decorators: they go as arrays of the columns' database types); `same` may be anything
    the columns take."""
    if not rows:
        return
    same = same or {}
    names = list(next(iter(rows.values())))
    if session.get_bind().dialect.name != "postgresql":
        session.execute(
            update(table)
            .where(table.c[key] == bindparam("_key"))
            .values({**{n: bindparam(n) for n in names}, **same}),
            [{"_key": k, **values} for k, values in rows.items()],
        )
        return
    dialect = session.get_bind().dialect
    columns = [key, *names]
    arrays = ", ".join(f"CAST(:c{i} AS {table.c[n].type.compile(dialect)}[])" for i, n in enumerate(columns))
    sets = [f"{n} = v.{n}" for n in names] + [f"{n} = :s_{n}" for n in same]
    params: dict[str, Any] = {"c0": list(rows)}
    for i, n in enumerate(names, start=1):
        params[f"c{i}"] = [values[n] for values in rows.values()]
    params.update({f"s_{n}": v for n, v in same.items()})
    statement = text(
        f"UPDATE {table.name} SET {', '.join(sets)} FROM unnest({arrays}) AS v({', '.join(columns)}) "
        f"WHERE {table.name}.{key} = v.{key}"
    ).bindparams(*(bindparam(f"s_{n}", type_=table.c[n].type) for n in same))
    session.execute(statement, params)


def changed(session: Session, statement: Executable) -> int:
    """Run an UPDATE or DELETE and return how many rows it changed (a compare-and-set reads this)."""
    return cast(CursorResult[Any], session.execute(statement)).rowcount
