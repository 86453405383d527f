"""`evsel man`: the manual pages, wherever evsel runs (they are also installed for man(1))."""

# annotations are evaluated at import: Typer reads them all at start-up (commands/__init__.py)

import os
import shutil
import subprocess
import tempfile
from typing import Annotated, List, Optional

import typer

from . import manpages
from evsel.errors import EvselError
from evsel.commands.output import stdout


def man(
    ctx: typer.Context,
    command: Annotated[Optional[List[str]], typer.Argument(metavar="[COMMAND]...")] = None,
    roff: Annotated[bool, typer.Option("--roff", help="Print the page's roff source (e.g. for man -l -).")] = False,
):
    """Show the manual page of evsel or of COMMAND (evsel man ask, evsel man docs show).

    On a terminal with man(1) the page opens in it; otherwise it is printed as plain text. After
    pip install the same pages are installed for man(1): man evsel, man evsel-ask.
    """
    name = manpages.page_name(list(command or ()))
    root = ctx.find_root()  # the whole command tree this `man` runs in
    page = manpages.pages(root.command, root.help_option_names).get(name)
    if page is None:
        raise EvselError(f"no manual page for 'evsel {' '.join(command or ())}'",
                         "see evsel --help for the commands")
    if roff:
        typer.echo(page, nl=False)
        return
    viewer = shutil.which("man")
    if stdout.is_terminal and viewer:
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, name)
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(page)
            raise typer.Exit(subprocess.run([viewer, "-l", path]).returncode)
    typer.echo(manpages.plain_text(page), nl=False)
