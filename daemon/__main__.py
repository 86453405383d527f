"""`python -m evsel.daemon`: how the CLI starts a detached daemon.

Kept apart from `evsel daemon run` so the detaching (a fork, then a new session, so the daemon
is nobody's child and leaves no zombie) happens before anything heavy is imported.
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evsel.daemon")
    parser.add_argument("--detach", action="store_true", help="fork into the background and return at once")
    parser.add_argument("--idle-timeout", type=float, default=None)
    parser.add_argument("--no-preload", action="store_true")
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args(argv)
    os.umask(os.umask(0o077) | 0o077)  # the store, log and socket are the user's alone (0600, 0700)
    if args.detach:
        if os.fork() > 0:
            return 0  # the launcher: the client waits for the socket, not for us
        os.setsid()
    from evsel.errors import EvselError

    from . import runtime

    try:
        home = runtime.files()
        runtime.check_home_private(home.home)
        lock = runtime.HomeLock(home.lock)
        if not lock.acquire():
            return 0  # another client started one a moment ago; it will answer
        from .server import DEFAULT_IDLE_TIMEOUT, Daemon

        from evsel import settings

        idle = args.idle_timeout if args.idle_timeout is not None else settings.daemon_idle_timeout(
            DEFAULT_IDLE_TIMEOUT)
        daemon = Daemon(idle_timeout=idle, preload=not args.no_preload, model=args.model, device=args.device)
        daemon.lock = lock
        return daemon.run()
    except EvselError as exc:
        print(f"evsel: error: {exc.line()}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
