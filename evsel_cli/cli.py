"""The `evsel` command's entry point.

`evsel --version`, and `docs list` and `ask` sent to the daemon (evsel.forward), run without
importing Typer or rich: each of those costs about as much as the interpreter's own start-up.
Everything else runs the Typer command tree (evsel.typer_cli), imported on first use, as do
`app`, `cli` and `CONTEXT_SETTINGS` read from here. The output and the errors are the same
either way (tests/test_startup_imports.py).
"""

from __future__ import annotations

import os
import sys

from . import __version__

__all__ = ["CONTEXT_SETTINGS", "app", "cli", "closed_stdout", "interrupted", "main"]

_TYPER_NAMES = ("app", "cli", "CONTEXT_SETTINGS")


def __getattr__(name: str):
    if name in _TYPER_NAMES:
        from . import typer_cli

        return getattr(typer_cli, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def interrupted(interrupt: BaseException) -> int:
    """Report Ctrl-C (and what an ingest stored before it) and give the exit code."""
    from .output import error

    stored = getattr(interrupt, "stored_files", None)  # an ingest's files stored before it stopped
    error("interrupted" + ("" if stored is None else
                           f"; stored before it: {', '.join(stored)}" if stored else "; nothing stored"))
    return 130


def closed_stdout() -> int:
    """stdout's reader went away (`evsel ask ... | head -c 20`): exit 0 with nothing on stderr,
    through the daemon's fast path and the Typer app alike; stdout now goes to /dev/null so the
    interpreter's last flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)
    except (OSError, ValueError, AttributeError):  # not a file descriptor (a test's capture)
        pass
    return 0


def stdout_full(exc: OSError) -> bool:
    """Whether a failed write with no file named was stdout's: a full device or disk behind it
    (`> /dev/full`), not the store's (whose errors name their file or come from SQLite)."""
    import errno
    import stat

    if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or exc.filename:
        return False
    try:
        fd = sys.stdout.fileno()
        mode = os.fstat(fd).st_mode
        if stat.S_ISCHR(mode):
            return True
        if stat.S_ISREG(mode):
            disk = os.fstatvfs(fd)
            return disk.f_bavail * disk.f_frsize < (1 << 20)
    except (OSError, ValueError, AttributeError):
        pass
    return False


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args == ["--version"]:
        try:
            sys.stdout.write(f"evsel, version {__version__}\n")
            sys.stdout.flush()
        except BrokenPipeError:
            pass
        return 0
    # everything evsel writes holds the user's text or questions: the home 0700, its files 0600
    os.umask(os.umask(0o077) | 0o077)
    # imported here, after `--version` would have been answered (it needs none of them)
    from . import settings
    from .errors import EvselError, user_message
    from .output import error

    try:
        from .forward import forwarded

        code = forwarded(args)
        if code is None:
            from .typer_cli import run

            code = run(argv)
        return code
    except KeyboardInterrupt as exc:
        return interrupted(exc)
    except EvselError as exc:
        error(exc.line())
        return exc.exit_code
    except BrokenPipeError:
        return closed_stdout()
    except Exception as exc:
        if settings.debug():
            raise
        if isinstance(exc, OSError) and stdout_full(exc):
            error(f"standard output is full ({exc.strerror}): the output was not written; free space where it "
                  "goes, or send it elsewhere")
            return 1
        error(user_message(exc))
        return 1


if __name__ == "__main__":
    sys.exit(main())
