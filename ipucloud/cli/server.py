"""Server commands: `up` (everything, embedded); `api`, `vipu-server`, `scheduler`, `worker`, `migrate`."""

from __future__ import annotations

import logging
import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from scheduler.settings import ConfigError, Settings, get_settings, reset_settings_cache

# `ipucloud up` is a demo of a cloud: its clock runs a minute of cluster time per second, so the
# README's first job (bert-base, 200 steps on 4 IPUs: 10 to 14 minutes on real IPUs) ends within 15 s.
DEMO_TIME_SCALE = 60.0

err = Console(stderr=True)


def _configure_logging(settings: Settings) -> None:
    logging.basicConfig(
        level=getattr(logging, settings.log_level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s",
    )


def _settings_or_exit() -> Settings:
    try:
        return get_settings()
    except Exception as exc:
        err.print(f"[red]Invalid configuration:[/] {exc}")
        raise typer.Exit(2)


def _preflight(settings: Settings, *, require_migrated: bool = True) -> None:
    from ipucloud.preflight import check_all

    try:
        check_all(settings, require_migrated=require_migrated)
    except ConfigError as exc:
        err.print(f"[red]Cannot start:[/] {exc}")
        raise typer.Exit(3)


def up(
    # Each option falls back to its IPUCLOUD_ variable, as the README's settings table says.
    data_dir: Annotated[
        Path,
        typer.Option(help="Where the database, Redis files, logs and keys live.", envvar="IPUCLOUD_DATA_DIR"),
    ] = Path(".ipucloud"),
    host: Annotated[str, typer.Option(help="Address the API binds.", envvar="IPUCLOUD_HOST")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(help="Port the API binds.", min=1, max=65535, envvar="IPUCLOUD_PORT")
    ] = 8000,
    pods: Annotated[
        int | None,
        typer.Option(help="IPU-M2000 POD64s in the demo fleet (beside its DSS 8440).", min=1, max=1024),
    ] = None,
    fleet: Annotated[
        str | None,
        typer.Option(
            help="The fleet, e.g. 2xm2000,1xbow,1xbow/pod16,4xdss8440 (default: two IPU-M2000 POD64s and "
            "one Dell DSS 8440). Units missing are added at start; admins retire them.",
        ),
    ] = None,
    vipu_port: Annotated[
        int,
        typer.Option(
            help="Port of the V-IPU endpoint (`ipucloud vipu-server`) that jobs, `vipu`, gc-info and "
            "gc-monitor reach.",
            min=1,
            max=65535,
            envvar="IPUCLOUD_VIPU_API_PORT",
        ),
    ] = 8090,
    time_scale: Annotated[
        float,
        typer.Option(
            help="Cluster seconds emulated per wall second (a demo runs faster than real time: "
            "1 for real time). Every duration shown stays in cluster time.",
            min=0.001,
            max=1_000_000,
            envvar="IPUCLOUD_TIME_SCALE",
        ),
    ] = DEMO_TIME_SCALE,
) -> None:
    """Run the whole cloud on this machine: SQLite, embedded Redis, API, V-IPU endpoint, scheduler, worker."""
    from ipucloud.supervisor import Cloud
    from vipu.topology import DEMO_FLEET, UnitGroup, parse_fleet_description

    if pods is not None and fleet is not None:
        err.print("[red]Give --fleet or --pods, not both.[/]")
        raise typer.Exit(2)
    try:
        groups = parse_fleet_description(fleet or DEMO_FLEET)
    except ValueError as exc:
        err.print(f"[red]--fleet: {exc}[/]")
        raise typer.Exit(2)
    if pods is not None:
        groups = tuple(
            UnitGroup(g.machine_type, g.layout, pods, g.model)
            if (g.machine_type.value, g.layout) == ("m2000", "pod64")
            else g
            for g in groups
        )

    os.environ.update(
        IPUCLOUD_MODE="embedded",
        IPUCLOUD_DATA_DIR=str(data_dir),
        IPUCLOUD_HOST=host,
        IPUCLOUD_PORT=str(port),
        IPUCLOUD_VIPU_API_PORT=str(vipu_port),
        IPUCLOUD_TIME_SCALE=repr(time_scale),
    )
    reset_settings_cache()
    settings = _settings_or_exit()
    raise typer.Exit(Cloud(settings=settings, fleet=groups).run())


def api(
    host: Annotated[str | None, typer.Option(help="Bind address (default IPUCLOUD_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default IPUCLOUD_PORT).", min=1, max=65535)] = None,
    workers: Annotated[
        int | None,
        typer.Option(help="uvicorn worker processes (default IPUCLOUD_API_WORKERS).", min=1, max=64),
    ] = None,
    with_vipu: Annotated[
        bool,
        typer.Option(
            "--with-vipu",
            help="Also serve the V-IPU endpoint (as `ipucloud vipu-server` would) from this process, on "
            "IPUCLOUD_VIPU_API_PORT: `ipucloud up` does, to save a process. One worker only.",
        ),
    ] = False,
) -> None:
    """Serve the HTTP API and the dashboard."""
    import uvicorn

    settings = _settings_or_exit()
    _configure_logging(settings)
    _preflight(settings)
    n = workers or settings.api_workers
    if with_vipu:
        if workers is not None and workers > 1:
            err.print("[red]--with-vipu serves from one process: give no --workers (or 1).[/]")
            raise typer.Exit(2)
        raise typer.Exit(_serve_api_and_vipu(settings, host or settings.host, port or settings.port))
    if n > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        metrics_dir = Path(tempfile.mkdtemp(prefix="ipucloud-metrics-"))
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    uvicorn.run(
        "api.main:app",
        host=host or settings.host,
        port=port or settings.port,
        workers=n,
        log_level=settings.log_level.lower(),
        access_log=False,
        # X-Forwarded-* only from the proxies the operator lists: uvicorn's default would believe
        # any local client, which could then pick the address its rate limits are counted under.
        proxy_headers=bool(settings.trusted_proxies),
        forwarded_allow_ips=settings.trusted_proxies or None,
        timeout_graceful_shutdown=10,
    )


def _uvicorn_options(settings: Settings) -> dict[str, Any]:
    return dict(
        log_level=settings.log_level.lower(),
        access_log=False,
        proxy_headers=bool(settings.trusted_proxies),
        forwarded_allow_ips=settings.trusted_proxies or None,
        timeout_graceful_shutdown=10,
    )


def _serve_api_and_vipu(settings: Settings, host: str, port: int) -> int:
    """The API and the V-IPU endpoint in one process and event loop, each on its own port with its
    own middleware, sharing the API's runtime (one database pool, one Redis client). A Python process
    costs about 35 MiB before it serves anything: `ipucloud up` saves one this way. If either server
    stops, the other is stopped too and the process exits, so the supervisor restarts both together.
    Returns the exit status."""
    import asyncio
    import contextlib
    import gc
    import socket

    import uvicorn

    class _Server(uvicorn.Server):
        # The two servers share this process's signals: `_run` handles them for both.
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    from api.main import app as api_app

    api_config = uvicorn.Config(api_app, host=host, port=port, **_uvicorn_options(settings))
    vipu_host = settings.vipu_api_bind or settings.vipu_api_host
    # Its app is made once the API's lifespan has built the runtime it shares (below).
    vipu_config = uvicorn.Config(
        "api.vipu_server:create_vipu_app",
        host=vipu_host,
        port=settings.vipu_api_port,
        **_uvicorn_options(settings),
    )
    # Both ports first, so that a port in use is the last thing logged (the supervisor shows the
    # log's end), before either app starts.
    sockets = []
    for what, config in (("the API", api_config), ("the V-IPU endpoint", vipu_config)):
        try:
            sockets.append(config.bind_socket())  # logs why it cannot, then exits
        except SystemExit:
            err.print(f"[red]Cannot start:[/] {what} cannot listen on {config.host}:{config.port}")
            return 1
    servers = [_Server(api_config), _Server(vipu_config)]
    api_server, vipu_server = servers

    async def _serve(server: uvicorn.Server, sock: socket.socket) -> None:
        try:
            await server.serve(sockets=[sock])
        except SystemExit:
            # uvicorn exits when a server's startup fails (it has logged why): here that would tear
            # the loop down under the other server; `_run` stops it instead.
            pass

    async def _run() -> int:
        loop = asyncio.get_running_loop()

        def _exit(sig: int) -> None:
            for s in servers:
                if s.should_exit and sig == signal.SIGINT:
                    s.force_exit = True
                s.should_exit = True

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, _exit, sig)
        tasks = [asyncio.create_task(_serve(api_server, sockets[0]))]
        while not api_server.started and not tasks[0].done():
            await asyncio.sleep(0.05)
        if tasks[0].done():
            return 1
        from api.vipu_server import create_vipu_app

        vipu_config.app = create_vipu_app(runtime=api_app.state.runtime)
        gc.freeze()  # as api/main.py does for the API's objects: they live as long as the process
        tasks.append(asyncio.create_task(_serve(vipu_server, sockets[1])))
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        stopped_alone = not any(s.should_exit for s in servers)
        for s in servers:
            s.should_exit = True
        await asyncio.gather(*tasks)
        # One server ended by itself (its startup failed): not a clean stop.
        return 1 if stopped_alone or not vipu_server.started else 0

    return asyncio.run(_run())


