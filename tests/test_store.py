"""SQLite store: migrations, idempotent re-ingest, atomic replacement, rollback on failure, killed ingests."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from evsel.store import migrations
from evsel.store import store as store_module
from evsel.engine import Engine
from evsel.errors import StoreError
from evsel.store.journal import Journal
from evsel.store.migrations import MIGRATIONS, migrate
from evsel.paths import db_path, sample_story_path
from evsel.store.store import Store, connect


def rows(db, table: str) -> list[tuple]:
    return [tuple(r) for r in db.execute(f"select * from {table} order by id").fetchall()]


def assert_consistent(store: Store) -> None:
    """Every document's chunks are all there, in order, and cover its text; no chunk is orphaned."""
    db = store.db
    assert db.execute("pragma integrity_check").fetchone()[0] == "ok"
    assert db.execute("pragma foreign_key_check").fetchall() == []
    orphans = db.execute("select count(*) from chunks where doc_id not in (select id from documents)").fetchone()[0]
    assert orphans == 0
    for doc in store.documents():
        chunks = store.chunks([doc["id"]])
        assert len(chunks) == doc["n_chunks"] > 0
        assert [c.seq for c in chunks] == list(range(len(chunks)))
        assert chunks[0].char_start == 0 and chunks[-1].char_end == doc["n_chars"]
        assert all(a.char_end == b.char_start for a, b in zip(chunks, chunks[1:]))
        assert sum(len(c.text) for c in chunks) == doc["n_chars"]


def ingest(*paths, **options) -> list[dict]:
    return Engine().ingest([str(p) for p in paths], **options)


def locomo_like(parts: dict[str, list[str]]) -> str:
    """A LoCoMo-format file with one conversation per part; each turn text given."""
    samples = []
    for part, texts in parts.items():
        samples.append({
            "sample_id": part,
            "conversation": {
                "speaker_a": "Ann", "speaker_b": "Ben", "session_1_date_time": "1 May 2023",
                "session_1": [{"speaker": "Ann" if i % 2 == 0 else "Ben", "dia_id": f"D1:{i + 1}", "text": t}
                              for i, t in enumerate(texts)],
            },
        })
    return json.dumps(samples)


# migrations


def test_fresh_store_applies_every_migration_once():
    db = connect()
    assert db_path().is_file()
    assert db.journal_mode == "wal"
    applied = [r[0] for r in db.execute("select name from _evsel_migrations order by rowid").fetchall()]
    assert applied == [name for name, _ in MIGRATIONS]
    assert applied[0] == "m001_create_tables"
    assert {"collections", "documents", "chunks"} <= set(db.table_names())
    assert migrate(db) == []
    assert migrate(connect()) == []


def test_new_migration_is_applied_and_keeps_data(monkeypatch):
    ingest(sample_story_path())
    before = rows(connect(), "chunks")

    def m999_add_note(db):
        db["documents"].add_column("note", str)

    monkeypatch.setattr(migrations, "MIGRATIONS", [*MIGRATIONS, ("m999_add_note", m999_add_note)])
    db = connect()
    assert "note" in db["documents"].columns_dict
    assert rows(db, "chunks") == before
    assert migrate(db) == []


def test_failing_migration_rolls_back(monkeypatch):
    connect()

    def m999_broken(db):
        db["documents"].add_column("half_done", str)
        raise RuntimeError("boom")

    monkeypatch.setattr(migrations, "MIGRATIONS", [*MIGRATIONS, ("m999_broken", m999_broken)])
    with pytest.raises(RuntimeError):
        connect()
    monkeypatch.setattr(migrations, "MIGRATIONS", list(MIGRATIONS))
    db = connect()
    assert "half_done" not in db["documents"].columns_dict
    assert db.execute("select count(*) from _evsel_migrations where name = 'm999_broken'").fetchone()[0] == 0


def test_store_from_a_newer_evsel_is_refused():
    db = connect()
    db.execute("insert into _evsel_migrations values ('m998_from_the_future', 0)")
    with pytest.raises(StoreError, match="newer evsel"):
        connect()


# re-ingest


