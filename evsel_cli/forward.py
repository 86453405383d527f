"""`evsel docs list` and `evsel ask` sent to the daemon without the Typer app.

Importing Typer (and the command tree it builds) costs about twice the interpreter's own start-up,
more than the daemon takes to answer `docs list` or an evidence-only `ask`. So when the arguments
are ones this module reads exactly as the Typer app would (known options, each at most once, values
that convert, no global option, no variable standing in for one, no help), the request is sent and
its reply printed by the code the Typer commands run (evsel.commands.replies). Anything else,
including every mistake, returns None before anything is sent, and the Typer app runs the command
as always, with its help and its error messages.
"""

from __future__ import annotations

import sys

from evsel import settings
from evsel.api import REQUEST
from evsel.defaults import STYLES

# options the Typer app reads from the environment (--model, --device, --no-daemon): with any of
# them set, the app resolves and checks them
_GLOBAL_VARIABLES = ("EVSEL_MODEL", "EVSEL_DEVICE", "EVSEL_NO_DAEMON")
# set by the shell's completion script: the Typer app completes the words, nothing is run
_COMPLETION_VARIABLE = "_EVSEL_COMPLETE"
_FLAG = "flag"

# per command: {option: (parameter, how its value is read)}, as commands/ask.py and docs.py declare them
DOCS_LIST_OPTIONS = {"--collection": ("collection", str), "--json": ("as_json", _FLAG)}
ASK_OPTIONS = {
    "--doc": ("doc_ids", int), "--collection": ("collection", str), "--top-n": ("top_n", int),
    "--select": ("select", str), "--rerank": ("rerank", str), "--rerank-top": ("rerank_top", int),
    "--memory": ("memory", _FLAG), "--evidence-only": ("evidence_only", _FLAG),
    "--max-new-tokens": ("max_new_tokens", int), "--style": ("style", STYLES), "--corpus": ("corpus", str),
    "--json": ("as_json", _FLAG),
}
_REPEATABLE = ("doc_ids",)


def _read(value: str, kind):
    """An option's value as Typer converts it (int() as commands/base.py's INT, a choice exactly)."""
    if kind is int:
        return int(value)
    if isinstance(kind, tuple) and value not in kind:
        raise ValueError(value)
    return value


def parse(args: list[str], options: dict, positionals: int) -> tuple[list[str], dict] | None:
    """(positional arguments, {parameter: value}) as Typer reads `args`, or None for anything this
    reader leaves to it: an unknown option, one given twice, a value that does not convert or
    starts with "-", a missing value, a wrong number of arguments, "--"."""
    found, values = [], {}
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if not arg.startswith("-") and arg:
            found.append(arg)
            continue
        name, given, inline = arg.partition("=")
        if name not in options:
            return None
        parameter, kind = options[name]
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
        if parameter in _REPEATABLE:
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
        parsed, command = parse(args[2:], DOCS_LIST_OPTIONS, 0), "docs_list"
    elif args[:1] == ["ask"]:
        parsed, command = parse(args[1:], ASK_OPTIONS, 1), "ask"
    else:
        return None
    if parsed is None or settings.variables_named(_GLOBAL_VARIABLES + (_COMPLETION_VARIABLE,)):
        return None
    found, values = parsed
    from evsel.daemon.client import DaemonClient
    from evsel.settings import Settings

    from .commands import replies

    # what the Typer app's root callback passes when no global option is given
    engine = DaemonClient(Settings.resolve(model=None, device="auto", no_daemon=False))
    as_json = values.pop("as_json", False)
    try:
        if command == "docs_list":
            replies.docs_list(engine, values.get("collection"), as_json)
            return 0
        # every option with its default, as the Typer command passes them
        request = {name: parameter.default for name, parameter in REQUEST["ask"].signature.parameters.items()
                   if name not in ("self", "question", "on_event")}
        request.update(values)
        replies.ask(engine, found[0], as_json, **request)
        return 0
    except KeyboardInterrupt:
        sys.stderr.write("\n")  # as the Typer app (commands/base.py): the blank line closes the terminal's ^C echo
        sys.stderr.flush()
        raise
