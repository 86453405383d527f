"""Options shared by several commands, declared once."""

from __future__ import annotations

import click

json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
collection_option = click.option(
    "--collection", metavar="NAME", default=None, help="Restrict to one collection."
)


def no_daemon(ctx: click.Context) -> bool:
    """--no-daemon / EVSEL_NO_DAEMON=1: run the engine in this process instead of the daemon."""
    import os

    obj = ctx.find_root().obj or {}
    if "no_daemon" in obj:
        return bool(obj["no_daemon"])
    return os.environ.get("EVSEL_NO_DAEMON", "").strip().lower() in ("1", "true", "yes", "on")


def engine_from(ctx: click.Context):
    """The engine for a command: the daemon's (started if needed), or an in-process one.

    Both have the same methods and return the same results; the daemon's keeps the model loaded.
    """
    obj = ctx.find_root().obj or {}
    if no_daemon(ctx):
        from evsel.engine import Engine

        return Engine(model=obj.get("model"), device=obj.get("device", "auto"))
    from evsel.daemon.client import DaemonClient

    return DaemonClient(model=obj.get("model"), device=obj.get("device", "auto"))
