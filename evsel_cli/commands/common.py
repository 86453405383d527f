"""Options shared by several commands, declared once, and the engine a command talks to."""

from __future__ import annotations

import os
import time
from typing import Annotated, Optional

import typer

JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]
CollectionOption = Annotated[
    Optional[str], typer.Option("--collection", metavar="NAME", help="Restrict to one collection.")
]


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


_COMMAND_STARTED = time.perf_counter()  # when this module was imported: the fallback for process_seconds


def process_seconds() -> float:
    """Wall time since this process started (interpreter start-up, imports, connecting to or
    starting the daemon, its queue, the work and the reply): the time a user waited."""
    try:
        with open(f"/proc/{os.getpid()}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: start time in ticks after boot
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return time.perf_counter() - _COMMAND_STARTED


def wall_timings(engine, timings: dict) -> dict:
    """A result's engine timings with the wall time the client saw: `queued_s` (the daemon's queue;
    0 in-process), `run_s` (the daemon ran the request), `engine_s` (the engine's own total) and
    `total_s`, this process's whole wall time."""
    meta = getattr(engine, "last_meta", None) or {}
    out = dict(timings)
    if "total_s" in out:
        out["engine_s"] = out.pop("total_s")
    out["queued_s"] = round(float(meta.get("queue_s", 0.0)), 4)
    if "run_s" in meta:
        out["run_s"] = round(float(meta["run_s"]), 4)
    out["total_s"] = round(process_seconds(), 4)
    return out
