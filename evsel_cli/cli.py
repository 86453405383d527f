"""The `evsel` command: a thin door into the engine."""

# annotations are evaluated at import: Typer reads them all at start-up (commands/__init__.py)

import os
import sys
from typing import Annotated, Literal, Optional

import typer

from . import __version__, settings
from .commands import corpus, daemon, docs, models, train
from .commands.ask import ask
from .commands.base import BOOL, CONTEXT_SETTINGS, App, ClickException, UsageError, choice, show_usage_error
from .commands.eval import eval_command
from .commands.ingest import ingest
from .commands.man import man
from .errors import EvselError, user_message
from .output import error

__all__ = ["CONTEXT_SETTINGS", "app", "cli", "main"]

app = App(context_settings=CONTEXT_SETTINGS, add_completion=True)


def _version(ctx: typer.Context, value: Optional[bool]) -> None:
    if not value or ctx.resilient_parsing:
        return
    typer.echo(f"evsel, version {__version__}")
    ctx.exit()


@app.callback()
def evsel(
    ctx: typer.Context,
    version: Annotated[Optional[bool], typer.Option(
        "--version", callback=_version, is_eager=True, expose_value=False,
        help="Show the version and exit.")] = None,
    device: Annotated[Literal["auto", "cpu", "cuda"], typer.Option(
        "--device", envvar="EVSEL_DEVICE", show_envvar=False, parser=choice(["auto", "cpu", "cuda"]),
        help="Where the backbone runs (env EVSEL_DEVICE).")] = "auto",
    model: Annotated[Optional[str], typer.Option(
        "--model", metavar="PATH", envvar="EVSEL_MODEL", show_envvar=False,
        help="A local GGUF file or HF model folder instead of the bundled SmolLM2 (env EVSEL_MODEL).")] = None,
    no_daemon: Annotated[bool, typer.Option(
        "--no-daemon", envvar="EVSEL_NO_DAEMON", show_envvar=False, parser=BOOL,
        help="Run in this process instead of the resident daemon; same results, but the model "
             "loads every time (env EVSEL_NO_DAEMON=1).")] = False,
):
    """Ask questions about long documents; the evidence is chosen by the LLM that answers.

    State lives in EVSEL_HOME (default: the platform's user data directory). Commands run in a
    background daemon that keeps the model loaded (started on first use; see evsel daemon).
    """
    # what the commands read (commands.common); the request's Settings are resolved from it on
    # first use (commands.common.settings)
    ctx.obj = {"device": device, "model": model, "no_daemon": no_daemon}


app.command("ingest")(ingest)
app.command("ask")(ask)
app.add_typer(docs.app, name="docs")
app.command("eval")(eval_command)
app.add_typer(models.app, name="models")
app.command("sample")(models.sample)
app.add_typer(train.app, name="train")
app.add_typer(daemon.app, name="daemon")
app.add_typer(corpus.app, name="corpus")
app.command("watch")(daemon.watch)
app.command("man")(man)

# the Click command tree Typer builds from the app: what main() runs and the man pages document
cli = typer.main.get_command(app)


def main(argv: list[str] | None = None) -> int:
    # everything evsel writes holds the user's text or questions: the home 0700, its files 0600
    os.umask(os.umask(0o077) | 0o077)
    try:
        # without standalone mode the command returns ctx.exit(n)'s code instead of raising it
        code = cli.main(args=argv, prog_name="evsel", standalone_mode=False)
        if isinstance(code, int) and not isinstance(code, bool):
            return code
    except typer.Exit as exc:
        return exc.exit_code
    except UsageError as exc:
        show_usage_error(exc)
        return exc.exit_code
    except ClickException as exc:
        exc.show()
        return exc.exit_code
    except (typer.Abort, KeyboardInterrupt) as exc:  # Click turns Ctrl-C into an Abort raised from it
        interrupt = exc.__cause__ or exc
        stored = getattr(interrupt, "stored_files", None)  # an ingest's files stored before it stopped
        error("interrupted" + ("" if stored is None else
                               f"; stored before it: {', '.join(stored)}" if stored else "; nothing stored"))
        return 130
    except EvselError as exc:
        error(exc.line())
        return exc.exit_code
    except BrokenPipeError:
        return 0
    except Exception as exc:
        if settings.debug():
            raise
        error(user_message(exc))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