def vipu_server(
    host: Annotated[
        str | None,
        typer.Option(help="Bind address (default IPUCLOUD_VIPU_API_BIND, then IPUCLOUD_VIPU_API_HOST)."),
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="Port (default IPUCLOUD_VIPU_API_PORT, 8090).", min=1, max=65535)
    ] = None,
) -> None:
    """Serve the V-IPU user endpoint that programs on a partition, `vipu`, gc-info and gc-monitor talk to."""
    import uvicorn

    settings = _settings_or_exit()
    _configure_logging(settings)
    _preflight(settings)
    uvicorn.run(
        "api.vipu_server:create_vipu_app",
        factory=True,
        host=host or settings.vipu_api_bind or settings.vipu_api_host,
        port=port or settings.vipu_api_port,
        log_level=settings.log_level.lower(),
        access_log=False,
        proxy_headers=bool(settings.trusted_proxies),
        forwarded_allow_ips=settings.trusted_proxies or None,
        timeout_graceful_shutdown=10,
    )


def scheduler() -> None:
    """Run a scheduler replica (replicas elect a leader; only it schedules)."""
    from scheduler.loop import SchedulerLoop

    settings = _settings_or_exit()
    _configure_logging(settings)
    _preflight(settings)
    from scheduler import runtime

    # The replica's runtime: its services publish their after-commit hints on it.
    rt = runtime.Runtime.from_settings(settings, idle_tx_timeout_s=max(60.0, settings.db_idle_tx_timeout_s))
    runtime.install(rt)
    loop = SchedulerLoop(
        settings=settings, db=rt.db, redis_client=rt.redis_client(), clock=rt.clock, freeze_heap=True
    )

    def _stop(signum: int, _frame: object) -> None:
        logging.getLogger("ipucloud.scheduler").info("signal %d: stepping down", signum)
        loop.stop_event.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        loop.run()
    finally:
        runtime.install(None)
        rt.close()


