"""What every evsel command is built from: a Typer app whose commands read, print and fail the
way evsel's command line always has.

Typer renders help its own way (`--top-n <int>`, `{question}`, an Arguments section, commands in
creation order, defaults and env variables on every option) and words some errors differently
(pydantic's "Input should be a valid integer", "Try 'evsel ask -h'", "extra argument(s)"). evsel's
help, usage lines and errors are a contract (scripts, the man pages, the tests), so:

- `App` is a `typer.Typer` whose groups and commands are `Group` and `Command`: help in Click's
  layout (`--top-n INTEGER ... [default: 5]`, arguments only in the usage line, commands sorted),
  Click's wording for extra arguments and unknown commands, and Ctrl-C reported as an interrupt;
- the value parsers (`INT`, `FLOAT`, `BOOL`, `choice(...)`, `path(...)`) check and convert a value
  exactly as Click's types did, with their messages; pass them as `parser=`;
- `show_usage_error` prints a usage error as Click did;
- values are converted without pydantic (`_Coercion`): Typer builds a pydantic TypeAdapter for each
  parameter of a command it runs, and importing pydantic took longer than the rest of `evsel docs
  list` through the daemon.

Otherwise only public names are used: `typer`, the command and parameter classes of `typer.core`,
and Click's public methods and attributes on them. The gap this module fills: Typer bundles its
own Click (it does not depend on `click`, and evsel imports no `click`) and documents no way to
reach three things evsel needs, each reached in one place here: the usage-error classes (found by
name under the exported `typer.TyperException`, `_typer_exception`); a parameter's value
conversion (no hook: a parameter's class becomes a subclass that overrides the public
`get_runtime_param`, `_light_coercion`); and the `parser=` a parameter was declared with, which
Typer keeps only on its `type_descriptor` (`parameter_info`, `file_annotation`; read by
`_Coercion` and `_option_metavar`).
"""

from __future__ import annotations

import os
import stat
from difflib import get_close_matches
from gettext import ngettext
from typing import Any

import typer
from typer import BadParameter, TyperException, echo, format_filename
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from .output import visible

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 88}


def _typer_exception(name: str) -> type[TyperException]:
    """A class of Typer's bundled Click's errors that Typer does not export, by name, among the
    subclasses of the one it does."""
    found, stack = None, [TyperException]
    while stack and found is None:
        cls = stack.pop()
        found = cls if cls.__name__ == name else None
        stack.extend(cls.__subclasses__())
    if found is None:
        raise ImportError(f"typer has no {name} error: this typer is not one evsel supports")
    return found


ClickException = _typer_exception("ClickException")  # what Click shows and exits with (exit code 1)
UsageError = _typer_exception("UsageError")  # a usage error (exit code 2), shown by show_usage_error
NoSuchOption = _typer_exception("NoSuchOption")
NoArgsIsHelpError = _typer_exception("NoArgsIsHelpError")


# values: Click's types, as Typer parsers


class _Parser:
    metavar = "TEXT"  # how help shows the value, as Click named its types

    def __call__(self, value: Any) -> Any:
        raise NotImplementedError


class _Number(_Parser):
    def __init__(self, number: type, name: str):
        self.number, self.name, self.metavar = number, name, name.upper()

    def __call__(self, value: Any) -> Any:
        if isinstance(value, self.number) and not isinstance(value, bool):
            return value
        try:
            return self.number(value)
        except ValueError:
            raise BadParameter(f"{value!r} is not a valid {self.name}.") from None


class _Bool(_Parser):
    """A flag's value from its environment variable (EVSEL_NO_DAEMON=1)."""

    metavar = "BOOLEAN"
    states = {"1": True, "0": False, "yes": True, "no": False, "true": True, "false": False, "on": True,
              "off": False, "t": True, "f": False, "y": True, "n": False, "": False}

    def __call__(self, value: Any) -> bool:
        if isinstance(value, bool):
            return value
        state = self.states.get(str(value).strip().lower())
        if state is None:
            raise BadParameter(f"{value!r} is not a valid boolean. Recognized values: "
                               f"{', '.join(sorted(self.states))}")
        return state


