"""`evsel ingest` and `evsel docs list|show|rm` through the CLI; --json prints exactly one JSON document."""

from __future__ import annotations

import json
from pathlib import Path

import pymupdf
import pytest

from evsel.cli import main
from evsel.paths import sample_story_path
from evsel.store.store import Store


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def one_json(out: str):
    """The whole of stdout is a single JSON document."""
    value, end = json.JSONDecoder().raw_decode(out)
    assert out[end:].strip() == "", f"more than one JSON document on stdout: {out[end:end + 80]!r}"
    return value


@pytest.fixture
def corpus(tmp_path) -> dict[str, Path]:
    root = tmp_path / "corpus"
    (root / "chats").mkdir(parents=True)
    story = root / "story.md"
    story.write_text(sample_story_path().read_text(encoding="utf-8"))
    transcript = root / "chats" / "ferry.txt"
    transcript.write_text(
        "Session 1 (3 March 2024)\nAnn: Did the ferry run today?\nBen: Not in this fog. The captain waited.\n"
        "Session 2 (4 March 2024)\nAnn: And today?\nBen: It left at noon with the mail sacks.\n"
    )
    jsonl = root / "chats" / "support.jsonl"
    jsonl.write_text(
        "\n".join(json.dumps(m) for m in [
            {"role": "user", "content": "My lamp flickers.", "time": "2024-03-05T10:00"},
            {"role": "assistant", "content": "Replace the wick.", "time": "2024-03-05T10:01"},
        ])
    )
    pdf = pymupdf.open()
    for n in range(1, 4):
        pdf.new_page().insert_text((72, 72), f"Tide table page {n}. High water at {n + 5} o'clock.")
    pdf_path = root / "tides.pdf"
    pdf.save(pdf_path)
    pdf.close()
    return {"root": root, "story": story, "transcript": transcript, "jsonl": jsonl, "pdf": pdf_path}


def test_ingest_json_then_unchanged(corpus, capsys):
    paths = [str(corpus[k]) for k in ("story", "transcript", "jsonl", "pdf")]
    code, out, err = run(capsys, "ingest", "--json", *paths)
    assert code == 0
    result = one_json(out)
    assert result["failed"] == 0
    assert [f["status"] for f in result["files"]] == ["ingested"] * 4
    assert [f["path"] for f in result["files"]] == [str(Path(p).resolve()) for p in paths]
    assert all(f["chunks"] > 0 and len(f["doc_ids"]) == 1 for f in result["files"])
    assert "evsel: error" not in err

    code, out, err = run(capsys, "ingest", *paths)
    assert code == 0 and "unchanged " not in err
    assert out.count("unchanged ") == 4  # the summary is the result: stdout


def test_ingest_human_output_and_directories(corpus, capsys):
    code, out, err = run(capsys, "ingest", str(corpus["root"]))
    assert code == 0 and "ingested " not in err
    ingested = [line for line in out.splitlines() if line.startswith("ingested ")]
    assert len(ingested) == 4  # found recursively
    assert any(str(corpus["story"].resolve()) in line and "chunks" in line for line in ingested)
    kinds = {Path(d["path"]).name: d["kind"] for d in Store().documents()}
    assert kinds == {"story.md": "book", "ferry.txt": "dialogue", "support.jsonl": "dialogue", "tides.pdf": "pdf"}


def test_ingest_json_reports_failures_on_one_document(corpus, tmp_path, capsys):
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    code, out, err = run(capsys, "ingest", "--json", str(broken), str(corpus["transcript"]))
    assert code == 1
    result = one_json(out)
    assert result["failed"] == 1
    failed, ok = result["files"]
    assert failed["status"] == "failed" and failed["error"]["path"] == str(broken.resolve())
    assert "malformed dialogue JSON" in failed["error"]["message"] and failed["error"]["hint"]
    assert ok["status"] == "ingested"
    assert len([line for line in err.splitlines() if line.startswith("evsel: error:")]) == 1


def test_collection_and_kind_options(corpus, capsys):
    assert run(capsys, "ingest", "--collection", "harbour", "--kind", "book", str(corpus["transcript"]))[0] == 0
    assert run(capsys, "ingest", str(corpus["jsonl"]))[0] == 0
    code, out, _ = run(capsys, "docs", "list", "--json", "--collection", "harbour")
    [doc] = one_json(out)
    assert doc["collection"] == "harbour" and doc["kind"] == "book"
    code, out, _ = run(capsys, "docs", "list", "--json")
    assert [d["collection"] for d in one_json(out)] == ["harbour", "default"]