def test_unchanged_file_is_not_written_again(tmp_path):
    path = tmp_path / "story.md"
    path.write_text(sample_story_path().read_text(encoding="utf-8"))
    [first] = ingest(path)
    assert first["status"] == "ingested" and first["chunks"] > 60
    db = connect()
    documents, chunks = rows(db, "documents"), rows(db, "chunks")
    [second] = ingest(path)
    assert second["status"] == "unchanged"
    assert second["doc_ids"] == first["doc_ids"] and second["chunks"] == first["chunks"]
    assert rows(db, "documents") == documents  # not even updated_at moves
    assert rows(db, "chunks") == chunks
    store = Store()
    assert "".join(c.text for c in store.chunks(first["doc_ids"])) == path.read_text(encoding="utf-8")
    assert_consistent(store)


def test_changed_file_replaces_its_old_version_keeping_the_id(tmp_path):
    path = tmp_path / "story.md"
    other = tmp_path / "other.txt"
    other.write_text("The harbour master kept a second log. It recorded every ship.\n")
    text = sample_story_path().read_text(encoding="utf-8")
    path.write_text(text)
    [first, kept] = ingest(path, other)
    other_rows = [r for r in rows(connect(), "chunks") if r[1] == kept["doc_ids"][0]]

    changed = text.replace("Agnes Quarrie", "Agnes Quarry") + "\n## Afterword\n\nThe light was sold in the spring.\n"
    path.write_text(changed)
    [second] = ingest(path)
    assert second["status"] == "ingested"
    assert second["doc_ids"] == first["doc_ids"]
    store = Store()
    chunks = store.chunks(first["doc_ids"])
    assert "".join(c.text for c in chunks) == changed
    assert not any("Agnes Quarrie" in c.text for c in chunks)
    assert len(store.documents()) == 2
    doc = store.document(first["doc_ids"][0])
    assert doc["n_chars"] == len(changed) and doc["n_chunks"] == len(chunks) == second["chunks"]
    assert [r for r in rows(store.db, "chunks") if r[1] == kept["doc_ids"][0]] == other_rows
    assert_consistent(store)


def test_other_chunk_size_or_kind_reingests(tmp_path):
    path = tmp_path / "story.md"
    path.write_text(sample_story_path().read_text(encoding="utf-8"))
    [first] = ingest(path)
    [smaller] = ingest(path, chunk_tokens=60)
    assert smaller["status"] == "ingested" and smaller["doc_ids"] == first["doc_ids"]
    assert smaller["chunks"] > 2 * first["chunks"] // 1.5
    assert ingest(path, chunk_tokens=60)[0]["status"] == "unchanged"
    assert ingest(path, chunk_tokens=60, kind="book")[0]["status"] == "ingested"
    assert_consistent(Store())


def test_collections_hold_separate_copies(tmp_path):
    path = tmp_path / "story.md"
    path.write_text("# A\n\nOne short story. The end.\n")
    [a] = ingest(path)
    [b] = ingest(path, collection="second")
    assert b["status"] == "ingested" and a["doc_ids"] != b["doc_ids"]
    assert [c["name"] for c in Store().collections()] == ["default", "second"]


def test_part_that_vanishes_from_a_file_is_removed(tmp_path):
    path = tmp_path / "chats.json"
    path.write_text(locomo_like({"a": ["Hello there.", "Hi."], "b": ["Second chat.", "Yes."]}))
    [first] = ingest(path)
    assert len(first["doc_ids"]) == 2
    path.write_text(locomo_like({"a": ["Hello there, again.", "Hi."]}))
    [second] = ingest(path)
    assert second["doc_ids"] == first["doc_ids"][:1]
    store = Store()
    assert [d["part"] for d in store.documents()] == ["a"]
    assert_consistent(store)


# cached chunk states follow their chunks


def _doc(part: str, texts: list[str]) -> dict:
    import hashlib

    chunks = [{"seq": i, "text": t, "content_hash": hashlib.sha256(t.encode()).hexdigest(), "n_tokens": 1,
               "char_start": 0, "char_end": len(t)} for i, t in enumerate(texts)]
    return {"part": part, "kind": "book", "title": part, "metadata": {}, "n_chars": 0, "chunks": chunks}


