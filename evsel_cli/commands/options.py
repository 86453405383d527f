"""Typer options built from the request declarations (evsel.requests): a field's spelling, help,
metavar, choices and default are written there once, and a command reads them from here.

`declared(Request, "field")` is one field as a Typer option (or argument), for a command whose
option differs from the field in type (eval's comma-separated `--methods` is the request's list);
`with_request(Request)` gives a command every field the command line sets, and hands it the
request built from their values.
"""

from __future__ import annotations

import functools
import inspect
import typing
from dataclasses import MISSING, fields
from typing import Annotated, Any, List, Optional

import typer

from evsel.requests import option, spec

from .base import FLOAT, INT, choice


def _parser(hint: Any, choices: tuple[str, ...] | None):
    """The value parser (commands/base.py) a field of this type takes: Click's INTEGER for an int,
    a choice for the declared choices, none for text and flags."""
    if choices:
        return choice(choices)
    inner = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    item = typing.get_args(inner[0])[0] if typing.get_origin(inner[0]) is list else inner[0]
    return {int: INT, float: FLOAT}.get(item)


def declared(request: type, name: str, **changes: Any):
    """The field `name` of `request` as a `typer.Option` (a `typer.Argument` for an argument): its
    declared spelling, help, metavar and value parser; `changes` adds or replaces keywords
    (`parser=path(...)`, `envvar=...`)."""
    field_spec = spec(request, name)
    hint = typing.get_type_hints(request)[name]
    keywords = {"help": field_spec.help_text, "metavar": field_spec.metavar,
                "parser": _parser(hint, field_spec.choices)}
    keywords.update(changes)
    keywords = {key: value for key, value in keywords.items() if value is not None}
    if field_spec.argument:
        return typer.Argument(**keywords)
    return typer.Option(option(request, name), **keywords)


def _typer_type(hint: Any) -> Any:
    """The annotation Typer reads for a field's type (`Optional[List[int]]` for `list[int] | None`)."""
    args = typing.get_args(hint)
    optional = type(None) in args
    inner = next((a for a in args if a is not type(None)), hint) if optional else hint
    if typing.get_origin(inner) is list:
        inner = List[typing.get_args(inner)[0]]
    return Optional[inner] if optional else inner


def with_request(request: type, **changes: dict):
    """Make a command `def command(ctx, request, *own options)` into one whose parameters are
    ctx, then every field of `request` that the command line sets (`declared`, in declaration
    order; `changes[field]` as `declared` takes them), then the command's own; it is called with
    `request` built from the fields' values and the fields no option sets at their defaults."""
    hints = typing.get_type_hints(request)
    cli_fields = [f for f in fields(request) if spec(request, f.name).cli]
    defaults = {f.name: None if f.default is MISSING else f.default for f in cli_fields}

    def wrap(command):
        own = [p for p in inspect.signature(command).parameters.values() if p.name != "request"]
        params = [own[0]] + [
            inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                              annotation=Annotated[_typer_type(hints[f.name]),
                                                   declared(request, f.name, **changes.get(f.name, {}))],
                              default=inspect.Parameter.empty if f.default is MISSING else f.default)
            for f in cli_fields] + own[1:]

        @functools.wraps(command)
        def run(ctx: typer.Context, **values: Any):
            given = {f.name: values.pop(f.name) for f in cli_fields}
            # a repeatable option's values come as a tuple (empty when not given): the request holds a
            # list, or the field's default
            given = {name: (list(value) or defaults[name]) if isinstance(value, (tuple, list)) else value
                     for name, value in given.items()}
            return command(ctx, request=request(**given), **values)

        run.__signature__ = inspect.Signature(params)
        run.__annotations__ = {p.name: p.annotation for p in params}
        return run

    return wrap
