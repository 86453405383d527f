"""Streaming ingest: a file's chunks and BM25 postings are written in bounded batches inside one
transaction, so memory stays flat, a cancel is checked between any two batches, and a kill -9 at any
point leaves the old version of the file or the new one, whole."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from evsel.store import bm25_index
from evsel.store import store as store_module
from evsel.engine import Engine, IngestOptions
from evsel.paths import sample_story_path
from evsel.store.store import Store

from test_store import assert_consistent

CHUNK_TOKENS = 16  # many small chunks: many batches from the sample story
WRITE_BATCH = 20
MERGE_BATCH = 50


def _versions(tmp_path):
    """A file and two versions of the same size (so they chunk alike), each naming its own keeper."""
    story = sample_story_path().read_text(encoding="utf-8")
    path = tmp_path / "story.md"
    return path, story.replace("Agnes", "Agnes"), story.replace("Agnes", "Hilda")


def _snapshot(store: Store) -> list:
    return [store.db.execute(f"select * from {table} order by 1, 2").fetchall()
            for table in ("documents", "chunks", "bm25_docs", "bm25_postings")]


def _assert_whole(store: Store, text: str) -> None:
    """The store holds exactly one document, this text, with its BM25 rows in step with its chunks."""
    assert_consistent(store)
    [doc] = store.documents()
    chunks = store.chunks([doc["id"]])
    assert "".join(c.text for c in chunks) == text
    n_chunks, digest, lengths = store.db.execute(
        "select n_chunks, digest, lengths from bm25_docs where doc_id = ?", [doc["id"]]).fetchone()
    assert n_chunks == len(chunks) and digest == bm25_index.digest(c.content_hash for c in chunks)
    assert list(memoryview(lengths).cast("i")) == [len(bm25_index.chunk_tokens(c.text)) for c in chunks]
    scope = store.bm25_scope(chunks)
    assert scope is not None and store.bm25_scores(scope, ["keeper"], 1.5, 0.75) is not None


def test_streamed_rows_equal_the_rows_of_a_whole_list(tmp_path, monkeypatch, backbone_tokenizer):
    """The chunker's generator, written in batches, stores what the whole list stores, index included."""
    from evsel.ingest import chunker
    from evsel.ingest.parsers import parse_file

    monkeypatch.setattr(store_module, "WRITE_BATCH", WRITE_BATCH)
    monkeypatch.setattr(bm25_index, "MERGE_BATCH", MERGE_BATCH)
    path, text, _ = _versions(tmp_path)
    path.write_text(text, encoding="utf-8")
    [doc] = parse_file(path)
    chunks = chunker.chunk_document(doc, backbone_tokenizer, CHUNK_TOKENS)
    assert [c.record() for c in chunks] == [c.record() for c in chunker.iter_chunks(doc, backbone_tokenizer,
                                                                                      CHUNK_TOKENS)]
    store = Store()
    collection = store.collection_id("default", create=True)

    def as_doc(records):
        return {"part": "", "kind": "book", "title": "T", "metadata": {}, "n_chars": len(doc.text), "chunks": records}

    store.replace_file(collection, "/listed", "sha", [as_doc([c.record() for c in chunks])])
    calls = []
    store.replace_file(collection, "/streamed", "sha", [as_doc(c.record() for c in chunks)],
                       on_batch=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (len(chunks), len(chunks)) and all(total is None for _, total in calls[:-1])
    listed, streamed = (store.db.execute(
        "select seq, text, content_hash, n_tokens, char_start, char_end from chunks where doc_id = ? order by seq",
        [doc_id]).fetchall() for doc_id in (1, 2))
    assert listed == streamed and len(listed) > 10 * WRITE_BATCH
    index = [store.db.execute("select n_chunks, total_len, digest, lengths, term_ids, dfs from bm25_docs "
                              "where doc_id = ?", [doc_id]).fetchone() for doc_id in (1, 2)]
    assert index[0] == index[1]
    postings = [store.db.execute("select term_id, data from bm25_postings where doc_id = ? order by term_id",
                                 [doc_id]).fetchall() for doc_id in (1, 2)]
    assert postings[0] == postings[1] and len(postings[0]) > 2 * MERGE_BATCH
    documents = {d["id"]: d for d in store.documents()}
    assert documents[1]["n_chunks"] == documents[2]["n_chunks"] == len(chunks)
    assert documents[1]["n_tokens"] == documents[2]["n_tokens"] == sum(c.n_tokens for c in chunks)


def test_a_cancel_is_checked_between_any_two_batches_and_keeps_the_old_version(tmp_path, monkeypatch,
                                                                              backbone_tokenizer):
    monkeypatch.setattr(store_module, "WRITE_BATCH", WRITE_BATCH)
    monkeypatch.setattr(bm25_index, "MERGE_BATCH", MERGE_BATCH)
    path, first, second = _versions(tmp_path)
    engine = Engine()
    options = IngestOptions(chunk_tokens=CHUNK_TOKENS, encode=False)
    path.write_text(first, encoding="utf-8")
    engine.ingest_files([str(path)], options)
    conn = engine.store.db.conn

    # a replacing ingest: how many rows are written between two progress events (where a cancel lands)
    changes = []

    def record(event):
        if event["type"] == "progress":
            changes.append(conn.total_changes)

    path.write_text(second, encoding="utf-8")
    [result] = engine.ingest_files([str(path)], options, record).files
    assert result["status"] == "ingested" and result["chunks"] > 10 * WRITE_BATCH
    gaps = [b - a for a, b in zip(changes, changes[1:])]
    # one batch of chunks with its staged postings (at most one row per token), or one batch of
    # deletes or merged postings: never the whole file (the old version had thousands of rows)
    assert max(gaps) <= WRITE_BATCH * (CHUNK_TOKENS + 1) + MERGE_BATCH + 2, gaps
    assert len(changes) > 20
    after = _snapshot(engine.store)

    class Cancelled(BaseException):
        pass

    # cancels at points across the whole ingest of the other version: dropping the old rows,
    # chunking and writing, merging the postings, just before the commit
    n = len(changes)
    for at in sorted({2, n // 4, n // 2, 3 * n // 4, n - 2}):
        seen = []

        def cancel(event):
            if event["type"] == "progress":
                seen.append(event)
                if len(seen) == at:
                    raise Cancelled()

        path.write_text(first, encoding="utf-8")
        with pytest.raises(Cancelled):
            engine.ingest_files([str(path)], options, cancel)
        assert _snapshot(engine.store) == after, f"cancelled at event {at} of {n}"
        assert not conn.in_transaction
    _assert_whole(engine.store, second)


# kill -9: a child ingests the new version and stops for good at a chosen point (STOP_AT), says so,
# and is killed there

KILLABLE = textwrap.dedent(
    """
    import functools, os, sqlite3, sys, time

    STOP_AT, COUNT = os.environ["STOP_AT"].split(":")
    seen = {}

    def reached(point):
        seen[point] = seen.get(point, 0) + 1
        if point == STOP_AT and seen[point] == int(COUNT):
            print("stopped", flush=True)
            time.sleep(600)

    class Connection(sqlite3.Connection):
        def executemany(self, sql, rows):
            text = sql.lstrip().lower()
            if text.startswith("insert into chunks"):
                reached("chunks")
            elif text.startswith("insert into bm25_postings"):
                reached("postings")
            return super().executemany(sql, rows)

        def execute(self, sql, *args):
            text = sql.lstrip().lower()
            if text.startswith("delete from chunks where doc_id = ? and seq"):
                reached("delete")
            if text == "commit" and seen.get("chunks"):
                reached("commit")
            result = super().execute(sql, *args)
            if text == "commit" and seen.get("chunks"):
                reached("committed")
            return result

    sqlite3.connect = functools.partial(sqlite3.connect, factory=Connection)
    from evsel.store import bm25_index, store
    store.WRITE_BATCH = 20
    bm25_index.MERGE_BATCH = 50
    from evsel.cli import main
    sys.exit(main(["--no-daemon", "ingest", "--no-encode", "--chunk-tokens", "16", *sys.argv[1:]]))
    """
)


def _evsel(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evsel", "--no-daemon", *args], capture_output=True, text=True,
                          env=os.environ.copy(), timeout=300)


@pytest.mark.parametrize("stop_at, survivor", [
    ("delete:3", "old"),  # dropping the old version's chunks
    ("chunks:5", "old"),  # new chunks half written
    ("postings:2", "old"),  # the new postings being merged
    ("commit:1", "old"),  # everything written, not committed
    ("committed:1", "new"),  # just after the commit
])
def test_kill_9_anywhere_in_an_ingest_leaves_the_old_version_or_the_new_one(tmp_path, stop_at, survivor):
    path, first, second = _versions(tmp_path)
    path.write_text(first, encoding="utf-8")
    assert _evsel("ingest", "--no-encode", "--chunk-tokens", "16", str(path)).returncode == 0
    store = Store()
    before = _snapshot(store)
    store.db.conn.close()

    path.write_text(second, encoding="utf-8")
    child = subprocess.Popen([sys.executable, "-c", KILLABLE, str(path)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=dict(os.environ, STOP_AT=stop_at))
    try:
        line = child.stdout.readline()
        assert line.strip() == "stopped", child.stderr.read() if child.poll() is not None else line
        os.kill(child.pid, signal.SIGKILL)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=60)
        child.stdout.close()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL

    store = Store()
    if survivor == "old":
        assert _snapshot(store) == before
        _assert_whole(store, first)
    else:
        _assert_whole(store, second)
    store.db.conn.close()
    listed = _evsel("docs", "list", "--json")
    assert listed.returncode == 0 and [d["path"] for d in json.loads(listed.stdout)] == [str(path)]
    asked = _evsel("ask", "--json", "--evidence-only", "--select", "bm25", "--top-n", "1", "Who kept the light?")
    assert asked.returncode == 0, asked.stderr
    [evidence] = json.loads(asked.stdout)["evidence"]
    assert evidence["path"] == str(path)
    # and the interrupted version goes in whole at the next ingest
    assert _evsel("ingest", "--no-encode", "--chunk-tokens", "16", str(path)).returncode == 0
    _assert_whole(Store(), second)


def test_counts_without_transformers_equal_the_transformers_tokenizer(backbone_tokenizer):
    """The chunker counts with the `tokenizers` tokenizer alone (no transformers or torch in an ingest's
    memory): the same counts and offsets as transformers' wrapper, so the same chunks."""
    from evsel.ingest import chunker

    assert backbone_tokenizer.fast_tokenizer is not None
    story = sample_story_path().read_text(encoding="utf-8")
    texts = [story[s:e] for s, e in chunker.split_sentences(story)]
    texts += ["", " ", "\n\n\u201cNo,\u201d she said.", "caf\u00e9 \u00fcber na\u00efve \u2014 \u65e5\u672c\u8a9e",
              "emoji \U0001f600 and tabs\t\tand  spaces", "x" * 5000, "<|im_start|>user\nhi<|im_end|>"]
    wrapped = backbone_tokenizer.tokenizer(texts, add_special_tokens=False)["input_ids"]
    assert backbone_tokenizer.count(texts) == [len(ids) for ids in wrapped]
    for text in (story[:3000], texts[-3], texts[-4]):
        expected = backbone_tokenizer.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        assert backbone_tokenizer.offsets(text) == [tuple(o) for o in expected["offset_mapping"]]
