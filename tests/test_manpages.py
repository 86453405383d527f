"""man/ is generated from the CLI's --help; this fails when they drift."""

from __future__ import annotations

from pathlib import Path

from evsel import manpages

MAN = Path(__file__).resolve().parent.parent / "man"


def test_man_pages_match_help():
    wanted = manpages.pages()
    present = {p.name: p.read_text() for p in MAN.glob("*.1")}
    drifted = sorted(n for n in set(wanted) | set(present) if wanted.get(n) != present.get(n))
    assert not drifted, f"run: python -m evsel.manpages man/  (drifted: {drifted})"


def test_every_command_has_a_page():
    names = set(manpages.pages())
    for expected in ("evsel.1", "evsel-ingest.1", "evsel-ask.1", "evsel-docs-list.1", "evsel-models-info.1"):
        assert expected in names


def test_pages_document_completion_and_rerank():
    """Made from the Typer app's command tree: the root page has shell completion, ask's the reranker."""
    wanted = manpages.pages()
    assert "\\-\\-install\\-completion" in wanted["evsel.1"]
    assert "\\-\\-rerank METHOD" in wanted["evsel-ask.1"] and "\\-\\-rerank\\-top N" in wanted["evsel-ask.1"]