class _Choice(_Parser):
    def __init__(self, choices):
        self.choices = tuple(choices)
        self.metavar = f"[{'|'.join(self.choices)}]"

    def __call__(self, value: Any) -> str:
        if value in self.choices:
            return value
        listed = ", ".join(map(repr, self.choices))
        if len(self.choices) == 1:
            raise BadParameter(f"{value!r} is not {listed}.")
        raise BadParameter(f"{value!r} is not one of {listed}.")


class _Path(_Parser):
    def __init__(self, exists: bool, file_okay: bool, dir_okay: bool, path_type: type | None):
        self.exists, self.file_okay, self.dir_okay, self.path_type = exists, file_okay, dir_okay, path_type
        self.name = "file" if file_okay and not dir_okay else "directory" if dir_okay and not file_okay else "path"
        self.metavar = self.name.upper()

    def __call__(self, value: Any) -> Any:
        where = f"{self.name.title()} {format_filename(value)!r}"
        try:
            mode = os.stat(value).st_mode
        except OSError:
            if self.exists:
                raise BadParameter(f"{where} does not exist.") from None
            return self._typed(value)
        if not self.file_okay and stat.S_ISREG(mode):
            raise BadParameter(f"{where} is a file.")
        if not self.dir_okay and stat.S_ISDIR(mode):
            raise BadParameter(f"{where} is a directory.")
        if not os.access(value, os.R_OK):
            raise BadParameter(f"{where} is not readable.")
        return self._typed(value)

    def _typed(self, value: Any) -> Any:
        if self.path_type is not None and not isinstance(value, self.path_type):
            return self.path_type(value)
        return value


INT = _Number(int, "integer")
FLOAT = _Number(float, "float")
BOOL = _Bool()


def choice(choices) -> _Parser:
    """One of `choices`, case-sensitive; help shows [a|b|c]."""
    return _Choice(choices)


def path(*, exists: bool = False, file_okay: bool = True, dir_okay: bool = True, path_type: type | None = None):
    """A path checked as Click's Path type did (kept as typed unless `path_type` is given)."""
    return _Path(exists, file_okay, dir_okay, path_type)


class _Coercion:
    """A parameter's runtime coercion (what Typer's `get_runtime_param()` returns), equal to
    Typer's for what evsel's parameters get: no value, a value for one of the parsers above (the
    TypeAdapter Typer builds for a parser only calls it), or a string for a `str` parameter (kept as
    it is). Anything else, and a parser's ValueError (which pydantic words), goes to Typer's own
    (`typers`: the parameter's own `get_runtime_param`, built on first use)."""

    def __init__(self, descriptor, typers):
        self.descriptor = descriptor
        self.typers = typers

    def coerce(self, value: Any, param, ctx) -> Any:
        multi = param.multiple or param.nargs == -1
        if value is None:
            return () if multi else None
        info = self.descriptor.parameter_info
        if self.descriptor.file_annotation is None and not (multi and isinstance(value, str)):
            try:
                if isinstance(info.parser, _Parser):
                    if multi:
                        return [info.parser(item) for item in (value if isinstance(value, (list, tuple)) else [value])]
                    return info.parser(value)
                if self.descriptor.annotation is str and type(value) is str and not multi:
                    return value
            except (ValueError, AssertionError):
                pass
        return self.typers().coerce(value, param=param, ctx=ctx)  # pydantic: only for what evsel never passes


def _light_runtime_param(param, typers) -> _Coercion:
    """The parameter's `_Coercion`, made once; `typers`: Typer's own `get_runtime_param`."""
    if getattr(param, "light_coercion", None) is None:
        param.light_coercion = _Coercion(param.type_descriptor, typers)
    return param.light_coercion


# Typer's parameter classes with `get_runtime_param()` returning `_Coercion` (subclasses of one
# class each: a parameter made by Typer can become one)
class _LightOption(TyperOption):
    def get_runtime_param(self):
        return _light_runtime_param(self, super().get_runtime_param)


class _LightArgument(TyperArgument):
    def get_runtime_param(self):
        return _light_runtime_param(self, super().get_runtime_param)


