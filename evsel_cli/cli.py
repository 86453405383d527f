"""The `evsel` command's entry point.

`evsel --version`, and `docs list` and `ask` sent to the daemon (evsel.commands.forward), run
without importing Typer or rich: each of those costs about as much as the interpreter's own
start-up. Everything else runs the Typer command tree (evsel.commands.typer_cli), imported on
first use, as do `app`, `cli` and `CONTEXT_SETTINGS` read from here. The output and the errors are the same
either way (tests/test_startup_imports.py).
"""

from __future__ import annotations

import os
import sys

from . import __version__

__all__ = ["CONTEXT_SETTINGS", "app", "cli", "main"]

_TYPER_NAMES = ("app", "cli", "CONTEXT_SETTINGS")


def __getattr__(name: str):
    if name in _TYPER_NAMES:
        from .commands import typer_cli

        return getattr(typer_cli, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    from .commands.exits import closed_stdout, interrupted, stdout_full
    from .commands.output import error
    from .errors import EvselError, user_message

    try:
        from .commands.forward import forwarded

        code = forwarded(args)
        if code is None:
            from .commands.typer_cli import run

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
