"""SQLite store (sqlite-utils, WAL): collections, documents, chunks. Schema grows by numbered migrations."""

from __future__ import annotations

import gc
import hashlib
import json
import os
import shlex
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from . import paths
from .defaults import DEFAULT_COLLECTION  # defined there for the CLI's options
from .errors import EvselError, NotFoundError, StoreError, UnsafeHomeError, known_error
from .settings import Settings

if TYPE_CHECKING:  # imported where a store is opened: the CLI's client path never opens one
    import sqlite_utils

MIGRATIONS: list[tuple[str, Callable[[sqlite_utils.Database], None]]] = []


def migration(fn: Callable[[sqlite_utils.Database], None]):
    MIGRATIONS.append((fn.__name__, fn))
    return fn


@migration
def m001_create_tables(db: sqlite_utils.Database) -> None:
    db["collections"].create(
        {"id": int, "name": str, "created_at": float}, pk="id", not_null={"name"}
    )
    db["collections"].create_index(["name"], unique=True)
    db["documents"].create(
        {
            "id": int,
            "collection_id": int,
            "path": str,  # absolute path of the source file
            "part": str,  # one file may hold several documents (LoCoMo JSON): the part's key, else ""
            "sha256": str,  # of the whole source file
            "kind": str,  # book | pdf | dialogue
            "title": str,
            "metadata": str,  # JSON
            "n_chars": int,
            "n_chunks": int,
            "n_tokens": int,
            "created_at": float,
            "updated_at": float,
        },
        pk="id",
        foreign_keys=[("collection_id", "collections", "id")],
    )
    db["documents"].create_index(["collection_id", "path", "part"], unique=True)
    db["chunks"].create(
        {
            "id": int,
            "doc_id": int,
            "seq": int,  # position in the document, from 0
            "text": str,
            "content_hash": str,  # sha256 of text: key of every per-chunk cache
            "n_tokens": int,
            "char_start": int,
            "char_end": int,
            "page_start": int,
            "page_end": int,
            "speakers": str,  # JSON list
            "session": str,
            "turn_ids": str,  # JSON list
            "time_start": str,
            "time_end": str,
        },
        pk="id",
        foreign_keys=[("doc_id", "documents", "id")],
    )
    db["chunks"].create_index(["doc_id", "seq"], unique=True)
    db["chunks"].create_index(["content_hash"])


@migration
def m002_daemon_watches_and_pending(db: sqlite_utils.Database) -> None:
    # folders the daemon watches; they survive restarts
    db["watches"].create({"path": str, "collection": str, "created_at": float}, pk="path")
    # files the daemon began to ingest; a row left behind by a crash makes the next start re-ingest it
    db["pending_ingests"].create(
        {"id": int, "path": str, "collection": str, "kind": str, "chunk_tokens": int, "created_at": float}, pk="id"
    )


@migration
def m003_chunk_states(db: sqlite_utils.Database) -> None:
    # Per-chunk internal states of the backbone (UNREAL residual states, later BlockSearch or
    # QRRanker keys), keyed by what they depend on: the chunk text's hash, the model's
    # fingerprint, the method and its config. Shared by every document holding the same text.
    db.execute(
        "create table chunk_states ("
        " content_hash text not null,"
        " model text not null,"  # backbone fingerprint
        " method text not null,"  # unreal | intrinsic | ...
        " config text not null,"  # canonical method config, e.g. layer=20;pool=7
        " shape text not null,"  # JSON list
        " dtype text not null,"  # numpy dtype name, float16
        " data blob not null,"
        " created_at float,"
        " primary key (content_hash, model, method, config)) without rowid"
    )


@migration
def m004_bm25_index(db: sqlite_utils.Database) -> None:
    # BM25's per-document postings and vocabulary (evsel/bm25_index.py), written by replace_file in
    # the same transaction as the chunks, so an ask reads its scope's statistics instead of
    # tokenizing every chunk. Documents stored before this migration are indexed here.
    from . import bm25_index

    for sql in bm25_index.SCHEMA:
        db.execute(sql)
    bm25_index.backfill(db.conn)


@migration
def m005_pending_encodes(db: sqlite_utils.Database) -> None:
    # Per-chunk states the daemon computes in the background after an ingest: one row per ingest
    # request until its documents are encoded, so a daemon killed mid-encode resumes at its next start.
    db.execute(
        "create table pending_encodes (id integer primary key, doc_ids text not null, settings text not null,"
        " created_at float)"
    )


@migration
def m006_pending_ingest_options(db: sqlite_utils.Database) -> None:
    # Every option of the ingest request a pending file belongs to (JSON: Engine.ingest's keyword
    # arguments, `encode` resolved) and the request's settings, so a resumed ingest does exactly
    # what was asked (a --no-encode ingest stays one). Rows from before this migration have none:
    # they resume with their collection, kind and chunk size, and without encoding.
    db.execute("alter table pending_ingests add column options text")
    db.execute("alter table pending_ingests add column settings text")