def _light_coercion(params) -> None:
    """Before a command's values are read (Typer appends the completion options after building it):
    Typer makes its parameters itself, with no hook for their class or their conversion, so each
    becomes its light subclass here."""
    for param in params:
        if getattr(param, "type_descriptor", None) is None:
            continue
        if type(param) is TyperOption:
            param.__class__ = _LightOption
        elif type(param) is TyperArgument:
            param.__class__ = _LightArgument


def _with_light_coercion(help_option):
    """Typer's --help option (made on first use, after the command's parameters)."""
    if help_option is not None:
        _light_coercion([help_option])
    return help_option


# help and usage in Click's layout


def _argument_metavar(param: TyperArgument) -> str:
    if param.metavar is not None:
        return param.metavar
    metavar = param.name.upper()
    if not param.required:
        metavar = f"[{metavar}]"
    return metavar + ("..." if param.nargs != 1 else "")


def _option_metavar(param: TyperOption) -> str:
    if param.metavar is not None:
        return param.metavar
    parser = param.type_descriptor.parameter_info.parser
    metavar = getattr(parser, "metavar", "TEXT")
    return metavar + ("..." if param.nargs != 1 else "")


def _without_prefix(opt: str) -> str:
    first = opt[:1]
    if first.isalnum():
        return opt
    return opt[2:] if opt[1:2] == first else opt[1:]


def _join_options(opts: list[str]) -> tuple[str, bool]:
    """Click's join_options: the spellings, shortest prefix first, and whether one starts with "/"."""
    prefixes = [opt[:len(opt) - len(_without_prefix(opt))] for opt in opts]
    ranked = sorted(zip(prefixes, opts), key=lambda pair: len(pair[0]))
    return ", ".join(opt for _, opt in ranked), "/" in prefixes


def _option_record(param: TyperOption, ctx: typer.Context) -> tuple[str, str] | None:
    if param.hidden:
        return None
    slashes = False

    def spelled(opts: list[str]) -> str:
        nonlocal slashes
        text, any_slashes = _join_options(opts)
        slashes = slashes or any_slashes
        return text if param.is_flag or param.count else f"{text} {_option_metavar(param)}"

    spec = [spelled(param.opts)] + ([spelled(param.secondary_opts)] if param.secondary_opts else [])
    extra = []
    default = param.default
    if isinstance(param.show_default, str):
        extra.append(f"default: ({param.show_default})")
    elif param.show_default and default is not None:
        if isinstance(default, (list, tuple)):
            text = ", ".join(str(d) for d in default)
        elif param.is_bool_flag and param.secondary_opts:
            text = _without_prefix((param.opts if default else param.secondary_opts)[0])
        elif param.is_bool_flag and not default:
            text = ""
        elif default == "":
            text = '""'
        else:
            text = str(default)
        if text:
            extra.append(f"default: {text}")
    if param.required:
        extra.append("required")
    help = param.help or ""
    if extra:
        help = f"{help}  [{'; '.join(extra)}]" if help else f"[{'; '.join(extra)}]"
    return ("; " if slashes else " / ").join(spec), help


def _usage_pieces(command, ctx: typer.Context) -> list[str]:
    pieces = [command.options_metavar] if command.options_metavar else []
    return pieces + [_argument_metavar(p) for p in command.get_params(ctx) if isinstance(p, TyperArgument)]


def _format_options(command, ctx: typer.Context, formatter) -> None:
    rows = [r for p in command.get_params(ctx) if isinstance(p, TyperOption) and (r := _option_record(p, ctx))]
    if rows:
        with formatter.section("Options"):
            formatter.write_dl(rows)


def _possibilities(names: list[str]) -> str:
    listed = ", ".join(repr(n) for n in sorted(names))
    return f"Did you mean {listed}?" if len(names) == 1 else f"(Did you mean one of: {listed}?)"


