"""The `evsel` command tree: the Typer app, the Click command it builds (what `evsel --help` and
the man pages show), and how it runs. evsel.cli runs it for every command it does not answer
without Typer."""

# annotations are evaluated at import: Typer reads them all at start-up (commands/__init__.py)

from typing import Annotated, Literal, Optional

import typer

from evsel import __version__

from . import corpus, daemon, docs, models, train
from .ask import ask
from .base import BOOL, CONTEXT_SETTINGS, App, ClickException, UsageError, choice, show_usage_error
from .eval import eval_command
from .exits import closed_stdout, interrupted
from .ingest import ingest
from .man import man

__all__ = ["CONTEXT_SETTINGS", "app", "cli", "run"]

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

# the Click command tree Typer builds from the app: what run() runs and the man pages document
cli = typer.main.get_command(app)


class _ClosedPipe(Exception):
    """stdout's reader went away: not an OSError, so that Click's own EPIPE exit (1) is not taken."""


def _invoke(ctx, _invoke=cli.invoke):
    try:
        return _invoke(ctx)
    except BrokenPipeError as exc:
        raise _ClosedPipe from exc


cli.invoke = _invoke


def run(argv: list[str] | None = None) -> int:
    """Run the command tree on `argv` (None: the process's arguments); Typer's and Click's errors
    and exits are handled here, evsel's own by evsel.cli.main."""
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
    except typer.Abort as exc:  # Click turns Ctrl-C into an Abort raised from it
        return interrupted(exc.__cause__ or exc)
    except _ClosedPipe:
        return closed_stdout()  # as the daemon's fast path does
    return 0