def test_deleting_documents_drops_the_states_no_chunk_holds_any_more():
    import hashlib

    import numpy as np

    def h(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()

    store = Store()
    collection = store.collection_id("default", create=True)
    [a] = store.replace_file(collection, "/a.txt", "a1", [_doc("", ["shared", "only a"])])
    parts = store.replace_file(collection, "/chats.json", "c1", [_doc("x", ["shared", "only x"]),
                                                                 _doc("y", ["only y", "y again"])])
    texts = ["shared", "only a", "only x", "only y", "y again"]
    state = np.zeros((2, 3), dtype=np.float16)
    for method in ("unreal", "dense"):  # every method's and config's states of a text go with it
        store.put_states("fp", method, "c", {h(t): state for t in texts})
    store.put_states("fp", "unreal", "c", {h("never stored here"): state})  # no chunk ever held it: kept

    def stored() -> set[str]:
        by_hash = {h(t): t for t in [*texts, "never stored here", "new x"]}
        rows = store.db.execute("select content_hash from chunk_states").fetchall()
        return {by_hash[r[0]] for r in rows}

    store.remove_documents([a])  # "shared" is still in part x
    assert stored() == {"shared", "only x", "only y", "y again", "never stored here"}
    assert store.db.execute("select count(*) from chunk_states").fetchone()[0] == 9

    # a new version of the file: part x changes (its old "only x" goes), part y vanishes
    store.replace_file(collection, "/chats.json", "c2", [_doc("x", ["shared", "new x"])])
    assert stored() == {"shared", "never stored here"}

    store.remove_documents(parts[:1])
    assert stored() == {"never stored here"}
    orphans = store.db.execute(
        "select count(*) from chunk_states where content_hash not in (select content_hash from chunks)").fetchone()[0]
    assert orphans == 1  # only the state no document ever had


def test_a_failed_removal_keeps_the_states(monkeypatch):
    import numpy as np

    store = Store()
    collection = store.collection_id("default", create=True)
    [a] = store.replace_file(collection, "/a.txt", "a1", [_doc("", ["alone"])])
    [chunk] = store.chunks([a])
    store.put_states("fp", "unreal", "c", {chunk.content_hash: np.zeros(2, dtype=np.float16)})
    real = Store._drop_orphan_states

    def fail(self, hashes):
        real(self, hashes)
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(Store, "_drop_orphan_states", fail)
    with pytest.raises(sqlite3.OperationalError):
        store.remove_documents([a])
    assert store.count_states() == 1 and len(store.chunks([a])) == 1


def test_registered_cleanups_run_after_a_deletion_commits(monkeypatch):
    """What a selector keeps beside the store for a chunk's content goes once no chunk holds it:
    the store calls the cleanups registered with it after the commit, never for a rolled-back one."""
    monkeypatch.setattr(Store, "_chunk_cleanups", [])  # this test's cleanups only
    seen = []

    @Store.on_chunks_deleted
    def record(store, hashes):
        seen.append((store, sorted(hashes)))
        assert not store.db.conn.in_transaction  # committed

    @Store.on_chunks_deleted
    def broken(_store, _hashes):
        raise PermissionError("a key file that cannot be deleted stays")

    store = Store()
    collection = store.collection_id("default", create=True)
    [a] = store.replace_file(collection, "/a.txt", "a1", [_doc("", ["shared", "only a"])])
    [b] = store.replace_file(collection, "/b.txt", "b1", [_doc("", ["shared"])])
    hashes = {c.text: c.content_hash for c in store.chunks()}
    real = Store._drop_orphan_states

    def fail(self, dropped):
        real(self, dropped)
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(Store, "_drop_orphan_states", fail)
    with pytest.raises(sqlite3.OperationalError):
        store.remove_documents([a])
    assert seen == []
    monkeypatch.setattr(Store, "_drop_orphan_states", real)
    store.remove_documents([a])  # "shared" is still in b
    assert seen == [(store, [hashes["only a"]])]
    store.replace_file(collection, "/b.txt", "b2", [_doc("", ["new in b"])])  # a new version drops it
    assert seen[1:] == [(store, [hashes["shared"]])]


# failures


def test_failure_inside_replace_file_leaves_the_old_version(tmp_path, monkeypatch):
    path = tmp_path / "chats.json"
    path.write_text(locomo_like({"a": ["The key is under the mat.", "Thanks."], "b": ["Second chat.", "Yes."]}))
    [first] = ingest(path)
    db = connect()
    documents, chunks = rows(db, "documents"), rows(db, "chunks")

    # the new version rewrites part a, then fails while dropping the vanished part b
    path.write_text(locomo_like({"a": ["The key is in the drawer.", "Thanks."]}))

    def fail(self, doc_id):
        raise sqlite3.OperationalError("disk I/O error")

    real = Store._delete_document
    monkeypatch.setattr(Store, "_delete_document", fail)
    [result] = ingest(path)
    assert result["status"] == "failed"
    assert "disk I/O error" in result["error"]["message"] and result["error"]["path"] == str(path)
    assert rows(db, "documents") == documents
    assert rows(db, "chunks") == chunks
    texts = " ".join(c.text for c in Store().chunks(first["doc_ids"]))
    assert "under the mat" in texts and "in the drawer" not in texts
    monkeypatch.setattr(Store, "_delete_document", real)  # not undo(): that would drop this test's EVSEL_HOME
    assert_consistent(Store())


def test_replace_file_is_one_transaction():
    store = Store()
    collection = store.collection_id("default", create=True)
    good = {"part": "a", "kind": "book", "title": "A", "metadata": {}, "n_chars": 5,
            "chunks": [{"seq": 0, "text": "Hello", "content_hash": "h", "n_tokens": 1, "char_start": 0, "char_end": 5}]}
    [doc_id] = store.replace_file(collection, "/x", "sha1", [good])
    broken = {**good, "part": "b", "chunks": [{"seq": 0}]}  # no text: fails after part a was rewritten
    with pytest.raises(KeyError):
        store.replace_file(collection, "/x", "sha2", [{**good, "title": "A2"}, broken])
    assert [(d["id"], d["title"], d["sha256"]) for d in store.documents()] == [(doc_id, "A", "sha1")]
    assert [c.text for c in store.chunks()] == ["Hello"]
    assert not store.db.conn.in_transaction


# killed ingest

KILLABLE = textwrap.dedent(
    """
    import functools, sqlite3, sys, time

    class Connection(sqlite3.Connection):
        # Stop for good just before the COMMIT of a file's rows, and say so.
        wrote_chunks = False

        def executemany(self, sql, rows):
            if sql.lstrip().lower().startswith("insert into chunks"):
                Connection.wrote_chunks = True
            return super().executemany(sql, rows)

        def execute(self, sql, *args):
            if sql == "commit" and Connection.wrote_chunks:
                print("writing", flush=True)
                time.sleep(600)
            return super().execute(sql, *args)

    sqlite3.connect = functools.partial(sqlite3.connect, factory=Connection)
    from evsel.cli import main
    sys.exit(main(["ingest", *sys.argv[1:]]))
    """
)


def test_killed_ingest_leaves_the_store_as_it_was(tmp_path):
    story = sample_story_path().read_text(encoding="utf-8")
    earlier = tmp_path / "earlier.txt"
    earlier.write_text("The harbour master kept a log. It recorded every ship.\n")
    big = tmp_path / "big.md"
    big.write_text(story)
    ingest(earlier, big)
    db = connect()
    documents, chunks = rows(db, "documents"), rows(db, "chunks")
    db.conn.close()

    big.write_text(story + "\n" + story.replace("Agnes", "Agatha") * 2)  # a new, three times bigger version
    child = subprocess.Popen(
        [sys.executable, "-c", KILLABLE, str(big)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=os.environ.copy(),
    )
    try:
        line = child.stdout.readline()
        assert line.strip() == "writing", child.stderr.read() if child.poll() is not None else line
        assert child.poll() is None
        # the new version is written but not committed: this is the moment to die
        wal = Path(str(db_path()) + "-wal")
        assert wal.exists()
        os.kill(child.pid, signal.SIGKILL)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=60)
        child.stdout.close()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL

    store = Store()
    assert rows(store.db, "documents") == documents
    assert rows(store.db, "chunks") == chunks
    assert "Agatha" not in " ".join(c.text for c in store.chunks())
    assert_consistent(store)
    # and the next ingest of the new version goes through
    [result] = ingest(big)
    assert result["status"] == "ingested"
    assert "".join(c.text for c in Store().chunks(result["doc_ids"])) == big.read_text(encoding="utf-8")


# pending work: what an ingest began or deferred, kept until done (the daemon resumes what a crash left)


def test_m009_reads_the_old_bit_flag_as_named_booleans(monkeypatch):
    from evsel.settings import Settings

    names = [name for name, _ in MIGRATIONS]
    monkeypatch.setattr(migrations, "MIGRATIONS", MIGRATIONS[: names.index("m009_pending_encode_flags")])
    db = connect()  # a store as evsel left it before m009
    settings = json.dumps(Settings().to_dict())
    for flag in (0, 1, 2, 3):  # bit 1: summaries, bit 2: no states
        db.execute("insert into pending_encodes (doc_ids, settings, created_at, summaries) values (?, ?, 0, ?)",
                   [json.dumps([flag + 1]), settings, flag])
    db.conn.close()
    monkeypatch.setattr(migrations, "MIGRATIONS", list(MIGRATIONS))
    work = Journal(Store()).pending_encodes()
    assert [(w.doc_ids, w.states, w.summaries) for w in work] == [
        ([1], True, False), ([2], True, True), ([3], False, False), ([4], False, True)]
    assert [w.what for w in work] == ["chunk states", "chunk states and summaries", "", "summaries"]
    assert all(w.settings == Settings() for w in work)


def test_pending_work_round_trips_with_named_fields():
    from evsel.store.journal import PendingEncode, PendingIngest
    from evsel.settings import Settings

    store = Store()
    journal = Journal(store)
    settings = Settings(model="/models/tiny.gguf", encode=False)
    [recorded] = journal.add_pending_ingests([PendingIngest("/books/a.md", "books", "book", 100,
                                                          {"resolve_links": False}, encode=True, settings=settings)])
    assert recorded.id is not None
    [back] = journal.pending_ingests()
    assert back == recorded
    assert (back.encode, back.summaries, back.settings) == (True, False, settings)
    assert back.options == {"resolve_links": False}
    # the row keeps the request's options as JSON, encode resolved (an old daemon reads it the same way)
    options = json.loads(store.db.execute("select options from pending_ingests").fetchone()[0])
    assert options == {"resolve_links": False, "encode": True, "summaries": False}
    journal.finish_pending_ingest(back.id)
    assert journal.pending_ingests() == []

    work = journal.add_pending_encode(PendingEncode([3, 4], settings, states=False, summaries=True))
    assert journal.pending_encodes() == [work]
    journal.finish_pending_encode(work.id)
    assert journal.pending_encodes() == []


def test_unreadable_pending_rows():
    store = Store()
    # an ingest whose options cannot be read resumes with its collection, kind and chunk size alone
    store.db.execute("insert into pending_ingests (path, collection, kind, chunk_tokens, options, settings) "
                     "values ('/a.md', 'books', 'auto', 90, '{\"encode\": true}', '{\"colour\": \"red\"}')")
    [pending] = Journal(store).pending_ingests()
    assert pending.unreadable and "colour" in pending.unreadable
    assert (pending.options, pending.encode, pending.settings, pending.chunk_tokens) == ({}, False, None, 90)
    # an encode whose row cannot be read is dropped: the first ask computes what it needs
    store.db.execute("insert into pending_encodes (doc_ids, settings) values ('not json', '{}')")
    assert Journal(store).pending_encodes() == []
    assert store.db.execute("select count(*) from pending_encodes").fetchone()[0] == 0


def test_resume_arguments_keep_the_requests_options():
    from evsel.engine import resume_arguments
    from evsel.store.journal import PendingIngest

    pending = PendingIngest("/books/a.md", "books", "book", 100, {"resolve_links": False, "from_the_future": 1},
                            encode=True, summaries=True)
    assert resume_arguments(pending) == {"targets": ["/books/a.md"], "collection": "books", "kind": "book",
                                         "chunk_tokens": 100, "resolve_links": False, "encode": True, "summaries": True}
    assert resume_arguments(pending, with_options=False) == {"targets": ["/books/a.md"], "collection": "books",
                                                             "encode": True, "summaries": True}
    old_row = PendingIngest("/a.md", "default", "auto", None)  # from before m006: no options, no encoding
    assert resume_arguments(old_row) == {"targets": ["/a.md"], "collection": "default", "kind": "auto",
                                         "encode": False, "summaries": False}


def test_a_deferred_ingest_records_each_file_until_done_and_returns_its_followups(tmp_path):
    from evsel.engine import IngestOptions
    from evsel.settings import Settings

    a, b = tmp_path / "a.md", tmp_path / "b.md"
    a.write_text("# A\n\nThe keeper lit the lamp at dusk.\n")
    b.write_text("# B\n\nThe ferry left at noon.\n")
    engine = Engine(Settings(encode=True))
    seen = []

    def on_event(event):
        if event["type"] == "progress" and event["task"] == "files" and event["label"]:
            seen.append(sorted(p.path for p in engine.journal.pending_ingests()))

    outcome = engine.ingest_files([str(tmp_path)], IngestOptions(collection="notes"), on_event, defer=True,
                                  journal=True)
    assert seen == [[str(a), str(b)], [str(b)]]  # recorded before reading, each dropped once done
    assert engine.journal.pending_ingests() == []
    assert [r["states"] for r in outcome.files] == ["background", "background"]
    assert "summaries" not in outcome.files[0]
    [work] = outcome.followups
    assert (work.doc_ids, work.states, work.summaries, work.settings) == (
        [i for r in outcome.files for i in r["doc_ids"]], True, False, engine.settings)
    assert engine.journal.pending_encodes() == [work]
    assert engine.store.count_states() == 0  # deferred, not computed
    # the same ingest in-process (not deferred) has nothing left to do
    again = engine.ingest_files([str(a)], IngestOptions(collection="notes", encode=False))
    assert again.followups == [] and again.files[0]["status"] == "unchanged" and "states" not in again.files[0]

    # the deferred work, once run, leaves no record (nothing to compute for a document that is gone)
    engine.docs_rm(work.doc_ids)
    assert engine.run_deferred(work) == {"encoded": 0, "missing_before": 0, "qrranker_kv": 0}
    assert engine.journal.pending_encodes() == []


def test_a_cancelled_journaled_ingest_leaves_nothing_to_resume(tmp_path):
    from evsel.engine import IngestOptions

    for name in ("a.md", "b.md"):
        (tmp_path / name).write_text(f"# {name}\n\nSome text about {name}.\n")
    engine = Engine()

    class Cancelled(BaseException):
        pass

    def cancel_at_the_second_file(event):
        if event["type"] == "file":
            raise Cancelled()

    with pytest.raises(Cancelled) as cancelled:
        engine.ingest_files([str(tmp_path)], IngestOptions(), cancel_at_the_second_file, journal=True)
    assert engine.journal.pending_ingests() == []
    assert len(engine.store.documents()) == 1
    assert cancelled.value.stored_files == [str(tmp_path / "a.md")]  # what the cancel kept, for the log


def test_replace_file_checks_between_batches_and_a_cancel_rolls_the_file_back(monkeypatch):
    monkeypatch.setattr(store_module, "WRITE_BATCH", 10)
    store = Store()
    collection = store.collection_id("default", create=True)
    [doc_id] = store.replace_file(collection, "/x", "sha1", [_doc("a", ["old one", "old two"])])

    def stored():
        return [store.db.execute(f"select * from {t} order by 1").fetchall() for t in ("documents", "chunks", "bm25_docs")]

    before = stored()

    class Cancelled(BaseException):
        pass

    calls = []

    def cancel_after_two_batches(stored: int, total: int) -> None:
        calls.append((stored, total))
        if stored >= 20:
            raise Cancelled()

    new = _doc("a", [f"new chunk {i}" for i in range(45)])
    with pytest.raises(Cancelled):
        store.replace_file(collection, "/x", "sha2", [new], on_batch=cancel_after_two_batches)
    assert calls == [(0, 45), (10, 45), (20, 45)]  # checked before the write and after each batch
    assert stored() == before
    assert not store.db.conn.in_transaction
    # uncancelled, every batch (and the BM25 rows after them) is reported
    calls.clear()
    assert store.replace_file(collection, "/x", "sha2", [new], on_batch=lambda s, t: calls.append((s, t))) == [doc_id]
    assert calls == [(0, 45), (10, 45), (20, 45), (30, 45), (40, 45), (45, 45), (45, 45)]
    assert len(store.chunks([doc_id])) == 45


def test_a_files_pending_record_ends_in_the_transaction_that_stores_it():
    """A crash between storing a file and ending its pending-ingest record left the file both stored
    and due to be ingested again: the two now commit together, or neither does."""
    from evsel.store.journal import PendingIngest
    from evsel.ingest.chunker import content_hash

    store = Store()
    journal = Journal(store)
    collection = store.collection_id("books", create=True)
    recorded = journal.add_pending_ingests([PendingIngest(f"/{name}.md", "books", "book", 100) for name in "ab"])
    doc = {"part": "", "kind": "book", "title": "t", "metadata": {}, "n_chars": 4,
           "chunks": [{"seq": 0, "text": "text", "content_hash": content_hash("text"), "n_tokens": 1,
                       "char_start": 0, "char_end": 4}]}
    store.replace_file(collection, "/a.md", "a1", [doc],
                       before_commit=lambda: journal.finish_pending_ingest(recorded[0].id))
    assert [p.path for p in journal.pending_ingests()] == ["/b.md"] and store.documents_for_path(collection, "/a.md")

    def crash():
        journal.finish_pending_ingest(recorded[1].id)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        store.replace_file(collection, "/b.md", "b1", [doc], before_commit=crash)
    assert [p.path for p in journal.pending_ingests()] == ["/b.md"] and not store.documents_for_path(collection, "/b.md")
