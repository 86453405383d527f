"""Options shared by several commands, declared once, and the engine a command talks to."""

from __future__ import annotations

from typing import Annotated

import typer

from evsel.requests import Output

from .options import declared

JsonOption = Annotated[bool, declared(Output, "as_json")]


def no_daemon(ctx: typer.Context) -> bool:
    """--no-daemon / EVSEL_NO_DAEMON=1: run the engine in this process instead of the daemon."""
    return settings(ctx).no_daemon


def engine_from(ctx: typer.Context, **changes):
    """The engine for a command, with this request's settings (`changes` override some): the
    daemon's (started if needed), or an in-process one. Both have the same requests and return
    the same results; the daemon's keeps the model loaded."""
    resolved = settings(ctx)
    if changes:
        resolved = resolved.with_(**changes)
    if resolved.no_daemon:
        from evsel.engine import Engine

        return Engine(resolved)
    from evsel.daemon.client import DaemonClient

    return DaemonClient(resolved)


def settings(ctx: typer.Context):
    """This request's `evsel.settings.Settings`: the global options (`--model`, `--device`,
    `--no-daemon`, as the root callback stored them), then EVSEL_* variables, then defaults.

    Resolved on first use and kept for the request, so a command that never asks for it is not
    failed by an EVSEL_* value only other commands read.
    """
    root = ctx.find_root()
    if "evsel.settings" not in root.meta:
        from evsel.settings import Settings

        obj = root.obj or {}
        root.meta["evsel.settings"] = Settings.resolve(model=obj.get("model"), device=obj.get("device"),
                                                       no_daemon=obj.get("no_daemon"))
    return root.meta["evsel.settings"]
