"""`evsel docs list` and `evsel ask` sent to the daemon without the Typer app.

Importing Typer (and the command tree it builds) costs about twice the interpreter's own start-up,
more than the daemon takes to answer `docs list` or an evidence-only `ask`. So when the arguments
are ones this module reads exactly as the Typer app would (the options of the same request
declarations the Typer commands are built from, evsel.requests; each at most once, values
that convert, no global option, no variable standing in for one, no help), the request is sent and
its reply printed by the code the Typer commands run (evsel.commands.replies). Anything else,
including every mistake, returns None before anything is sent, and the Typer app runs the command
as always, with its help and its error messages.
"""

from __future__ import annotations

import sys
import typing

from evsel import settings
from evsel.requests import AskRequest, DocsListRequest, Output, option, spec

# options the Typer app reads from the environment (--model, --device, --no-daemon): with any of
# them set, the app resolves and checks them
_GLOBAL_VARIABLES = ("EVSEL_MODEL", "EVSEL_DEVICE", "EVSEL_NO_DAEMON")
# set by the shell's completion script: the Typer app completes the words, nothing is run
_COMPLETION_VARIABLE = "_EVSEL_COMPLETE"
_FLAG = "flag"


def options(*declarations: type) -> tuple[dict, set]:
    """{option: (field, how its value is read)} and the repeatable fields, as commands/options.py
    makes the Typer options of these declarations' fields."""
    table, repeatable = {}, set()
    for declaration in declarations:
        for name, hint in typing.get_type_hints(declaration).items():
            field_spec = spec(declaration, name)
            if field_spec.argument or not field_spec.cli:
                continue
            kinds = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
            kind = kinds[0]
            if typing.get_origin(kind) is list:
                kind = typing.get_args(kind)[0]
                repeatable.add(name)
            table[option(declaration, name)] = (
                name, field_spec.choices or (_FLAG if kind is bool else kind))
    return table, repeatable


def _read(value: str, kind):
    """An option's value as Typer converts it (int() as commands/base.py's INT, a choice exactly)."""
    if kind is int:
        return int(value)
    if isinstance(kind, tuple) and value not in kind:
        raise ValueError(value)
    return value


def parse(args: list[str], table: tuple[dict, set], positionals: int) -> tuple[list[str], dict] | None:
    """(positional arguments, {field: value}) as Typer reads `args`, or None for anything this
    reader leaves to it: an unknown option, one given twice, a value that does not convert or
    starts with "-", a missing value, a wrong number of arguments, "--"."""
    known, repeatable = table
    found, values = [], {}
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if not arg.startswith("-") and arg:
            found.append(arg)
            continue
        name, given, inline = arg.partition("=")
        if name not in known:
            return None
        parameter, kind = known[name]
        if kind == _FLAG:
            if given:
                return None
            value = True
        else:
            if not given:
                if not rest:
                    return None
                inline = rest.pop(0)
            if inline.startswith("-"):
                return None
            try:
                value = _read(inline, kind)
            except ValueError:
                return None
        if parameter in repeatable:
            values.setdefault(parameter, []).append(value)
        elif parameter in values:
            return None
        else:
            values[parameter] = value
    if len(found) != positionals:
        return None
    return found, values


def forwarded(args: list[str]) -> int | None:
    """Run `evsel ARGS` here when it is a `docs list` or `ask` this module reads exactly; its exit
    code, or None when the Typer app must run it (nothing was sent)."""
    if args[:2] == ["docs", "list"]:
        declaration, parsed = DocsListRequest, parse(args[2:], options(DocsListRequest, Output), 0)
    elif args[:1] == ["ask"]:
        declaration, parsed = AskRequest, parse(args[1:], options(AskRequest, Output), 1)
    else:
        return None
    if parsed is None or settings.variables_named(_GLOBAL_VARIABLES + (_COMPLETION_VARIABLE,)):
        return None
    found, values = parsed
    from evsel.daemon.client import DaemonClient
    from evsel.settings import Settings

    from . import replies

    # what the Typer app's root callback passes when no global option is given
    engine = DaemonClient(Settings.resolve(model=None, device="auto", no_daemon=False))
    as_json = values.pop("as_json", False)
    request = declaration(*found, **values)
    try:
        if declaration is DocsListRequest:
            replies.docs_list(engine, request, as_json)
        else:
            replies.ask(engine, request, as_json)
        return 0
    except KeyboardInterrupt:
        sys.stderr.write("\n")  # as the Typer app (commands/base.py): the blank line closes the terminal's ^C echo
        sys.stderr.flush()
        raise