@migration
def m007_document_ids_never_reused(db: sqlite_utils.Database) -> None:
    # `documents.id` becomes AUTOINCREMENT, so the id of a removed document is never given to
    # another one (`--doc 2` in a script keeps meaning one document). SQLite's table rebuild: the
    # rows keep their ids; chunks and bm25_docs reference documents(id) by name, so they point at
    # the new table once it is renamed. Runs with foreign keys off (the drop would otherwise delete
    # every chunk's parent) and checked with foreign_key_check before its commit (`migrate`).
    sql = db.execute("select sql from sqlite_master where type = 'table' and name = 'documents'").fetchone()[0]
    if "autoincrement" in sql.lower():
        return
    import re

    new_sql, n = re.subn(r"([\[\"]?id[\]\"]?\s+INTEGER\s+PRIMARY\s+KEY)", r"\1 AUTOINCREMENT", sql, count=1, flags=re.I)
    if n != 1:
        raise StoreError("cannot find the documents table's id column", "the store's schema is not evsel's")
    new_sql = re.sub(r"^CREATE TABLE\s+(\[documents\]|\"documents\"|documents)", "CREATE TABLE documents_m007",
                     new_sql, count=1, flags=re.I)
    indexes = [r[0] for r in db.execute(
        "select sql from sqlite_master where type = 'index' and tbl_name = 'documents' and sql is not null")]
    db.execute(new_sql)
    db.execute("insert into documents_m007 select * from documents")
    db.execute("drop table documents")
    db.execute("alter table documents_m007 rename to documents")
    for index in indexes:
        db.execute(index)
    top = db.execute("select max(id) from documents").fetchone()[0]
    if top is not None:
        db.execute("delete from sqlite_sequence where name = 'documents'")
        db.execute("insert into sqlite_sequence (name, seq) values ('documents', ?)", [top])


m007_document_ids_never_reused.without_foreign_keys = True  # type: ignore[attr-defined]


@migration
def m008_summaries(db: sqlite_utils.Database) -> None:
    # Block and session summaries for QRRanker's memory prefix (models/memory.py), keyed by the
    # block's chunks' content, the writer's fingerprint and the summary config; `first_hash` (the
    # block's first chunk) lets a delete drop the summaries no chunk holds any more. A background
    # encode records whether it also writes summaries.
    db.execute(
        "create table summaries (key text primary key, model text not null, kind text not null,"
        " first_hash text not null, text text not null, seconds float, created_at float)"
    )
    db.execute("create index summaries_first_hash on summaries (first_hash)")
    db.execute("alter table pending_encodes add column summaries integer not null default 0")


@migration
def m009_pending_encode_flags(db: sqlite_utils.Database) -> None:
    # A background encode says what it computes in two booleans, `states` and `summaries`; until
    # now `summaries` held both as bits (1: summaries, 2: no states). Rows already there keep
    # their meaning.
    db.execute("alter table pending_encodes add column states integer not null default 1")
    db.execute("update pending_encodes set states = (summaries & 2) = 0, summaries = summaries & 1")


def migrate(db: sqlite_utils.Database) -> list[str]:
    """Apply the migrations not yet applied, each in its own transaction. Returns their names."""
    db.execute(
        "create table if not exists _evsel_migrations (name text primary key, applied_at float)"
    )
    done = {row[0] for row in db.execute("select name from _evsel_migrations").fetchall()}
    known = {name for name, _ in MIGRATIONS}
    unknown = done - known
    if unknown:
        raise StoreError(
            f"the store was written by a newer evsel (migrations {sorted(unknown)})",
            "upgrade evsel or point EVSEL_HOME elsewhere",
        )
    applied = []
    for name, fn in MIGRATIONS:
        if name in done:
            continue
        # a table rebuild (m007) runs with foreign keys off (a no-op inside a transaction, so set
        # before it) and is checked before it commits
        fk_off = getattr(fn, "without_foreign_keys", False)
        fk_was = db.execute("pragma foreign_keys").fetchone()[0] if fk_off else None
        if fk_off:
            db.conn.execute("pragma foreign_keys = off")
        try:
            db.conn.execute("begin immediate")
            try:
                # another process may have applied it while we waited for the write lock
                if db.execute("select 1 from _evsel_migrations where name = ?", [name]).fetchone():
                    db.conn.execute("commit")
                    continue
                fn(db)
                if fk_off and db.execute("pragma foreign_key_check").fetchone() is not None:
                    raise StoreError(f"migration {name} would break the store's references",
                                     "report it; the store was left as it was")
                db.execute("insert into _evsel_migrations values (?, ?)", [name, time.time()])
                db.conn.execute("commit")
            except BaseException:
                _rollback(db.conn)
                raise
        finally:
            if fk_off and fk_was:
                db.conn.execute("pragma foreign_keys = on")
        applied.append(name)
    return applied


