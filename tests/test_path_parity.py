"""The two ways a command reaches one running daemon give the same outcome: evsel.commands.forward
(the fast path, no Typer) and the Typer app. Each case runs both ways through main() in this
process against one daemon started once for the module, on documents whose text rich's markup
would change (brackets, an emoji code, a tab, backslashes, wide characters) and on plain ones, on
a pipe and with FORCE_COLOR. The outcome is read from what the command states: its exit code, its
stdout (the JSON document where --json is given) and its error and warning lines (or Typer's usage
block), never from progress rows, whose number depends on the machine's load.

Whole processes on both paths (a closed pipe, a full disk, an ASCII stdout, shell completion) are
test_hardening4.py's; what the fast path imports is test_startup_imports.py's."""

from __future__ import annotations

import contextlib
import io

import pytest

from daemon_helpers import kill_daemon, outcome, run_cli, use_daemon
from evsel.paths import sample_story_path

QUESTION = "Who keeps the light?"
ODD = ("# Odd [bold]title[/] :smile:\n\nThe keeper said: \"time:now:\" and [red]nothing[/] at\tall.\n\n"
       "A backslash \\ here, café, “quotes”. Who keeps the light? The keeper keeps the light.\n")

CASES = [
    ["docs", "list"], ["docs", "list", "--json"], ["docs", "list", "--collection", "default"],
    ["docs", "list", "--collection=odd"], ["docs", "list", "--collection", "nosuch"],
    ["docs", "list", "--collection"], ["docs", "list", "extra"],
    ["ask", QUESTION, "--evidence-only"], ["ask", QUESTION, "--evidence-only", "--collection", "default"],
    ["ask", QUESTION, "--evidence-only", "--collection", "odd", "--top-n", "3"],
    ["ask", QUESTION, "--evidence-only", "--doc", "2", "--doc", "4", "--json"],
    ["ask", QUESTION, "--evidence-only", "--select", "random", "--top-n=2"],
    ["ask", QUESTION, "--select", "nosuch"], ["ask", QUESTION, "--evidence-only", "--rerank", "nosuch"],
    ["ask", QUESTION, "--evidence-only", "--doc", "99"], ["ask", QUESTION, "--style", "nosuch"],
    ["ask", QUESTION, "--evidence-only", "--top-n", "x"], ["ask", QUESTION, "--evidence-only", "--bogus"],
    ["ask", QUESTION, "--evidence-only", "--top-n", "3", "--top-n", "2"], ["ask", "--evidence-only"],
]

# a usage mistake, or an option given twice (Typer takes the last; the fast path reads each once)
LEFT_TO_TYPER = [["docs", "list", "--collection"], ["docs", "list", "extra"], ["ask", QUESTION, "--style", "nosuch"],
                 ["ask", QUESTION, "--evidence-only", "--top-n", "x"], ["ask", QUESTION, "--evidence-only", "--bogus"],
                 ["ask", QUESTION, "--evidence-only", "--top-n", "3", "--top-n", "2"], ["ask", "--evidence-only"]]


def _quietly(*args: str) -> None:
    """main(ARGS) for the module's set-up, its output dropped; it must succeed."""
    from evsel.cli import main

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        assert main(list(args)) == 0, (args, err.getvalue())


@pytest.fixture(scope="module")
def shared_home(tmp_path_factory, model_cache):
    """One daemon for the module, with the sample in `default` and three odd documents in `odd`;
    the default method's states are computed here, so each case does the same work both ways."""
    home = tmp_path_factory.mktemp("path-parity") / "evsel-home"
    folder = tmp_path_factory.mktemp("path-parity-docs")
    (folder / "odd.md").write_text(ODD)
    (folder / "wide.md").write_text("# 日本語のタイトル\n\n灯台守は誰ですか。The keeper keeps the light.\n")
    (folder / "plain.txt").write_text("Plain notes\n\nThe keeper keeps the light, said the plain note.\n")
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("EVSEL_MODEL_CACHE", str(model_cache))
            env.setenv("EVSEL_QRRANKER_KV", "0")
            for name in ("EVSEL_MODEL", "EVSEL_DEVICE", "FORCE_COLOR", "TTY_COMPATIBLE"):
                env.delenv(name, raising=False)
            use_daemon(env, home)
            _quietly("daemon", "start", "--no-preload")
            _quietly("ingest", str(sample_story_path()))
            _quietly("ingest", *(str(folder / name) for name in ("odd.md", "wide.md", "plain.txt")),
                     "--collection", "odd")
            for scope in ([], ["--collection", "odd"]):
                _quietly("ask", QUESTION, "--evidence-only", *scope)
        yield home
    finally:
        kill_daemon(home)


@pytest.fixture
def home(shared_home, monkeypatch):
    use_daemon(monkeypatch, shared_home)
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    return shared_home


def _both_ways(capsys, args: list[str]) -> tuple[tuple, tuple, bool]:
    """The outcome of main(ARGS) through the fast path, then through the Typer app, and whether the
    fast path ran the command (it leaves what it does not read exactly to Typer); the output
    consoles are made afresh for each (rich reads FORCE_COLOR when it makes one)."""
    from evsel.commands import forward, output

    fast_path, taken = forward.forwarded, []

    def recorded(args: list[str]):
        taken.append(fast_path(args))
        return taken[-1]

    got = []
    with pytest.MonkeyPatch.context() as patch:
        for path in (recorded, lambda args: None):  # the fast path, then every command to the Typer app
            patch.setattr(forward, "forwarded", path)
            for console in (output.stdout, output.stderr):
                patch.setattr(console, "made", None)
            got.append(outcome(*run_cli(capsys, *args)))
    return got[0], got[1], taken != [None]


@pytest.mark.parametrize("force_color", [False, True], ids=["pipe", "FORCE_COLOR"])
@pytest.mark.parametrize("args", CASES, ids=[" ".join(case) for case in CASES])
def test_the_fast_path_and_the_typer_app_give_the_same_outcome(home, capsys, monkeypatch, args, force_color):
    if force_color:
        monkeypatch.setenv("FORCE_COLOR", "1")
    else:
        monkeypatch.delenv("FORCE_COLOR", raising=False)
    forwarded, typer_app, fast = _both_ways(capsys, args)
    assert forwarded == typer_app, args
    # the fast path runs what it reads exactly and leaves the rest, every mistake included, to Typer
    assert fast == (args not in LEFT_TO_TYPER), args


def test_the_odd_documents_text_is_printed_as_it_is(home, capsys, monkeypatch):
    """What rich would read as markup or an emoji code reaches stdout as the documents have it."""
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    code, shown, _ = run_cli(capsys, "ask", QUESTION, "--evidence-only", "--collection", "odd")
    assert code == 0 and "日本語" in shown and "😄" in shown and "[red]nothing[/]" in shown
