"""One pipeline: `ask` and `eval` rank through the same code, `ask --rerank` reranks the first
stage's top candidates, and `eval` leaves the user's store untouched."""

from __future__ import annotations

import json
import sqlite3

import pytest

from evsel.cli import main
from evsel.pipeline import PipelineSpec
from evsel.requests import AskRequest, EvalRequest, option

# the options as their requests declare them
RERANK_TOP, EVAL_RERANK_TOP = option(AskRequest, "rerank_top"), option(EvalRequest, "rerank_top")

PLACES = [
    ("Lighthouse", "The lighthouse keeper lit the lamp every evening at dusk and wound the brass clockwork."),
    ("Orchard", "In the orchard the old gardener grafted pear branches onto quince roots each spring."),
    ("Harbour", "Fishing boats came back to the harbour at noon, loaded with mackerel and herring."),
    ("School", "The village school had one classroom, a stove, and a teacher who loved geography."),
    ("Mill", "The water mill ground barley for the whole valley until the river froze in January."),
    ("Market", "On market day the square filled with cheese sellers, potters and a travelling dentist."),
    ("Chapel", "The chapel bell was rung by the miller's daughter whenever a boat was late at the harbour."),
    ("Forge", "The smith at the forge shod the mill horses and mended the lighthouse railings."),
]
QUESTION = "Which boats came back to the harbour loaded with herring?"


def _village(tmp_path):
    body = "\n\n".join(f"## {name}\n\n{text} " + "Nothing else happened there that year. " * 5
                       for name, text in PLACES)
    path = tmp_path / "village.md"
    path.write_text(f"# The Village\n\n{body}\n", encoding="utf-8")
    return path


def _ask(capsys, *args) -> dict:
    code = main(["ask", "--json", "--evidence-only", *args])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


def _store_rows(home) -> dict:
    conn = sqlite3.connect(home / "evsel.db")
    try:
        tables = [r[0] for r in conn.execute("select name from sqlite_master where type = 'table'")]
        return {t: sorted(map(repr, conn.execute(f"select * from {t}").fetchall())) for t in tables}
    finally:
        conn.close()


@pytest.mark.parametrize("rerank", [None, "random", "dense"])
def test_ask_and_eval_give_the_same_top_n(tmp_path, capsys, rerank):
    document = _village(tmp_path)
    assert main(["ingest", str(document)]) == 0
    capsys.readouterr()
    # the same first stage as eval's below (with no --select a book runs the fusion)
    options = ["--select", "bm25", "--top-n", "3"] + (["--rerank", rerank, RERANK_TOP, "4"] if rerank else [])
    asked = _ask(capsys, QUESTION, *options)
    asked_spans = sorted((e["char_start"], e["char_end"]) for e in asked["evidence"])

    rows = [{"id": "q", "question": QUESTION, "answer": "fishing boats", "document": "village.md",
             "evidence": ["loaded with mackerel and herring"]}]
    dataset = tmp_path / "village.jsonl"
    dataset.write_text(json.dumps(rows[0]) + "\n", encoding="utf-8")
    method = "bm25" if rerank is None else f"bm25>{rerank}"
    code = main(["eval", str(dataset), "--methods", method, "--k", "3", "--top-n", "3", EVAL_RERANK_TOP, "4",
                 "--per-question", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out)
    record = result["per_question"][method][0]
    # eval's chunks are made in memory by the same chunker: map its top ids to their spans
    from evsel.engine import Engine
    from evsel.evaluation.datasets import load_dataset
    from evsel.evaluation.runner import build_corpus

    engine = Engine()
    corpus = build_corpus(load_dataset(str(dataset)), [str(document.resolve())], engine.backbone, 140)
    by_id = {c.id: (c.char_start, c.char_end) for c in corpus.chunks[str(document.resolve())]}
    eval_spans = sorted(by_id[i] for i in record["top"][:3])
    assert asked_spans == eval_spans
    if rerank:
        assert asked["method"]["rerank"] == rerank and asked["method"]["rerank_top"] == 4
        assert "rerank_s" in asked["timings"]


def test_rerank_reorders_only_the_first_stage_top(tmp_path, capsys):
    assert main(["ingest", str(_village(tmp_path))]) == 0
    capsys.readouterr()
    plain = _ask(capsys, QUESTION, "--top-n", "8")
    by_rank = sorted(plain["evidence"], key=lambda e: e["rank"])
    top2 = {e["chunk_id"] for e in by_rank[:2]}
    reranked = _ask(capsys, QUESTION, "--top-n", "2", "--rerank", "random", RERANK_TOP, "2")
    assert {e["chunk_id"] for e in reranked["evidence"]} == top2  # the same two, in the reranker's order


def test_rerank_errors_are_one_line(tmp_path, capsys):
    assert main(["ingest", str(_village(tmp_path))]) == 0
    capsys.readouterr()
    assert main(["ask", QUESTION, "--rerank", "nonsense"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("evsel: error: unknown selector 'nonsense'") and err.count("\n") == 1
    assert main(["ask", QUESTION, "--rerank", "random", RERANK_TOP, "0"]) == 1
    assert f"{RERANK_TOP} 0 must be at least 1" in capsys.readouterr().err


def test_spec_parsing():
    spec = PipelineSpec.parse("bm25>dense").method
    assert (spec.first.selector, spec.rerank.selector, spec.rerank.argument) == ("bm25", "dense", None)
    spec = PipelineSpec.parse("rrf:dense").method
    assert (spec.first.selector, spec.first.argument, spec.rerank) == ("rrf", "dense", None)
    spec = PipelineSpec.parse("bm25 > qrranker:untrained,causal").method
    assert spec.rerank.text == "qrranker:untrained,causal" and spec.rerank.variants == ["untrained", "causal"]
    assert spec.name == "bm25 > qrranker:untrained,causal" and not spec.memory  # named as given
    with pytest.raises(Exception, match="FIRST>RERANKER"):
        PipelineSpec.parse("bm25>")


def test_eval_leaves_the_users_store_unchanged(tmp_path, capsys, evsel_home):
    document = _village(tmp_path)
    assert main(["ingest", str(document)]) == 0
    capsys.readouterr()
    before = _store_rows(evsel_home)
    dataset = tmp_path / "village.jsonl"
    dataset.write_text(json.dumps({"question": QUESTION, "answer": "boats", "document": "village.md",
                                   "evidence": ["loaded with mackerel and herring"]}) + "\n", encoding="utf-8")
    assert main(["eval", str(dataset), "--methods", "bm25,dense,bm25>dense", "--json"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert _store_rows(evsel_home) == before
    # dense embeddings of the benchmark text went to eval's own cache instead
    conn = sqlite3.connect(evsel_home / "cache" / "eval.db")
    try:
        assert conn.execute("select count(*) from chunk_states where method = 'dense'").fetchone()[0] > 0
    finally:
        conn.close()