def _rollback(conn: sqlite3.Connection) -> None:
    """Roll back the open transaction, if SQLite has not already: on a full disk (SQLITE_FULL) it
    rolls back by itself, and a second "rollback" would fail and hide the real error."""
    if conn.in_transaction:
        try:
            conn.execute("rollback")
        except sqlite3.Error:
            pass  # the error being raised says what went wrong


BUSY_TIMEOUT_S = 60  # how long a command waits for another process's write to the store to end


def _refuse_planted(path: Path, in_home: bool) -> None:
    """Refuse a store in a folder other users can write to, and a store file (or its -wal, -shm or
    -journal) that is a symlink or another user's: either way they would read what we write."""
    text = str(path)
    if not text or text == ":memory:" or text.startswith("file:"):
        return
    try:
        problem = paths.folder_problem(Path(os.path.abspath(text)).parent)
    except OSError:
        return  # no such folder: sqlite3 says so when it opens the file
    if problem:
        what, fix = problem
        raise UnsafeHomeError(f"{'EVSEL_HOME ' if in_home else ''}{what}, so evsel will not keep your documents "
                              "there", fix)
    for name in (text, f"{text}-wal", f"{text}-shm", f"{text}-journal"):
        why = paths.file_problem(name)
        if why:
            quoted = shlex.quote(name)
            raise UnsafeHomeError(f"{name} {why}, so evsel will not write your documents to it",
                                  f"remove it (rm {quoted}), or if it is yours (made with sudo?) chown it to you")