def test_docs_list_show_rm(corpus, capsys):
    for key in ("story", "transcript", "pdf"):
        assert run(capsys, "ingest", str(corpus[key]))[0] == 0

    code, out, err = run(capsys, "docs", "list")
    assert code == 0
    for title in ("The Gull Point Light", "ferry", "tides"):
        assert title in out
    code, out, _ = run(capsys, "docs", "list", "--json")
    docs = one_json(out)
    assert [d["id"] for d in docs] == [1, 2, 3]
    story, transcript, pdf = docs
    assert story["kind"] == "book" and story["n_chunks"] > 60 and story["n_tokens"] > 10_000
    assert transcript["metadata"]["speakers"] == ["Ann", "Ben"]
    assert pdf["metadata"]["pages"] == 3

    code, out, _ = run(capsys, "docs", "show", str(pdf["id"]))
    assert code == 0
    assert "title: tides" in out and "kind: pdf" in out and f"path: {corpus['pdf'].resolve()}" in out

    code, out, _ = run(capsys, "docs", "show", "--chunks", str(transcript["id"]))
    assert "chunk 0" in out and "chunk 1" in out and "session 1" in out and "session 2" in out
    assert "turns S2:1-S2:2" in out

    code, out, _ = run(capsys, "docs", "show", "--json", "--chunks", str(pdf["id"]))
    shown = one_json(out)
    assert shown["id"] == pdf["id"] and shown["n_chunks"] == len(shown["chunks"])
    assert [(c["page_start"], c["page_end"]) for c in shown["chunks"]] == [(1, 3)]
    assert "".join(c["text"] for c in shown["chunks"]).count("Tide table page") == 3

    code, out, _ = run(capsys, "docs", "show", "--json", "--chunks", str(transcript["id"]))
    chunks = one_json(out)["chunks"]
    assert [(c["session"], c["speakers"], c["turn_ids"], c["time_start"]) for c in chunks] == [
        ("1", ["Ann", "Ben"], ["S1:1", "S1:2"], "3 March 2024"),
        ("2", ["Ann", "Ben"], ["S2:1", "S2:2"], "4 March 2024"),
    ]
    assert "".join(c["text"] for c in chunks).count("Ann:") == 2

    code, out, err = run(capsys, "docs", "rm", str(story["id"]), str(pdf["id"]))
    assert code == 0 and out == ""
    assert f"removed {story['id']}: The Gull Point Light" in err
    code, out, _ = run(capsys, "docs", "list", "--json")
    assert [d["id"] for d in one_json(out)] == [transcript["id"]]
    assert {c.doc_id for c in Store().chunks()} == {transcript["id"]}

    code, out, _ = run(capsys, "docs", "rm", "--json", str(transcript["id"]))
    assert one_json(out) == [{"id": transcript["id"], "title": "ferry", "path": str(corpus["transcript"].resolve())}]
    assert Store().chunks() == []


def test_docs_list_when_empty(capsys):
    code, out, err = run(capsys, "docs", "list")
    assert code == 0 and out == ""
    assert "no documents yet" in err and "evsel ingest PATH" in err
    code, out, _ = run(capsys, "docs", "list", "--json")
    assert code == 0 and one_json(out) == []


def test_evidence_keeps_provenance_without_the_model(corpus, capsys):
    """BM25 evidence for a question about the dialogue carries speaker, session, turn and time."""
    for key in ("transcript", "pdf"):
        assert run(capsys, "ingest", str(corpus[key]))[0] == 0
    question = "When did the ferry leave with the mail sacks?"
    # BM25 named: the default ranks chats with the fusion, which loads the model
    code, out, _ = run(capsys, "ask", "--json", "--evidence-only", "--top-n", "1", "--select", "bm25", question)
    assert code == 0
    [evidence] = one_json(out)["evidence"]
    assert "mail sacks" in evidence["text"]
    where = (evidence["session"], evidence["turn_ids"], evidence["time_start"])
    assert where == ("2", ["S2:1", "S2:2"], "4 March 2024")
    code, out, _ = run(capsys, "ask", "--json", "--evidence-only", "--top-n", "1", "--select", "bm25",
                       "High water at 7 o'clock?")
    [evidence] = one_json(out)["evidence"]
    assert evidence["kind"] == "pdf" and evidence["page_start"] == 1 and evidence["page_end"] == 3