def worker(
    queues: Annotated[
        str | None, typer.Option(help="Comma-separated queues to serve (default IPUCLOUD_WORKER_QUEUES).")
    ] = None,
    concurrency: Annotated[
        int | None,
        typer.Option(
            help="Dispatch messages taken at once (default IPUCLOUD_WORKER_CONCURRENCY); how many "
            "attempts run is bounded only by the IPUs of the racks served.",
            min=1,
            max=256,
        ),
    ] = None,
    hostname: Annotated[
        str | None, typer.Option(help="Agent and Celery node name (default celery@<host>); unique per agent.")
    ] = None,
    with_notifier: Annotated[
        bool,
        typer.Option(
            "--with-notifier",
            help="Also deliver webhooks and e-mail (as `ipucloud notifier` would, with "
            "IPUCLOUD_NOTIFIER_CONCURRENCY threads of its own) from this process: `ipucloud up` does, "
            "to save a process.",
        ),
    ] = False,
) -> None:
    """Run a host agent: drives every attempt placed on the racks it serves, on the emulated IPU."""
    if queues is not None:
        from scheduler.routing import parse_queues

        try:
            queues = ",".join(parse_queues(queues))
        except ValueError as exc:
            err.print(f"[red]--queues {exc}[/]")
            raise typer.Exit(2)
        # The worker registers what it serves from its settings: the flag must become the setting.
        os.environ["IPUCLOUD_WORKER_QUEUES"] = queues
        reset_settings_cache()
    settings = _settings_or_exit()
    _configure_logging(settings)
    _preflight(settings)
    from workers.app import app as celery_app

    if with_notifier:
        from workers import notifier

        notifier.run_inside(celery_app)
    argv = [
        "worker",
        "--queues",
        settings.worker_queues,
        "--concurrency",
        str(concurrency or settings.worker_concurrency),
        # Threads, not processes: every delivery hands its attempt to this process's one agent.
        "--pool",
        "threads",
        "--loglevel",
        settings.log_level,
        "--without-gossip",
        "--without-mingle",
    ]
    if hostname:
        argv += ["--hostname", hostname]
    celery_app.worker_main(argv)


