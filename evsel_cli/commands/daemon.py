"""`evsel daemon start|stop|status|run` and `evsel watch`."""

# annotations are evaluated at import: Typer reads them all at start-up (commands/__init__.py)

from typing import Annotated, Optional

import typer

from evsel.commands.output import escape, print_json, stderr, stdout
from evsel.requests import WatchAddRequest, WatchRemoveRequest

from .base import FLOAT, App, path
from .common import JsonOption, engine_from, settings
from .options import declared

NOT_RUNNING_EXIT = 3  # as `systemctl status` and LSB init scripts say "not running"

IdleOption = Annotated[float, typer.Option(
    "--idle-timeout", envvar="EVSEL_DAEMON_IDLE", show_envvar=False, metavar="SECONDS", parser=FLOAT,
    help="Exit after this long with no clients, requests or watched folders; 0 never exits (env EVSEL_DAEMON_IDLE).",
)]
PreloadOption = Annotated[bool, typer.Option(
    "--no-preload", help="Load the backbone on the first request that needs it, not at start.")]

app = App(help="""The resident daemon: keeps the backbone loaded between commands.

    Every command that needs the engine talks to the daemon over a Unix socket in EVSEL_HOME and
    starts it when it is not running; --no-daemon (env EVSEL_NO_DAEMON=1) runs in-process
    instead, with the same results. Requests that use the model (ingest, ask, ...) queue;
    status and document listings never wait. Log: EVSEL_HOME/daemon.log.
    """)


@app.command("start")
def daemon_start(ctx: typer.Context, idle_timeout: IdleOption = 1800, no_preload: PreloadOption = False):
    """Start the daemon in the background (a daemon of another evsel version is restarted)."""
    from evsel.daemon import client, runtime

    resolved = settings(ctx)
    running = client.status()
    connection, info = client.ensure_daemon(resolved.model, resolved.device, idle_timeout,
                                            preload=not no_preload, on_event=_warn_only)
    connection.close()
    if running is not None and running.get("pid") == info["pid"]:
        stdout.print(f"the evsel daemon is already running (pid {info['pid']})")
    else:
        stdout.print(f"started the evsel daemon (pid {info['pid']}, socket {escape(str(runtime.files().socket))})")


@app.command("stop")
def daemon_stop():
    """Stop the daemon. Requests in flight fail with a message saying to run them again."""
    from evsel.daemon import client

    reply = client.stop()
    if reply is None:
        stderr.print("the evsel daemon is not running")
    else:
        stdout.print(f"stopped the evsel daemon (pid {reply.get('pid')})")


@app.command("status")
def daemon_status(ctx: typer.Context, as_json: JsonOption = False):
    """Show pid, uptime, backbone and device, memory, documents, cache hits, queue and watched folders.

    Exits with status 3 when the daemon is not running (it is not started).
    """
    from evsel.daemon import client

    info = client.status()
    if info is None:
        if as_json:
            print_json({"running": False})
        else:
            stderr.print("the evsel daemon is not running; start it with: evsel daemon start")
        ctx.exit(NOT_RUNNING_EXIT)
    if info.get("home_mode_warning"):
        from evsel.commands.output import warning

        warning(info["home_mode_warning"])  # stderr, so --json's stdout stays one document
    if as_json:
        print_json(info)
        return
    _print_status(info)


@app.command("run")
def daemon_run(ctx: typer.Context, idle_timeout: IdleOption = 1800, no_preload: PreloadOption = False):
    """Run the daemon in the foreground, logging to stderr too (for systemd and launchd).

    The user units shipped in the daemon folder run: evsel daemon run --idle-timeout 0
    """
    from evsel.daemon.server import Daemon

    resolved = settings(ctx)
    Daemon(idle_timeout=idle_timeout, preload=not no_preload, model=resolved.model, device=resolved.device,
           foreground=True).run()


def _warn_only(event: dict) -> None:
    if event.get("type") == "warning":
        stderr.print(f"[yellow]evsel: warning:[/] {escape(event['message'])}")


