"""The `evsel` command: a thin door into the engine."""

from __future__ import annotations

import os
import sys

import click

from . import __version__
from .commands.ask import ask
from .commands.daemon import daemon, watch
from .commands.docs import docs
from .commands.eval import eval_command
from .commands.ingest import ingest
from .commands.models import models, sample
from .commands.train import train
from .errors import EvselError, user_message
from .output import error

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 88}


@click.group(context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, prog_name="evsel")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", envvar="EVSEL_DEVICE",
              show_default=True, help="Where the backbone runs (env EVSEL_DEVICE).")
@click.option("--model", metavar="PATH", envvar="EVSEL_MODEL", default=None,
              help="A local GGUF file or HF model folder instead of the bundled SmolLM2 (env EVSEL_MODEL).")
@click.option("--no-daemon", is_flag=True, envvar="EVSEL_NO_DAEMON",
              help="Run in this process instead of the resident daemon; same results, but the model "
                   "loads every time (env EVSEL_NO_DAEMON=1).")
@click.pass_context
def cli(ctx, device, model, no_daemon):
    """Ask questions about long documents; the evidence is chosen by the LLM that answers.

    State lives in EVSEL_HOME (default: the platform's user data directory). Commands run in a
    background daemon that keeps the model loaded (started on first use; see evsel daemon).
    """
    ctx.obj = {"device": device, "model": model, "no_daemon": no_daemon}


cli.add_command(ingest)
cli.add_command(ask)
cli.add_command(docs)
cli.add_command(eval_command)
cli.add_command(models)
cli.add_command(sample)
cli.add_command(train)
cli.add_command(daemon)
cli.add_command(watch)


def main(argv: list[str] | None = None) -> int:
    try:
        # without standalone mode click returns ctx.exit(n)'s code instead of raising it
        code = cli.main(args=argv, prog_name="evsel", standalone_mode=False)
        if isinstance(code, int) and not isinstance(code, bool):
            return code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        error("interrupted")
        return 130
    except KeyboardInterrupt:
        error("interrupted")
        return 130
    except EvselError as exc:
        error(exc.line())
        return exc.exit_code
    except BrokenPipeError:
        return 0
    except Exception as exc:
        if os.environ.get("EVSEL_DEBUG"):
            raise
        error(user_message(exc))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