def migrate() -> None:
    """Apply database migrations (idempotent)."""
    from scheduler.db import Database
    from scheduler.migrate import head_revision, upgrade
    from scheduler.services.tenancy import tenants

    settings = _settings_or_exit()
    _configure_logging(settings)
    from ipucloud.preflight import wait_for_database

    if not settings.embedded and not settings.database_url:
        # Without this, production would quietly migrate a local SQLite file nobody else uses.
        err.print("[red]Cannot migrate:[/] IPUCLOUD_DATABASE_URL is not set (needed outside `ipucloud up`).")
        raise typer.Exit(3)
    try:
        wait_for_database(settings, require_migrated=False)
    except ConfigError as exc:
        err.print(f"[red]Cannot migrate:[/] {exc}")
        raise typer.Exit(3)
    upgrade(settings.db_url)
    db = Database(settings.db_url)
    with db.write() as s:
        tenants.seed_plans(session=s)
    db.dispose()
    err.print(f"Database at revision {head_revision()}.")


def bootstrap(
    pods: Annotated[
        int, typer.Option(help="Make sure the fleet has at least this many POD64s.", min=0, max=1024)
    ] = 0,
    machine: Annotated[
        str, typer.Option(help="Machine type of added POD64s (see --fleet for others).")
    ] = "m2000",
    fleet: Annotated[
        str | None,
        typer.Option(help="Make sure the fleet has at least these units, e.g. 4xm2000,2xbow,8xdss8440."),
    ] = None,
    admin_key_file: Annotated[
        Path | None, typer.Option(help="Write a new admin key here (mode 0600) if none exists yet.")
    ] = None,
) -> None:
    """Seed a production database: fleet racks and the first admin key (printed once)."""
    from scheduler.db import Database
    from scheduler.services.capacity import fleet as fleet_service
    from scheduler.services.tenancy import tenants
    from scheduler.settings import write_private
    from vipu.topology import parse_fleet_description

    try:
        groups = parse_fleet_description(fleet) if fleet else ()
    except ValueError as exc:
        err.print(f"[red]--fleet: {exc}[/]")
        raise typer.Exit(2)
    settings = _settings_or_exit()
    _preflight(settings, require_migrated=True)
    db = Database(settings.db_url)
    with db.write() as s:
        tenants.seed_plans(session=s)
        added = fleet_service.seed_fleet(session=s, pods=pods, machine_type=machine) if pods else 0
        added_units = fleet_service.ensure_fleet(session=s, groups=groups) if groups else 0
        key = tenants.ensure_admin_key(session=s, secret=settings.secret())
    db.dispose()
    if added:
        err.print(f"Added {added} POD64s of {machine}.")
    if added_units:
        err.print(f"Added {added_units} PODs and servers.")
    if key is not None:
        if admin_key_file is not None:
            write_private(admin_key_file, key + "\n")
            err.print(f"Admin key written to {admin_key_file}.")
        else:
            print(key)
    else:
        err.print("An admin key already exists; nothing printed.")


def register(app: typer.Typer) -> None:
    app.command()(up)
    app.command()(api)
    app.command("vipu-server")(vipu_server)
    app.command()(scheduler)
    app.command()(worker)
    app.command()(migrate)
    app.command()(bootstrap)