def _print_status(info: dict) -> None:
    uptime = _duration(info["uptime_s"])
    stdout.print(f"[bold]evsel daemon:[/] running (pid {info['pid']}, up {uptime}, evsel {escape(info['build'])})")
    rows = [("socket", info["socket"]), ("log", info["log"])]
    for b in info["backbones"] or [{"name": "not created yet", "loaded": False}]:
        where = f" on {b['device']} {b['dtype']}" if b.get("device") else ""
        state = f"loaded in {b['load_s']}s" if b.get("loaded") else "not loaded"
        rows.append(("backbone", f"{b['name']}{where} ({state})"))
    if info["preload"] not in ("done", "off"):
        rows.append(("preload", info["preload"]))
    rows.append(("memory", f"{info['memory_mb']} MB resident" if info["memory_mb"] is not None else "unknown"))
    rows.append(("documents", f"{info['documents']} ({info['chunks']} chunks)"))
    cache = info["cache"]
    parts = [f"{kind} {c['hits']}/{c['hits'] + c['misses']} hits" for kind, c in cache.items() if kind != "entries"]
    rows.append(("cache", f"{cache['entries']} entries" + (f"; {', '.join(parts)}" if parts else "")))
    queue = info["queue"]
    running = queue["running"]
    now = f"running {running['method']} ({running['running_s']}s)" if running else "idle"
    rows.append(("queue", f"{now}, {len(queue['waiting'])} waiting"))
    for job in queue.get("background", []):
        progress = job.get("progress") or {}
        # encoders count each text once: a document's repeated chunks (a filing's repeated rows)
        # make this fewer than the chunks ingest reported
        done = f", {progress['done']}/{progress['total']} distinct chunk texts" if progress.get("total") else ""
        if progress.get("label") and progress.get("total"):
            left = f", about {_duration(progress['eta_s'])} left" if progress.get("eta_s") is not None else ""
            done = f", {progress['label']} {progress['done']}/{progress['total']} distinct chunk texts{left}; " \
                   "the default ranks with " \
                   "what is encoded meanwhile"
        rows.append(("background", f"{job['method']} ({'running' if job['running'] else 'queued'}{done})"))
    rows.append(("clients", str(info["clients"])))
    idle = info["idle_timeout_s"]
    rows.append(("idle exit", f"after {_duration(idle)} idle" if idle > 0 else "never"))
    if info["resumed"]:
        rows.append(("resumed", ", ".join(info["resumed"])))
    rows += [("disk full", line) for line in info.get("disk_full", [])]
    for key, value in rows:
        stdout.print(f"[bold]{key}:[/] {escape(str(value))}")
    for w in info["watches"]:
        state = "" if w.get("observing") else " (not observing)"
        stdout.print(f"[bold]watching:[/] {escape(w['path'])} -> {escape(w['collection'])}{state}, "
                     f"{w.get('failed', 0)} failed")
        for f in w.get("failures", []):
            stdout.print(f"  [red]failed[/] {escape(f['error'])}")


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60}m"


def watch(
    ctx: typer.Context,
    # one command for three requests: FOLDER adds a watch, --remove DIR removes one, --list lists them
    folder: Annotated[Optional[str], declared(WatchAddRequest, "path", parser=path())] = None,
    collection: Annotated[str, declared(WatchAddRequest, "collection")] = WatchAddRequest.collection,
    list_watches: Annotated[bool, typer.Option("--list", help="List watched folders and their failed files.")] = False,
    remove: Annotated[Optional[str], declared(WatchRemoveRequest, "path")] = None,
    as_json: JsonOption = False,
):
    """Keep FOLDER ingested: the daemon ingests new and changed files and removes deleted ones.

    Changes are debounced (an editor's burst of saves is one ingest). Watched folders survive
    restarts and are re-synced when the daemon starts. Files that fail to ingest are shown by
    evsel daemon status and evsel watch --list, and logged; the watcher carries on. While any
    folder is watched the daemon does not exit when idle.
    """
    from evsel import paths
    from evsel.errors import EvselError

    chosen = sum(x is not None and x is not False for x in (folder, remove, list_watches or None))
    if chosen != 1:
        raise EvselError("give one of: a FOLDER to watch, --list, or --remove DIR",
                         "e.g. evsel watch ~/papers --collection papers")
    engine = engine_from(ctx)  # in-process the list is only saved; the daemon also watches
    if list_watches:
        rows = engine.watch_list()
        if as_json:
            print_json(rows)
        elif not rows:
            stderr.print("no folders are watched; add one with: evsel watch DIR")
        for w in [] if as_json else rows:
            stdout.print(f"{escape(w['path'])}  [dim]collection {escape(w['collection'])}, "
                         f"{w.get('failed', 0)} failed[/]")
            for f in w.get("failures", []):
                stdout.print(f"  [red]failed[/] {escape(f['error'])}")
        return
    if remove is not None:
        result = engine.watch_remove(paths.watched_path(remove))
        if as_json:
            print_json(result)
        else:
            stderr.print(f"stopped watching {escape(result['path'])} (its documents stay)")
        return
    root = str(paths.watch_folder(folder))  # checked here, so the error names the path as typed
    result = engine.watch_add(root, collection)
    if result["files"] is None:
        note = "saved; the daemon watches it when it runs (evsel daemon start)"
    else:
        note = (f"{result['files']} file(s) are synced in the background; progress and failures: "
                "evsel daemon status")
    if as_json:
        print_json(result)
    else:
        verb = "watching" if result["added"] else "already watching"
        stderr.print(f"{verb} {escape(root)} (collection {escape(collection)}); {note}")
