"""The CLI's client path stays light: `evsel --version`, `--help`, and `docs list` and `ask` sent to
a running daemon import no numpy, torch, sqlite_utils or evsel.engine; `--version`, `docs list` and
`ask` to a running daemon not even Typer or rich (evsel.commands.forward), whose outcome is the
Typer app's, errors included (tests/test_path_parity.py). What they import is read from
`python -X importtime`; no timing is asserted. And the request declarations (evsel.requests) are
what the engine takes and what both parsers read."""

from __future__ import annotations

import inspect
import io
import subprocess
import sys

import pytest

from daemon_helpers import daemon_home, evsel, status  # noqa: F401  (a fixture)

HEAVY = ("numpy", "torch", "sqlite_utils", "evsel.engine", "evsel.pipeline", "transformers", "pydantic")
# what evsel.commands.forward and `--version` leave out: the command tree and the terminal renderer
TYPER_AND_RICH = ("typer", "rich", "evsel.commands.typer_cli", "evsel.commands.base")


def imported(*args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run `python -X importtime -m evsel ARGS`; the result and every module it imported."""
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "evsel", *args], capture_output=True,
                            text=True, timeout=300)
    modules = {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines()
               if line.startswith("import time:") and line.count("|") == 2}
    assert "evsel.cli" in modules, result.stderr[-2000:]  # importtime's report was read
    return result, modules


def heavy(modules: set[str], names: tuple[str, ...] = HEAVY) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in names))


def test_version_and_help_import_nothing_heavy():
    for args in (["--version"], ["--help"], ["ask", "--help"]):
        result, modules = imported(*args)
        assert result.returncode == 0, result.stderr[-2000:]
        assert heavy(modules) == [], args
    result, modules = imported("--version")
    assert result.stdout == "evsel, version 0.1.0\n"
    # answered before anything but the package itself is imported
    assert sorted(m for m in modules if m.startswith("evsel")) == ["evsel", "evsel.cli"]
    assert heavy(modules, TYPER_AND_RICH) == []


def test_commands_sent_to_a_running_daemon_import_nothing_heavy(daemon_home):  # noqa: F811
    evsel("daemon", "start", "--no-preload")
    evsel("ingest", evsel("sample").stdout.strip())
    result, modules = imported("docs", "list")
    assert result.returncode == 0 and "The Gull Point Light" in result.stdout, result.stderr[-2000:]
    assert heavy(modules, HEAVY + TYPER_AND_RICH) == []
    result, modules = imported("ask", "Who keeps the light?", "--evidence-only", "--select", "bm25")
    assert result.returncode == 0 and "Evidence (bm25" in result.stdout, result.stderr[-2000:]
    assert heavy(modules, HEAVY + TYPER_AND_RICH) == []
    # the client checks a request before queueing it, still without the engine (or Typer)
    result, modules = imported("ask", "Who keeps the light?", "--select", "nosuch")
    assert result.returncode == 1 and "unknown selector 'nosuch'" in result.stderr
    assert heavy(modules, HEAVY + TYPER_AND_RICH) == []
    # a mistake in the options is the Typer app's to report (its usage line and wording)
    result, modules = imported("ask", "Who keeps the light?", "--top-n", "x")
    assert result.returncode == 2 and "Invalid value for '--top-n'" in result.stderr
    assert "typer" in modules and heavy(modules) == []
    # the daemon answered the ask (and never saw the refused one)
    assert [r["method"] for r in status(daemon_home)["recent"]].count("ask") == 1


def test_the_engine_takes_the_declared_requests():
    """`Engine.ask` takes an `AskRequest`; every other request's declared fields are its method's
    parameters, in order, with the same defaults."""
    from dataclasses import MISSING

    from evsel.engine import Engine
    from evsel.requests import REQUEST, AskRequest

    assert list(inspect.signature(Engine.ask).parameters) == ["self", "request", "on_event"]
    assert inspect.signature(Engine.ask).parameters["request"].annotation in (AskRequest, "AskRequest")
    for name, request in REQUEST.items():
        if name == "ask":
            continue
        engines = {p.name: p.default for p in inspect.signature(getattr(Engine, name)).parameters.values()
                   if p.name not in ("self", "on_event")}
        declared = {f.name: inspect.Parameter.empty if f.default is MISSING else f.default for f in request.fields}
        assert list(declared) == list(engines) and declared == engines, f"Engine.{name}: {engines}"


PARTS = [
    [("plain words, a colon: and (brackets)", None)],
    [("Answer:", "bold"), (" the keeper", None), (" ", None), ("(person, passage #1)", "dim"), ("\n", None)],
    [("[bold]not markup[/]", None)], [("a :smile: code", None)], [("time:now:", "dim")], [("a\ttab", None)],
    [("back\\slash", None)], [("ends in a backslash\\", "bold")], [("control \x1b[2J here", None)],
    [("café “quotes” 日本語", None)], [("", "bold underline"), (" trailing  ", None)],
    [("\n", None), ("#1", "cyan"), (" ", None), ("rank 1 | score 2.000", "dim"), ("\n", None), ("Title", "bold")],
]


@pytest.mark.parametrize("parts", PARTS, ids=range(len(PARTS)))
def test_a_line_written_without_rich_is_what_rich_writes(parts, monkeypatch):
    """`show` on a pipe: the same text as rich's console printing the line's markup."""
    from evsel.commands import output

    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    piped = io.StringIO()
    monkeypatch.setattr(sys, "stdout", piped)
    output.show(parts, output.DeferredConsole(soft_wrap=True, highlight=False))
    by_rich = io.StringIO()
    output.safe_console_class()(file=by_rich, soft_wrap=True, highlight=False).print(output.markup(parts))
    assert piped.getvalue() == by_rich.getvalue()


@pytest.mark.parametrize("rows", [
    [["1", "default", "book", "The Gull Point Light", "115", "/a/b.md"], ["12", "x", "pdf", "T", "3", "/c.pdf#2"]],
    [["1", "odd", "book", "Odd [bold]title[/] :smile:", "1", "/o.md"]],
    [["1", "odd", "book", "日本語のタイトル", "1", "/w.md"], ["2", "odd", "book", " padded ", "", "/p.txt"]],
], ids=["plain", "markup", "wide"])
def test_a_table_written_without_rich_is_what_rich_writes(rows, monkeypatch):
    from rich.table import Table

    from evsel.commands import output

    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    columns = ("id", "collection", "kind", "title", "chunks", "path")
    piped = io.StringIO()
    monkeypatch.setattr(sys, "stdout", piped)
    output.show_table(columns, rows)
    monkeypatch.undo()
    table = Table(box=None, pad_edge=False)
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(output.escape(cell) for cell in row))
    by_rich = io.StringIO()
    output.safe_console_class()(file=by_rich, width=100_000, highlight=False).print(table)
    assert piped.getvalue() == by_rich.getvalue()


def test_both_parsers_read_their_options_from_the_request_declarations():
    """Every option of `ask` and `docs list` but --help and --list-methods is a field of the
    command's request (or of `Output`), with the field's default and help, and evsel.commands.forward
    reads exactly those options."""
    from evsel.cli import cli
    from evsel.commands import forward
    from evsel.requests import AskRequest, DocsListRequest, Output, spec

    for command, declaration in ((cli.commands["ask"], AskRequest),
                                 (cli.commands["docs"].commands["list"], DocsListRequest)):
        table, _ = forward.options(declaration, Output)
        typer_options = {opt: param for param in command.params for opt in getattr(param, "opts", ())
                         if opt.startswith("--") and opt not in ("--help", "--list-methods")}
        assert {opt: param.name for opt, param in typer_options.items()} == {opt: f for opt, (f, _) in table.items()}
        for opt, param in typer_options.items():
            owner = Output if param.name == "as_json" else declaration
            assert param.help == spec(owner, param.name).help_text, opt
            assert param.default == getattr(owner, param.name), opt


@pytest.mark.parametrize("args", [["docs", "list"], ["ask", "Who keeps the light?", "--evidence-only"]])
def test_ctrl_c_in_a_forwarded_command_is_reported_as_the_typer_app_reports_it(args, capsys, monkeypatch, tmp_path):
    """Ctrl-C while a forwarded request waits for its reply: the same lines and exit code (130)
    as through the Typer app."""
    from daemon_helpers import run_cli, use_daemon

    from evsel.commands import forward
    from evsel.daemon.client import DaemonClient

    use_daemon(monkeypatch, tmp_path)

    def interrupted(self, method, params, on_event=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(DaemonClient, "call", interrupted)
    through_forward = run_cli(capsys, *args)
    monkeypatch.setattr(forward, "forwarded", lambda args: None)
    through_typer = run_cli(capsys, *args)
    assert through_forward == through_typer
    assert through_forward[0] == 130 and through_forward[2] == "\nevsel: error: interrupted\n"
