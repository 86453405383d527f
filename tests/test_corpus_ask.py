"""`evsel ask --corpus DIR` against a local `evsel ingest` of the same documents, and a corpus that
grows (`evsel corpus add` / `rm`). The corpora are written with the Ray-free writer
(`evsel.corpus.rows.write_local` with its indexes), so no cluster is needed here.

Documents: 50 FairytaleQA stories (train and val, in name order) from ../shared/data, each written
as a .txt file of its sections; questions: the FairytaleQA questions of those stories.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import DATA

from evsel.requests import AskRequest

pytest.importorskip("lance", reason="the scale extra is not installed (pip install '.[scale]')")
pytest.importorskip("pyarrow", reason="the scale extra is not installed (pip install '.[scale]')")

STORIES = DATA / "fairytaleqa" / "section-stories"
QUESTIONS = DATA / "fairytaleqa" / "questions"
N_DOCS = 50
DENSE_DOCS = 6  # MiniLM states for these first stories only: encoding on a CPU costs seconds per story
UNREAL_DOCS = 1  # the shortest of the first stories
DENSE_TOLERANCE = 1e-5  # the same float16 vectors read back as float32 locally and in the corpus
UNREAL_TOLERANCE = 0.05  # MaxSim of bf16 states encoded in other batches (padding changes the rounding)


def _stories() -> list[Path]:
    if not STORIES.is_dir():
        pytest.skip(f"{STORIES} is absent: the shared benchmark data is not checked out beside the project")
    return sorted(STORIES.glob("*/*.csv"), key=lambda p: p.name)[:N_DOCS]


def _write_docs(folder: Path, stories: list[Path]) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for story in stories:
        with open(story, encoding="utf-8") as handle:
            sections = [row["text"].strip() for row in csv.DictReader(handle)]
        path = folder / (story.stem.removesuffix("-story") + ".txt")
        path.write_text("\n\n".join(sections) + "\n", encoding="utf-8")
        out.append(path)
    return out


def _questions(stories: list[Path], per_story: int) -> list[str]:
    out = []
    for story in stories:
        path = QUESTIONS / story.parent.name / story.name.replace("-story.csv", "-questions.csv")
        if path.is_file():
            with open(path, encoding="utf-8") as handle:
                out += [row["question"] for row in csv.DictReader(handle)][:per_story]
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory, model_cache):
    """The documents, a local store of them (collections all, dense, unreal) and the corpora."""
    from evsel.corpus import rows as corpus_rows
    from evsel.corpus import schema
    from evsel.engine import Engine
    from evsel.settings import Settings

    root = tmp_path_factory.mktemp("corpus-ask")
    stories = _stories()
    docs = _write_docs(root / "docs", stories)
    saved = {k: os.environ.get(k) for k in ("EVSEL_HOME", "EVSEL_MODEL_CACHE", "EVSEL_ENCODE", "EVSEL_NO_DAEMON")}
    os.environ.update(EVSEL_HOME=str(root / "home"), EVSEL_MODEL_CACHE=str(model_cache), EVSEL_ENCODE="0",
                      EVSEL_NO_DAEMON="1")
    try:
        engine = Engine(Settings.resolve())
        engine.ingest([str(p) for p in docs], collection="all")
        engine.ingest([str(p) for p in docs[:DENSE_DOCS]], collection="dense")
        unreal_docs = sorted(docs[:8], key=lambda p: p.stat().st_size)[:UNREAL_DOCS]
        engine.ingest([str(p) for p in unreal_docs], collection="unreal")
        backbone = engine.backbone  # its tokenizer chunks; no weights are loaded for it

        def corpus(name: str, files: list[Path], dense: bool = False, unreal: bool = False) -> Path:
            rows = [r for f in files for r in corpus_rows.rows_of_file(f, root / "docs", backbone)]
            encoder = corpus_rows.StateEncoder(backbone, dense=dense, unreal=unreal) if dense or unreal else None
            if encoder is not None:
                for at in range(0, len(rows), 64):
                    encoder.add_states(rows[at:at + 64])
            manifest = schema.new_manifest(
                backbone=backbone.fingerprint, chunk_tokens=140, source=str(root / "docs"),
                methods=encoder.methods() if encoder else ["bm25"], dims=encoder.dims() if encoder else {},
                configs=encoder.configs() if encoder else {})
            out = root / name
            corpus_rows.write_local(rows, out, manifest, index=True)
            return out

        corpora = {"all": corpus("corpus-all", docs), "dense": corpus("corpus-dense", docs[:DENSE_DOCS], dense=True)}
        yield {"root": root, "docs": docs, "stories": stories, "engine": engine, "corpus": corpora,
               "unreal_docs": unreal_docs,
               "make_corpus": corpus}
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _pairs(result: dict) -> list[tuple[str, int, float]]:
    """(file name, seq, score) of an ask's evidence, best first."""
    return [(Path(e["path"]).name, e["seq"], e["score"]) for e in sorted(result["evidence"], key=lambda e: e["rank"])]