def connect(path: Path | None = None) -> sqlite_utils.Database:
    """Open the store in WAL mode with a generous busy timeout, migrated to the current schema."""
    in_home = path is None
    path = path or paths.db_path()
    _refuse_planted(path, in_home)
    try:
        created = paths.create_private_file(path)  # 0600 from the start: it holds the ingested text
        conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        conn.execute(f"pragma busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        import sqlite_utils

        db = sqlite_utils.Database(conn)
        if db.journal_mode != "wal":
            db.enable_wal()
        if created:  # SQLite gives -wal and -shm the database's mode; make sure of it
            paths.make_private(path, f"{path}-wal", f"{path}-shm")
        db.execute("pragma foreign_keys = on")
        db.execute("pragma synchronous = normal")
        migrate(db)
    except sqlite3.DatabaseError as exc:
        known = known_error(exc)
        if known is not None:
            raise known from exc
        raise StoreError(f"cannot open the store {path}: {exc}", "check EVSEL_HOME; move a damaged file away") from exc
    return db


def _json_list(value: str | None) -> list:
    """A stored JSON list; most chunks have none, and json.loads of "[]" is most of a scope read."""
    return [] if not value or value == "[]" else json.loads(value)


def _chunk_records(cursor) -> list["ChunkRecord"]:
    """ChunkRecords straight from a cursor's tuples (no dict per row, no cyclic GC passes over
    the growing list): a 10^5-chunk scope in ~0.8 s instead of ~1.5 s."""
    at = {d[0]: i for i, d in enumerate(cursor.description)}
    (i_id, i_doc, i_seq, i_text, i_hash, i_tokens, i_start, i_end, i_ps, i_pe, i_sp, i_sess, i_turns, i_ts, i_te,
     i_title, i_kind, i_path) = (at[k] for k in (
        "id", "doc_id", "seq", "text", "content_hash", "n_tokens", "char_start", "char_end", "page_start",
        "page_end", "speakers", "session", "turn_ids", "time_start", "time_end", "title", "kind", "path"))
    enabled = gc.isenabled()
    gc.disable()
    try:
        return [ChunkRecord(r[i_id], r[i_doc], r[i_seq], r[i_text], r[i_hash], r[i_tokens] or 0, r[i_start], r[i_end],
                            r[i_ps], r[i_pe], _json_list(r[i_sp]), r[i_sess], _json_list(r[i_turns]), r[i_ts],
                            r[i_te], r[i_title] or "", r[i_kind] or "", r[i_path] or "") for r in cursor]
    finally:
        if enabled:
            gc.enable()


@dataclass
class ChunkRecord:
    """One stored chunk with its provenance and its document's identity."""

    id: int
    doc_id: int
    seq: int
    text: str
    content_hash: str
    n_tokens: int
    char_start: int
    char_end: int
    page_start: int | None = None
    page_end: int | None = None
    speakers: list[str] = field(default_factory=list)
    session: str | None = None
    turn_ids: list[str] = field(default_factory=list)
    time_start: str | None = None
    time_end: str | None = None
    title: str = ""
    kind: str = ""
    path: str = ""

    @classmethod
    def from_row(cls, row: dict) -> "ChunkRecord":
        return cls(
            id=row["id"],
            doc_id=row["doc_id"],
            seq=row["seq"],
            text=row["text"],
            content_hash=row["content_hash"],
            n_tokens=row["n_tokens"] or 0,
            char_start=row["char_start"],
            char_end=row["char_end"],
            page_start=row["page_start"],
            page_end=row["page_end"],
            speakers=_json_list(row["speakers"]),
            session=row["session"],
            turn_ids=_json_list(row["turn_ids"]),
            time_start=row["time_start"],
            time_end=row["time_end"],
            title=row.get("title") or "",
            kind=row.get("kind") or "",
            path=row.get("path") or "",
        )

    def provenance(self) -> dict:
        return {
            "doc_id": self.doc_id,
            "title": self.title,
            "path": self.path,
            "kind": self.kind,
            "chunk_id": self.id,
            "seq": self.seq,
            "char_start": self.char_start,
            "char_end": self.char_end,
            "page_start": self.page_start,
            "page_end": self.page_end,
            "speakers": self.speakers,
            "session": self.session,
            "turn_ids": self.turn_ids,
            "time_start": self.time_start,
            "time_end": self.time_end,
        }


@dataclass
class PendingIngest:
    """One file of an ingest request, recorded before it is read and deleted once it is done
    (stored, unchanged, failed or cancelled): a row a crash leaves behind is ingested again."""

    path: str
    collection: str
    kind: str
    chunk_tokens: int | None
    options: dict = field(default_factory=dict)  # the request's other `Engine.ingest` arguments (none before m006)
    encode: bool = False  # compute the file's chunk states afterwards
    summaries: bool = False  # write its memory summaries afterwards
    settings: Settings | None = None  # the request's (None before m006: whoever resumes it uses its own)
    id: int | None = None  # the row, once recorded
    unreadable: str | None = None  # why the row's options could not be read (then there are none)


@dataclass
class PendingEncode:
    """Work an ingest left for later: these documents' chunk states and/or memory summaries,
    recorded until it is done, so a process killed in the middle resumes it."""

    doc_ids: list[int]
    settings: Settings  # the ingest request's
    states: bool = True  # UNREAL's per-chunk states
    summaries: bool = False  # QRRanker's memory summaries
    id: int | None = None  # the row, once recorded

    @property
    def what(self) -> str:
        return " and ".join(w for w, on in (("chunk states", self.states), ("summaries", self.summaries)) if on)


# chunks written (and held in memory) between two `on_batch` calls of `Store.replace_file`: a cancel
# waits for at most one batch (about 0.1 s), and the calls cost nothing next to the inserts
WRITE_BATCH = 2000


class Store:
    """The engine's view of the database. Every write of one source file is one transaction."""

    def __init__(self, db: sqlite_utils.Database | None = None):
        self.db = db or connect()

    @contextmanager
    def _transaction(self):
        """One write transaction: committed at the end of the block, rolled back if it raises."""
        conn = self.db.conn
        conn.execute("begin immediate")
        try:
            yield conn
            conn.execute("commit")
        except BaseException as exc:
            _rollback(conn)
            known = known_error(exc) if isinstance(exc, sqlite3.Error) else None
            if known is not None:  # a full disk or a store locked too long: one line, nothing stored
                raise known from exc
            raise

    # collections
    def collection_id(self, name: str, create: bool = False) -> int | None:
        row = self.db.execute("select id from collections where name = ?", [name]).fetchone()
        if row:
            return row[0]
        if not create:
            return None
        self.db.execute("insert or ignore into collections (name, created_at) values (?, ?)", [name, time.time()])
        return self.db.execute("select id from collections where name = ?", [name]).fetchone()[0]

    def collections(self) -> list[dict]:
        return list(
            self.db.query(
                "select c.name, count(d.id) as documents, coalesce(sum(d.n_chunks), 0) as chunks "
                "from collections c left join documents d on d.collection_id = c.id group by c.id order by c.name"
            )
        )

    # documents
    def documents_for_path(self, collection_id: int, path: str) -> list[dict]:
        return list(
            self.db.query(
                "select * from documents where collection_id = ? and path = ? order by part",
                [collection_id, path],
            )
        )

    def replace_file(self, collection_id: int, path: str, sha256: str, docs: list[dict],
                     on_batch: Callable[[int, int | None], None] | None = None) -> list[int]:
        """Store every document parsed from one file, replacing that file's previous version atomically.

        `docs` items: {part, kind, title, metadata, n_chars, chunks}, where `chunks` is a list of chunk
        dicts or any iterable yielding them in seq order (the chunker's generator: a book's chunks are
        then never all in memory). They are written `WRITE_BATCH` at a time with their BM25 rows, all
        in one transaction: SQLite spills what it writes to the WAL on disk, so memory stays flat, and
        a crash before the commit leaves the previous version whole. Document ids stay stable across
        versions of the same (collection, path, part). Returns the document ids.
        `on_batch(stored, total)` is called (chunks written so far, of all: None when `chunks` are not
        lists) before the write, after each batch, and between the batches of deletes and index writes,
        inside the transaction: whatever it raises (a cancel) rolls the whole file back, so the store
        stays as it was.
        """
        from . import bm25_index

        now = time.time()
        ids = []
        dropped: set[str] = set()  # content hashes of the chunks this replaces
        total = sum(len(doc["chunks"]) for doc in docs) if all(
            hasattr(doc["chunks"], "__len__") for doc in docs) else None
        stored = 0

        def written(count: int) -> None:
            nonlocal stored
            stored += count
            if on_batch is not None:
                on_batch(stored, total)

        def checkpoint() -> None:
            written(0)

        with self._transaction() as conn:
            written(0)
            old = {row["part"]: row for row in self.documents_for_path(collection_id, path)}
            for doc in docs:
                values = {
                    "collection_id": collection_id,
                    "path": path,
                    "part": doc["part"],
                    "sha256": sha256,
                    "kind": doc["kind"],
                    "title": doc["title"],
                    "metadata": json.dumps(doc.get("metadata", {}), sort_keys=True),
                    "n_chars": doc["n_chars"],
                    "n_chunks": 0,  # counted as the chunks are written
                    "n_tokens": 0,
                    "updated_at": now,
                }
                previous = old.pop(doc["part"], None)
                if previous:
                    doc_id = previous["id"]
                    dropped |= self._chunk_hashes(doc_id)
                    bm25_index.drop_document(conn, doc_id, on_progress=checkpoint)
                    self._delete_chunks(doc_id, on_progress=checkpoint)
                    sets = ", ".join(f"{k} = ?" for k in values)
                    conn.execute(f"update documents set {sets} where id = ?", [*values.values(), doc_id])
                else:
                    values["created_at"] = now
                    cols = ", ".join(values)
                    marks = ", ".join("?" for _ in values)
                    doc_id = conn.execute(
                        f"insert into documents ({cols}) values ({marks})", list(values.values())
                    ).lastrowid
                indexer = bm25_index.DocumentIndexer(conn, doc_id)
                n_chunks = n_tokens = 0
                batch: list[dict] = []
                for chunk in doc["chunks"]:
                    batch.append(chunk)
                    if len(batch) >= WRITE_BATCH:
                        n_tokens += self._write_chunks(doc_id, batch, indexer)
                        n_chunks += len(batch)
                        written(len(batch))
                        batch = []
                if batch:
                    n_tokens += self._write_chunks(doc_id, batch, indexer)
                    n_chunks += len(batch)
                    written(len(batch))
                    batch = []
                # the BM25 postings of a long document take seconds too: checked within and after them
                indexer.finish(on_progress=checkpoint)
                conn.execute("update documents set n_chunks = ?, n_tokens = ? where id = ?", [n_chunks, n_tokens, doc_id])
                written(0)
                ids.append(doc_id)
            if total is None:  # streamed: the true total, once every chunk is written
                total = stored
                written(0)
            for stale in old.values():  # parts that vanished from the new version of the file
                dropped |= self._delete_document(stale["id"])
            orphans = self._drop_orphan_states(dropped)
        self._drop_orphan_files(orphans)
        return ids

    def _write_chunks(self, doc_id: int, batch: list[dict], indexer) -> int:
        """Insert one batch of a document's chunks and index them (inside the caller's transaction).
        Returns their tokens."""
        self.db.conn.executemany(
            "insert into chunks (doc_id, seq, text, content_hash, n_tokens, char_start, char_end, "
            "page_start, page_end, speakers, session, turn_ids, time_start, time_end) "
            "values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    doc_id, c["seq"], c["text"], c["content_hash"], c["n_tokens"], c["char_start"],
                    c["char_end"], c.get("page_start"), c.get("page_end"),
                    json.dumps(c.get("speakers", [])), c.get("session"),
                    json.dumps(c.get("turn_ids", [])), c.get("time_start"), c.get("time_end"),
                )
                for c in batch
            ],
        )
        indexer.add((c["text"], c["content_hash"]) for c in batch)
        return sum(c["n_tokens"] for c in batch)

    def _delete_chunks(self, doc_id: int, on_progress: Callable[[], None] | None = None) -> None:
        """Delete a document's chunks `WRITE_BATCH` seqs at a time (inside the caller's transaction),
        calling `on_progress` between batches: dropping a 10^5-chunk version takes seconds."""
        top = self.db.conn.execute("select max(seq) from chunks where doc_id = ?", [doc_id]).fetchone()[0]
        for at in range(0, (top if top is not None else -1) + 1, WRITE_BATCH):
            if at and on_progress is not None:
                on_progress()
            self.db.conn.execute("delete from chunks where doc_id = ? and seq >= ? and seq < ?",
                                 [doc_id, at, at + WRITE_BATCH])

    def _chunk_hashes(self, doc_id: int) -> set[str]:
        return {r[0] for r in self.db.conn.execute("select content_hash from chunks where doc_id = ?", [doc_id])}

    def _delete_document(self, doc_id: int) -> set[str]:
        """Delete one document, its chunks and its BM25 rows (inside the caller's transaction).
        Returns the content hashes of its chunks, for `_drop_orphan_states`."""
        from . import bm25_index

        hashes = self._chunk_hashes(doc_id)
        bm25_index.drop_document(self.db.conn, doc_id)
        self.db.conn.execute("delete from chunks where doc_id = ?", [doc_id])
        self.db.conn.execute("delete from documents where id = ?", [doc_id])
        return hashes

    def _drop_orphan_states(self, hashes: Iterable[str]) -> list[str]:
        """Delete the cached states (m003) of these content hashes that no chunk holds any more
        (states are shared by every chunk with the same text, so only the last one takes them).
        Returns those orphaned hashes, for `_drop_orphan_files` once the transaction commits."""
        orphans = [(h,) for h in hashes
                   if not self.db.conn.execute("select 1 from chunks where content_hash = ? limit 1", [h]).fetchone()]
        self.db.conn.executemany("delete from chunk_states where content_hash = ?", orphans)
        if self.db.conn.execute("select 1 from sqlite_master where name = 'summaries'").fetchone():  # m008
            self.db.conn.executemany("delete from summaries where first_hash = ?", orphans)
        return [h for (h,) in orphans]

    # hook(store, content_hashes) of a component keeping per-chunk data outside the database (a
    # selector's files beside it): registered by that component, run after a deletion commits
    _chunk_cleanups: list[Callable[["Store", list[str]], None]] = []

    @classmethod
    def on_chunks_deleted(cls, hook: Callable[["Store", list[str]], None]):
        """Register `hook(store, hashes)`, called with the content hashes no chunk holds any more
        once their deletion has committed (a rolled-back one keeps the data). Usable as a decorator."""
        if hook not in cls._chunk_cleanups:
            cls._chunk_cleanups.append(hook)
        return hook

    def _drop_orphan_files(self, hashes: Iterable[str] | None) -> None:
        """Run the registered cleanups for orphaned content hashes, after the commit. One that
        cannot delete a file leaves it (those are caches: an orphan costs disk, never a wrong
        answer)."""
        hashes = list(hashes or ())
        if not hashes:
            return
        for cleanup in list(self._chunk_cleanups):
            try:
                cleanup(self, hashes)
            except OSError:
                pass

    def remove_documents(self, doc_ids: Iterable[int]) -> None:
        with self._transaction():
            dropped: set[str] = set()
            for doc_id in doc_ids:
                dropped |= self._delete_document(doc_id)
            orphans = self._drop_orphan_states(dropped)
        self._drop_orphan_files(orphans)

    def documents(self, collection: str | None = None) -> list[dict]:
        sql = (
            "select d.id, c.name as collection, d.title, d.kind, d.path, d.part, d.sha256, d.n_chars, "
            "d.n_chunks, d.n_tokens, d.metadata, d.created_at, d.updated_at "
            "from documents d join collections c on c.id = d.collection_id"
        )
        args: list = []
        if collection is not None:
            sql += " where c.name = ?"
            args.append(collection)
        rows = list(self.db.query(sql + " order by d.id", args))
        for row in rows:
            row["metadata"] = json.loads(row["metadata"] or "{}")
        return rows

    def totals(self) -> tuple[int, int]:
        """(documents, chunks) in the whole store."""
        documents, chunks = self.db.execute("select count(*), coalesce(sum(n_chunks), 0) from documents").fetchone()
        return documents, chunks

    def document(self, doc_id: int) -> dict:
        rows = [d for d in self.documents() if d["id"] == doc_id]
        if not rows:
            raise NotFoundError(f"no document with id {doc_id}", "list documents with: evsel docs list")
        return rows[0]

    # BM25 index (m004)
    def bm25_scope(self, chunks: list[ChunkRecord]):
        """The persisted BM25 index of a scope (a `bm25_index.Scope`); None unless `chunks` are
        whole documents of this store, each in order."""
        from . import bm25_index

        return bm25_index.open_scope(self.db.conn, chunks)

    def bm25_scores(self, scope, query: list[str], k1: float, b: float):
        """rank-bm25's BM25Okapi scores (an ndarray) of a `bm25_scope` for the query tokens; None
        when one of its documents was replaced or removed since the scope was opened."""
        return scope.scores(self.db.conn, query, k1, b)

    # per-chunk states (m003): numpy arrays, fetched and written in bulk
    def get_states(self, model: str, method: str, config: str, hashes: Iterable[str]) -> dict:
        """{content_hash: ndarray} for the hashes whose states are stored; the others are absent."""
        import numpy as np

        wanted = list(dict.fromkeys(hashes))
        found = {}
        for at in range(0, len(wanted), 500):  # stay under SQLite's bound-parameter limit
            part = wanted[at:at + 500]
            rows = self.db.execute(
                "select content_hash, shape, dtype, data from chunk_states where model = ? and method = ? "
                f"and config = ? and content_hash in ({', '.join('?' for _ in part)})",
                [model, method, config, *part],
            ).fetchall()
            for content_hash, shape, dtype, data in rows:
                found[content_hash] = np.frombuffer(data, dtype=dtype).reshape(json.loads(shape))
        return found

    def put_states(self, model: str, method: str, config: str, states: dict) -> None:
        """Store {content_hash: ndarray} in one transaction; a state already there is kept."""
        import numpy as np

        now = time.time()
        rows = []
        for content_hash, array in states.items():
            array = np.ascontiguousarray(array)
            rows.append((content_hash, model, method, config, json.dumps(list(array.shape)), array.dtype.name,
                         array.tobytes(), now))
        with self._transaction() as conn:
            conn.executemany("insert or ignore into chunk_states values (?, ?, ?, ?, ?, ?, ?, ?)", rows)

    # block summaries (m008)
    def get_summaries(self, keys: Iterable[str]) -> dict[str, str]:
        wanted = list(dict.fromkeys(keys))
        found: dict[str, str] = {}
        for at in range(0, len(wanted), 500):
            part = wanted[at:at + 500]
            rows = self.db.execute(f"select key, text from summaries where key in ({', '.join('?' for _ in part)})",
                                   part).fetchall()
            found.update(dict(rows))
        return found

    def put_summary(self, key: str, model: str, kind: str, first_hash: str, text: str, seconds: float) -> None:
        with self._transaction() as conn:
            conn.execute("insert or ignore into summaries values (?, ?, ?, ?, ?, ?, ?)",
                         [key, model, kind, first_hash, text, seconds, time.time()])

    def count_summaries(self) -> int:
        return self.db.execute("select count(*) from summaries").fetchone()[0]

    def chunks_missing_states(self, model: str, method: str, config: str,
                              doc_ids: list[int] | None = None) -> list[ChunkRecord]:
        """Chunks (of `doc_ids`, or all) whose state for (model, method, config) is not stored, one
        per distinct text, in document order."""
        sql = (
            "select ch.*, d.title, d.kind, d.path from chunks ch join documents d on d.id = ch.doc_id "
            "where not exists (select 1 from chunk_states s where s.content_hash = ch.content_hash "
            "and s.model = ? and s.method = ? and s.config = ?)"
        )
        args: list = [model, method, config]
        if doc_ids:
            sql += f" and ch.doc_id in ({', '.join('?' for _ in doc_ids)})"
            args.extend(doc_ids)
        seen: set[str] = set()
        out = []
        for row in self.db.query(sql + " order by ch.doc_id, ch.seq", args):
            if row["content_hash"] not in seen:
                seen.add(row["content_hash"])
                out.append(ChunkRecord.from_row(row))
        return out

    def count_states(self, model: str | None = None, method: str | None = None) -> int:
        sql, args = "select count(*) from chunk_states", []
        where = [(c, v) for c, v in (("model", model), ("method", method)) if v is not None]
        if where:
            sql += " where " + " and ".join(f"{c} = ?" for c, _ in where)
            args = [v for _, v in where]
        return self.db.execute(sql, args).fetchone()[0]

    # watched folders (m002), kept by the daemon
    def watches(self) -> list[dict]:
        return list(self.db.query("select path, collection, created_at from watches order by path"))

    def add_watch(self, path: str, collection: str) -> bool:
        """Remember a folder; True when it was not watched before (an existing one takes the new collection)."""
        existed = self.db.execute("select 1 from watches where path = ?", [path]).fetchone() is not None
        self.db.execute(
            "insert into watches (path, collection, created_at) values (?, ?, ?) "
            "on conflict(path) do update set collection = excluded.collection",
            [path, collection, time.time()],
        )
        return not existed

    def remove_watch(self, path: str) -> bool:
        return self.db.execute("delete from watches where path = ?", [path]).rowcount > 0

    # pending work (m002, m005, m006, m009): what an ingest began or left for later; rows a crash
    # leaves behind are picked up at the daemon's next start
    def add_pending_ingests(self, files: list[PendingIngest]) -> list[PendingIngest]:
        """Record these files (in one transaction); returns them with their row ids."""
        now = time.time()
        recorded = []
        with self._transaction() as conn:
            for item in files:
                options = {**item.options, "encode": bool(item.encode), "summaries": bool(item.summaries)}
                settings = json.dumps(item.settings.to_dict()) if item.settings is not None else None
                row_id = conn.execute(
                    "insert into pending_ingests (path, collection, kind, chunk_tokens, options, settings, created_at) "
                    "values (?, ?, ?, ?, ?, ?, ?)",
                    [item.path, item.collection, item.kind, item.chunk_tokens, json.dumps(options), settings, now],
                ).lastrowid
                recorded.append(replace(item, id=row_id))
        return recorded

    def pending_ingests(self) -> list[PendingIngest]:
        """The files recorded and not finished, oldest first. A row whose options or settings this
        version cannot read comes back without them (`unreadable` says why)."""
        out = []
        for row in self.db.query("select * from pending_ingests order by id"):
            options, settings, unreadable = {}, None, None
            try:
                options = json.loads(row.get("options") or "{}")
                if row.get("settings"):
                    settings = Settings.from_dict(json.loads(row["settings"]))
            except (ValueError, TypeError, EvselError) as exc:
                options, settings, unreadable = {}, None, str(exc)
            options = dict(options) if isinstance(options, dict) else {}
            out.append(PendingIngest(
                path=row["path"], collection=row["collection"], kind=row["kind"], chunk_tokens=row["chunk_tokens"],
                encode=bool(options.pop("encode", False)), summaries=bool(options.pop("summaries", False)),
                options=options, settings=settings, id=row["id"], unreadable=unreadable,
            ))
        return out

    def documents_signature(self) -> str:
        """Changes whenever any document is added, replaced, moved or removed."""
        row = self.db.execute(
            "select group_concat(id || ':' || updated_at || ':' || n_chunks || ':' || collection_id, ',') "
            "from (select * from documents order by id)"
        ).fetchone()
        return hashlib.sha1((row[0] or "").encode()).hexdigest()

    def finish_pending_ingest(self, row_id: int) -> None:
        self.db.execute("delete from pending_ingests where id = ?", [row_id])

    def wait_for_writers(self, seconds: float) -> None:
        """How long a write waits for another connection's transaction before "database is locked"."""
        self.db.conn.execute(f"pragma busy_timeout = {int(seconds * 1000)}")

    def add_pending_encode(self, work: PendingEncode) -> PendingEncode:
        """Record deferred work; returns it with its row id."""
        row_id = self.db.execute(
            "insert into pending_encodes (doc_ids, settings, created_at, states, summaries) values (?, ?, ?, ?, ?)",
            [json.dumps(work.doc_ids), json.dumps(work.settings.to_dict()), time.time(), int(work.states),
             int(work.summaries)],
        ).lastrowid
        return replace(work, id=row_id)

    def pending_encodes(self) -> list[PendingEncode]:
        """The deferred work recorded and not finished, oldest first. A row this version cannot read
        is deleted instead: its states and summaries are computed when an ask first needs them."""
        out = []
        for row in list(self.db.query("select * from pending_encodes order by id")):
            try:
                settings = Settings.from_dict(json.loads(row["settings"]))
                doc_ids = [int(i) for i in json.loads(row["doc_ids"])]
            except (ValueError, TypeError, EvselError):
                self.finish_pending_encode(row["id"])
                continue
            out.append(PendingEncode(doc_ids, settings, states=bool(row["states"]), summaries=bool(row["summaries"]),
                                     id=row["id"]))
        return out

    def finish_pending_encode(self, row_id: int) -> None:
        self.db.execute("delete from pending_encodes where id = ?", [row_id])

    def chunks(self, doc_ids: list[int] | None = None, collection: str | None = None) -> list[ChunkRecord]:
        """Chunks in scope, in document order."""
        sql = (
            "select ch.*, d.title, d.kind, d.path from chunks ch join documents d on d.id = ch.doc_id "
            "join collections c on c.id = d.collection_id"
        )
        where, args = [], []
        if doc_ids:
            where.append(f"ch.doc_id in ({', '.join('?' for _ in doc_ids)})")
            args.extend(doc_ids)
        if collection is not None:
            where.append("c.name = ?")
            args.append(collection)
        if where:
            sql += " where " + " and ".join(where)
        sql += " order by ch.doc_id, ch.seq"
        return _chunk_records(self.db.conn.execute(sql, args))