class Command(TyperCommand):
    """A Typer command with Click's help layout and wording."""

    def format_help(self, ctx, formatter) -> None:
        super(TyperCommand, self).format_help(ctx, formatter)  # the plain layout, no markup pass

    def collect_usage_pieces(self, ctx) -> list[str]:
        return _usage_pieces(self, ctx)

    def format_options(self, ctx, formatter) -> None:
        _format_options(self, ctx, formatter)

    def get_help_option(self, ctx):
        return _with_light_coercion(super().get_help_option(ctx))

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        _light_coercion(self.params)
        strict = not ctx.allow_extra_args
        ctx.allow_extra_args = True  # extra arguments are reported below, in Click's words
        try:
            rest = super().parse_args(ctx, args)
        finally:
            ctx.allow_extra_args = not strict
        if rest and strict and not ctx.resilient_parsing:
            ctx.fail(ngettext("Got unexpected extra argument ({args})", "Got unexpected extra arguments ({args})",
                              len(rest)).format(args=" ".join(map(str, rest))))
        return rest


class Group(TyperGroup):
    """A Typer group with Click's help layout (commands sorted), wording and Ctrl-C handling."""

    def format_help(self, ctx, formatter) -> None:
        super(TyperGroup, self).format_help(ctx, formatter)

    def collect_usage_pieces(self, ctx) -> list[str]:
        return _usage_pieces(self, ctx) + [self.subcommand_metavar]

    def format_options(self, ctx, formatter) -> None:
        _format_options(self, ctx, formatter)
        self.format_commands(ctx, formatter)

    def list_commands(self, ctx) -> list[str]:
        return sorted(self.commands)

    def get_help_option(self, ctx):
        return _with_light_coercion(super().get_help_option(ctx))

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        _light_coercion(self.params)
        return super().parse_args(ctx, args)

    def resolve_command(self, ctx, args: list[str]):
        try:
            return super().resolve_command(ctx, args)
        except UsageError as exc:
            name = args[0] if args else ""
            matches = get_close_matches(name, list(self.commands))
            if matches and exc.message == f"No such command {name!r}.":
                exc.message = f"{exc.message} {_possibilities(matches)}"
            raise

    def invoke(self, ctx):
        # Typer turns Ctrl-C into a silent exit 130; Click raised Abort, which evsel reports
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as exc:
            echo(err=True)  # the blank line closes the terminal's ^C echo
            raise typer.Abort() from exc


class App(typer.Typer):
    """`typer.Typer` for evsel: `Group` and `Command` classes, Click-style help, no rich output or
    pretty tracebacks (evsel prints its own one-line errors), help for a bare group."""

    def __init__(self, **kwargs: Any):
        kwargs.setdefault("cls", Group)
        kwargs.setdefault("no_args_is_help", True)
        kwargs.setdefault("rich_markup_mode", None)
        kwargs.setdefault("pretty_exceptions_enable", False)
        kwargs.setdefault("suggest_commands", False)  # Group.resolve_command suggests, in Click's words
        kwargs.setdefault("add_completion", False)
        super().__init__(**kwargs)

    def command(self, name: str | None = None, *, cls: type[TyperCommand] | None = None, **kwargs: Any):
        return super().command(name, cls=cls or Command, **kwargs)


# errors


def show_usage_error(exc: UsageError) -> None:
    """Print a usage error on stderr as Click did: the usage line, "Try 'evsel ask --help' for
    help.", then "Error: ..." (a bare group prints its help instead)."""
    ctx = exc.ctx
    if isinstance(exc, NoArgsIsHelpError):
        echo(ctx.get_help(), err=True)
        return
    if isinstance(exc, NoSuchOption) and exc.message == f"No such option: {exc.option_name}":
        exc.message = f"No such option {exc.option_name!r}."
        if exc.possibilities:
            exc.message += " " + _possibilities(list(exc.possibilities))
        exc.possibilities = None
    if isinstance(exc, BadParameter) and exc.param_hint is None and isinstance(exc.param, TyperArgument):
        exc.param_hint = f"'{_argument_metavar(exc.param)}'"  # Click named an argument as its usage does
    if ctx is not None:
        hint = ""
        if ctx.command.get_help_option(ctx) is not None:
            names = ctx.command.get_help_option_names(ctx)
            hint = f"Try '{ctx.command_path} {max(names, key=len)}' for help.\n"
        echo(f"{ctx.get_usage()}\n{hint}", err=True, color=ctx.color)
    # the message may quote an argument: a file name from a shell glob, with control characters
    echo(f"Error: {visible(exc.format_message())}", err=True, color=ctx.color if ctx is not None else None)
