"""How a run of `evsel` ends when it does not end well: Ctrl-C, stdout's reader gone, stdout full.
The entry point (evsel.cli) and the Typer app (typer_cli.py) end the same way through these."""

from __future__ import annotations

import os
import sys


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