def _same_top(local: list, corpus: list, tolerance: float) -> None:
    """The same scores rank by rank, and the same chunks except where a score ties at the cut."""
    assert len(local) == len(corpus)
    for (_, _, a), (_, _, b) in zip(local, corpus):
        assert abs(a - b) <= tolerance, (local, corpus)
    cut = local[-1][2]
    assert {x[:2] for x in local if x[2] > cut + tolerance} == {x[:2] for x in corpus if x[2] > cut + tolerance}


def test_bm25_top10_equals_local_ingest(world):
    """Every chunk's content hash equals the local store's; BM25's top 10 equals the local one."""
    from evsel.corpus.query import open_corpus

    engine = world["engine"]
    local_hashes = {c.content_hash for c in engine.store.chunks(collection="all")}
    corpus = open_corpus(world["corpus"]["all"])
    hashes = set(corpus.dataset.to_table(columns=["content_hash"]).column(0).to_pylist())
    assert hashes == local_hashes
    questions = _questions(world["stories"], 1)[:30]
    assert len(questions) >= 20
    for question in questions:
        local = engine.ask(AskRequest(question, collection="all", select="bm25", evidence_only=True, top_n=10))
        far = engine.ask(AskRequest(question, select="bm25", evidence_only=True, top_n=10, corpus=str(world["corpus"]["all"])))
        assert far["method"]["candidates"] == local["method"]["candidates"]
        _same_top(_pairs(local), _pairs(far), 1e-4)


def test_bm25_capped_candidates_is_a_first_stage(world):
    """EVSEL_CORPUS_BM25_CANDIDATES rescores only Lance's top N matches: the best chunk stays."""
    from evsel.store.bm25_index import tokenize
    from evsel.corpus.query import open_corpus, question_words

    corpus = open_corpus(world["corpus"]["all"])
    for question in _questions(world["stories"], 1)[:10]:
        exact = corpus.bm25(tokenize(question), 10, None, question_words(question))
        capped = corpus.bm25(tokenize(question), 10, 200, question_words(question))
        assert capped[0].score == pytest.approx(exact[0].score)


def test_dense_top10_within_tolerance(world):
    engine = world["engine"]
    for question in _questions(world["stories"][:DENSE_DOCS], 2):
        local = engine.ask(AskRequest(question, collection="dense", select="dense", evidence_only=True, top_n=10))
        far = engine.ask(AskRequest(question, select="dense", evidence_only=True, top_n=10, corpus=str(world["corpus"]["dense"])))
        _same_top(_pairs(local), _pairs(far), DENSE_TOLERANCE + 1e-4)  # + the 4 decimals results round to


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evsel", *args], capture_output=True, text=True,
                          env=os.environ.copy(), timeout=900)


def test_cli_ask_corpus_bm25_and_dense_show_provenance(world, capsys):
    question = _questions(world["stories"][:1], 1)[0]
    for select, corpus in (("bm25", "all"), ("dense", "dense")):
        code, out, err = _main(capsys, "ask", "--json", question, "--corpus", str(world["corpus"][corpus]),
                               "--select", select, "--evidence-only", "--top-n", "3")
        assert code == 0, err
        result = json.loads(out)
        assert result["method"]["select"] == select and result["method"]["corpus"] == str(world["corpus"][corpus])
        assert len(result["evidence"]) == 3
        for item in result["evidence"]:
            assert item["title"] and item["path"].endswith(".txt") and ":" in item["chunk_id"]
            assert item["chunk_id"].startswith(item["doc_id"])
    code, out, err = _main(capsys, "ask", question, "--corpus", str(world["corpus"]["all"]), "--evidence-only",
                           "--top-n", "2")
    assert code == 0, err
    assert "Evidence (bm25, 2 of" in out


@pytest.mark.model
def test_unreal_corpus_matches_local_and_answers_through_the_cli(world, capsys):
    """UNREAL states encoded for the corpus score as the local store's (exact MaxSim over the
    multivector search's candidates); then the whole ask, with the real model's answer."""
    docs = world["unreal_docs"]
    corpus = world["make_corpus"]("corpus-unreal", docs, unreal=True)
    engine = world["engine"]
    question = _questions([world["stories"][world["docs"].index(docs[0])]], 1)[0]
    local = engine.ask(AskRequest(question, collection="unreal", select="unreal", evidence_only=True, top_n=10))
    far = engine.ask(AskRequest(question, select="unreal", evidence_only=True, top_n=10, corpus=str(corpus)))
    _same_top(_pairs(local), _pairs(far), UNREAL_TOLERANCE)
    code, out, err = _main(capsys, "ask", "--json", question, "--corpus", str(corpus), "--select", "unreal",
                           "--top-n", "3")
    assert code == 0, err
    result = json.loads(out)
    assert result["method"]["select"] == "unreal" and len(result["evidence"]) == 3
    assert result["grounding"]["kind"] in ("grounded", "abstained", "span")
    assert "generate_s" in result["timings"]


