"""The CLI's client path stays light: `evsel --version`, `--help`, and `docs list` and `ask` sent to
a running daemon import no numpy, torch, sqlite_utils or evsel.engine (what they import is read
from `python -X importtime`; no timing is asserted). And the request signatures the client checks
against (evsel.api) are the engine's."""

from __future__ import annotations

import inspect
import subprocess
import sys

from daemon_helpers import daemon_home, evsel, status  # noqa: F401  (a fixture)

HEAVY = ("numpy", "torch", "sqlite_utils", "evsel.engine", "evsel.pipeline", "transformers", "pydantic")


def imported(*args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run `python -X importtime -m evsel ARGS`; the result and every module it imported."""
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "evsel", *args], capture_output=True,
                            text=True, timeout=300)
    modules = {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines()
               if line.startswith("import time:") and line.count("|") == 2}
    assert "evsel.cli" in modules, result.stderr[-2000:]  # importtime's report was read
    return result, modules


def heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


def test_version_and_help_import_nothing_heavy():
    for args in (["--version"], ["--help"], ["ask", "--help"]):
        result, modules = imported(*args)
        assert result.returncode == 0, result.stderr[-2000:]
        assert heavy(modules) == [], args
    assert "rich" not in imported("--version")[1]  # printed by Typer alone


def test_commands_sent_to_a_running_daemon_import_nothing_heavy(daemon_home):  # noqa: F811
    evsel("daemon", "start", "--no-preload")
    evsel("ingest", evsel("sample").stdout.strip())
    result, modules = imported("docs", "list")
    assert result.returncode == 0 and "The Gull Point Light" in result.stdout, result.stderr[-2000:]
    assert heavy(modules) == []
    result, modules = imported("ask", "Who keeps the light?", "--evidence-only")
    assert result.returncode == 0 and "Evidence (bm25" in result.stdout, result.stderr[-2000:]
    assert heavy(modules) == []
    # the client checks a request before queueing it, still without the engine
    result, modules = imported("ask", "Who keeps the light?", "--select", "nosuch")
    assert result.returncode == 1 and "unknown selector 'nosuch'" in result.stderr
    assert heavy(modules) == []
    # the daemon answered the ask (and never saw the refused one)
    assert [r["method"] for r in status(daemon_home)["recent"]].count("ask") == 1


def test_the_request_tables_signatures_are_the_engines():
    from evsel.api import REQUEST, REQUESTS
    from evsel.engine import Engine

    for name in REQUESTS:
        ours, engines = REQUEST[name].signature, inspect.signature(getattr(Engine, name))
        assert ours.return_annotation == engines.return_annotation, name
        assert list(ours.parameters) == list(engines.parameters), f"update evsel/api.py: Engine.{name}{engines}"
        for mine, theirs in zip(ours.parameters.values(), engines.parameters.values()):
            assert (mine.kind, mine.annotation) == (theirs.kind, theirs.annotation), f"Engine.{name}: {theirs}"
            if callable(theirs.default):
                assert callable(mine.default), f"Engine.{name}: {theirs}"
            else:
                assert mine.default == theirs.default, f"Engine.{name}: {theirs}"
    assert sorted(REQUESTS) == sorted(n for n in REQUESTS if inspect.isfunction(getattr(Engine, n, None)))