def test_append_then_delete(world, tmp_path, capsys):
    """An added document is found by the next ask; a deleted one is never returned again; the
    BM25 statistics follow both (equal to a recount)."""
    from evsel.corpus import rows as corpus_rows
    from evsel.corpus import schema

    corpus = tmp_path / "corpus"
    shutil.copytree(world["corpus"]["all"], corpus)
    extra = tmp_path / "new" / "lighthouse.txt"
    extra.parent.mkdir()
    extra.write_text("The keeper of the Quillon lighthouse kept a brass telescope named Orvandel.\n\n"
                     "Every night he polished Orvandel and watched the herring boats come home.\n", encoding="utf-8")
    question = "What was the name of the keeper's brass telescope?"
    from evsel.corpus.query import open_corpus

    before = open_corpus(corpus)
    assert open_corpus(corpus) is before  # held open between asks (the daemon's case)
    code, out, err = _main(capsys, "corpus", "add", str(corpus), str(extra), "--json")
    assert code == 0, err
    outcome = json.loads(out)
    assert [f["status"] for f in outcome["files"]] == ["added"]
    assert open_corpus(corpus) is not before  # a new version: reopened
    engine = world["engine"]
    result = engine.ask(AskRequest(question, corpus=str(corpus), evidence_only=True, top_n=3))
    assert result["evidence"][0]["path"] == str(extra.resolve())
    sha = outcome["files"][0]["sha256"]
    again = json.loads(_main(capsys, "corpus", "add", str(corpus), str(extra), "--json")[1])
    assert [f["status"] for f in again["files"]] == ["unchanged"]
    manifest = schema.read_manifest(corpus)
    df, n, total = corpus_rows.scan_bm25_counts(corpus)
    assert manifest["bm25"] == {"n_chunks": n, "total_len": total}
    code, out, err = _main(capsys, "corpus", "rm", str(corpus), sha[:12], "--json")
    assert code == 0, err
    assert json.loads(out)["removed_chunks"] == outcome["added_chunks"]
    first_doc = world["docs"][0].name
    gone = _cli("corpus", "rm", str(corpus), first_doc)  # once through a process of its own
    assert gone.returncode == 0, gone.stderr
    for q in (question, *_questions(world["stories"][:1], 3)):
        result = engine.ask(AskRequest(q, corpus=str(corpus), evidence_only=True, top_n=10))
        assert all(not e["chunk_id"].startswith(sha) and e["path"] != first_doc for e in result["evidence"])
    import lance

    stats = lance.dataset(str(corpus / schema.BM25_STATS)).to_table()
    df, n, total = corpus_rows.scan_bm25_counts(corpus)
    assert dict(zip(stats.column("term").to_pylist(), stats.column("df").to_pylist())) == dict(df)
    assert schema.read_manifest(corpus)["bm25"] == {"n_chunks": n, "total_len": total}


def _main(capsys, *args: str) -> tuple[int, str, str]:
    """`evsel ARGS` in this process: (exit code, stdout, stderr)."""
    from evsel.cli import main

    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _one_line_error(capsys, args: list[str], needle: str) -> None:
    code, _, err = _main(capsys, *args)
    assert code != 0
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], err
    assert "Traceback" not in err


def test_bad_input_is_one_line(world, tmp_path, capsys):
    good = world["corpus"]["all"]
    _one_line_error(capsys, ["ask", "q", "--corpus", str(tmp_path / "missing"), "--evidence-only"], "does not exist")
    (tmp_path / "empty").mkdir()
    _one_line_error(capsys, ["ask", "q", "--corpus", str(tmp_path / "empty"), "--evidence-only"], "not an evsel corpus")
    for name, change, needle in (("version", {"version": 99}, "version 99"),
                                 ("backbone", {"backbone": "0" * 64}, "built with backbone 0000")):
        copy = tmp_path / name
        shutil.copytree(good, copy)
        manifest = json.loads((copy / "manifest.json").read_text())
        manifest.update(change)
        (copy / "manifest.json").write_text(json.dumps(manifest))
        _one_line_error(capsys, ["ask", "who?", "--corpus", str(copy)], needle)
    _one_line_error(capsys, ["ask", "q", "--corpus", str(good), "--select", "intrinsic", "--evidence-only"], "cannot read a corpus")
    _one_line_error(capsys, ["ask", "q", "--corpus", str(good), "--select", "dense", "--evidence-only"], "holds no dense")
    _one_line_error(capsys, ["ask", "q", "--corpus", str(good), "--doc", "1", "--evidence-only"], "not of a corpus")
    _one_line_error(capsys, ["corpus", "rm", str(good), "no-such-doc.txt"], "no document")
