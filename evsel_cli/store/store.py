"""SQLite store (sqlite-utils, WAL): collections, documents, chunks, per-chunk states and summaries.

The schema is evsel/store/migrations.py's; the daemon's watch list and pending work, in the same database,
are evsel/store/journal.py's."""

from __future__ import annotations

import gc
import hashlib
import json
import os
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Protocol

from .. import paths
from ..defaults import DEFAULT_COLLECTION  # defined there for the CLI's options
from ..errors import InputError, NotFoundError, StoreError, known_error
from .migrations import migrate
from .transaction import rollback

if TYPE_CHECKING:  # imported where a store is opened: the CLI's client path never opens one
    import sqlite_utils

BUSY_TIMEOUT_S = 60  # how long a command waits for another process's write to the store to end


def _refuse_planted(path: Path, in_home: bool) -> None:
    """Refuse a store in a folder other users can write to, and a store file (or its -wal, -shm or
    -journal) that is a symlink, another user's or writable by others: they would read what we write."""
    text = str(path)
    if not text or text == ":memory:" or text.startswith("file:"):
        return
    folder = Path(os.path.abspath(text)).parent
    for name in (text, f"{text}-wal", f"{text}-shm", f"{text}-journal"):
        paths.refuse_unsafe(name, folder, label="EVSEL_HOME " if in_home else "",
                            purpose="write your documents to it")
    if in_home:  # and what the methods keep beside the store (qrranker/, models/, ...): planted, it is refused here
        paths.refuse_unsafe(folder, folder, tree=True, depth=1)


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
        from . import bm25_index

        bm25_index.repair(conn)  # derived from the chunks: a table of it dropped is rebuilt, not an error
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


def check_collection_name(name: str) -> None:
    """A name with bytes that are not UTF-8 (from the command line, as lone surrogates) cannot be
    stored or looked up: said in one line instead of SQLite's UnicodeEncodeError."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        shown = name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        raise InputError(f"the collection name '{shown}' is not UTF-8 text",
                         "name the collection in UTF-8 (for example --collection reports)") from None


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


class ChunkCache(Protocol):
    """Where a store keeps scopes' chunks between requests (daemon/cache.py's)."""

    def scope_chunks(self, scope: tuple, read: Callable[[], list[ChunkRecord]]) -> list[ChunkRecord]: ...


# chunks written (and held in memory) between two `on_batch` calls of `Store.replace_file`: a cancel
# waits for at most one batch (about 0.1 s), and the calls cost nothing next to the inserts
WRITE_BATCH = 2000


class _WriteProgress:
    """`Store.replace_file`'s `on_batch` calls: chunks written so far, of `total` (None while
    streamed). A call is also where a cancel raised by `on_batch` lands."""

    def __init__(self, on_batch: Callable[[int, int | None], None] | None, total: int | None):
        self.on_batch = on_batch
        self.total = total
        self.stored = 0

    def written(self, count: int) -> None:
        self.stored += count
        if self.on_batch is not None:
            self.on_batch(self.stored, self.total)

    def checkpoint(self) -> None:
        self.written(0)


class Store:
    """The engine's view of the database. Every write of one source file is one transaction."""

    def __init__(self, db: sqlite_utils.Database | None = None, chunk_cache: ChunkCache | None = None):
        self.db = db or connect()
        self.chunk_cache = chunk_cache  # keeps scopes' chunks between requests (the daemon's); None: read each time

    @contextmanager
    def transaction(self):
        """One write transaction: committed at the end of the block, rolled back if it raises."""
        conn = self.db.conn
        conn.execute("begin immediate")
        try:
            yield conn
            conn.execute("commit")
        except BaseException as exc:
            rollback(conn)
            known = known_error(exc) if isinstance(exc, sqlite3.Error) else None
            if known is not None:  # a full disk or a store locked too long: one line, nothing stored
                raise known from exc
            raise

    # collections
    def collection_id(self, name: str, create: bool = False) -> int | None:
        check_collection_name(name)
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
                     on_batch: Callable[[int, int | None], None] | None = None,
                     before_commit: Callable[[], None] | None = None) -> list[int]:
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
        stays as it was. `before_commit()` runs last inside the transaction: what it writes (the file's
        pending-ingest record deleted) commits with the file or not at all.
        """
        now = time.time()
        ids = []
        dropped: set[str] = set()  # content hashes of the chunks this replaces
        progress = _WriteProgress(on_batch, sum(len(doc["chunks"]) for doc in docs) if all(
            hasattr(doc["chunks"], "__len__") for doc in docs) else None)
        with self.transaction() as conn:
            progress.written(0)
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
                doc_id = self._document_row(conn, values, old.pop(doc["part"], None), dropped, progress)
                n_chunks, n_tokens = self._write_document_chunks(conn, doc_id, doc["chunks"], progress)
                conn.execute("update documents set n_chunks = ?, n_tokens = ? where id = ?", [n_chunks, n_tokens, doc_id])
                progress.written(0)
                ids.append(doc_id)
            if progress.total is None:  # streamed: the true total, once every chunk is written
                progress.total = progress.stored
                progress.written(0)
            for stale in old.values():  # parts that vanished from the new version of the file
                dropped |= self._delete_document(stale["id"])
            orphans = self._drop_orphan_states(dropped)
            if before_commit is not None:
                before_commit()
        self._drop_orphan_files(orphans)
        return ids

    def _document_row(self, conn, values: dict, previous: dict | None, dropped: set[str],
                      progress: "_WriteProgress") -> int:
        """The document's row: the previous version's, emptied of its chunks and BM25 rows (their
        hashes added to `dropped`) and updated, or a new one. Returns its id."""
        from . import bm25_index

        if previous:
            doc_id = previous["id"]
            dropped |= self._chunk_hashes(doc_id)
            bm25_index.drop_document(conn, doc_id, on_progress=progress.checkpoint)
            self._delete_chunks(doc_id, on_progress=progress.checkpoint)
            sets = ", ".join(f"{k} = ?" for k in values)
            conn.execute(f"update documents set {sets} where id = ?", [*values.values(), doc_id])
            return doc_id
        values["created_at"] = values["updated_at"]
        cols = ", ".join(values)
        marks = ", ".join("?" for _ in values)
        return conn.execute(f"insert into documents ({cols}) values ({marks})", list(values.values())).lastrowid

    def _write_document_chunks(self, conn, doc_id: int, chunks: Iterable[dict],
                               progress: "_WriteProgress") -> tuple[int, int]:
        """Write a document's chunks `WRITE_BATCH` at a time with their BM25 rows. Returns (chunks, tokens)."""
        from . import bm25_index

        indexer = bm25_index.DocumentIndexer(conn, doc_id)
        n_chunks = n_tokens = 0
        batch: list[dict] = []
        for chunk in chunks:
            batch.append(chunk)
            if len(batch) >= WRITE_BATCH:
                n_tokens += self._write_chunks(doc_id, batch, indexer)
                n_chunks += len(batch)
                progress.written(len(batch))
                batch = []
        if batch:
            n_tokens += self._write_chunks(doc_id, batch, indexer)
            n_chunks += len(batch)
            progress.written(len(batch))
        # the BM25 postings of a long document take seconds too: checked within and after them
        indexer.finish(on_progress=progress.checkpoint)
        return n_chunks, n_tokens

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

    def held_hashes(self, hashes: Iterable[str]) -> set[str]:
        """The content hashes among `hashes` that some chunk holds (a file written for a chunk
        removed meanwhile is an orphan its writer deletes)."""
        return {h for h in hashes
                if self.db.conn.execute("select 1 from chunks where content_hash = ? limit 1", [h]).fetchone()}

    def remove_documents(self, doc_ids: Iterable[int]) -> None:
        with self.transaction():
            dropped: set[str] = set()
            for doc_id in doc_ids:
                dropped |= self._delete_document(doc_id)
            orphans = self._drop_orphan_states(dropped)
        self._drop_orphan_files(orphans)

    def scope_kinds(self, doc_ids: list[int] | None = None, collection: str | None = None) -> set[str]:
        """The kinds of document (book, pdf, dialogue) in a scope, from the documents table alone."""
        wanted = set(doc_ids or ())
        return {d["kind"] for d in self.documents(collection) if not wanted or d["id"] in wanted}

    def documents(self, collection: str | None = None) -> list[dict]:
        sql = (
            "select d.id, c.name as collection, d.title, d.kind, d.path, d.part, d.sha256, d.n_chars, "
            "d.n_chunks, d.n_tokens, d.metadata, d.created_at, d.updated_at "
            "from documents d join collections c on c.id = d.collection_id"
        )
        args: list = []
        if collection is not None:
            check_collection_name(collection)
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

    def stored_state_hashes(self, model: str, method: str, config: str, hashes: Iterable[str]) -> set[str]:
        """The hashes among `hashes` whose state for (model, method, config) is stored (no data read:
        whether a method's states are ready for a scope)."""
        wanted = list(dict.fromkeys(hashes))
        found: set[str] = set()
        for at in range(0, len(wanted), 500):  # stay under SQLite's bound-parameter limit
            part = wanted[at:at + 500]
            found.update(row[0] for row in self.db.execute(
                "select content_hash from chunk_states where model = ? and method = ? and config = ? "
                f"and content_hash in ({', '.join('?' for _ in part)})", [model, method, config, *part]))
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
        with self.transaction() as conn:
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
        with self.transaction() as conn:
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

    def documents_signature(self) -> str:
        """Changes whenever any document is added, replaced, moved or removed."""
        row = self.db.execute(
            "select group_concat(id || ':' || updated_at || ':' || n_chunks || ':' || collection_id, ',') "
            "from (select * from documents order by id)"
        ).fetchone()
        return hashlib.sha1((row[0] or "").encode()).hexdigest()

    def wait_for_writers(self, seconds: float) -> None:
        """How long a write waits for another connection's transaction before "database is locked"."""
        self.db.conn.execute(f"pragma busy_timeout = {int(seconds * 1000)}")

    def chunks(self, doc_ids: list[int] | None = None, collection: str | None = None) -> list[ChunkRecord]:
        """Chunks in scope, in document order; from the `chunk_cache` while no document changed."""
        if self.chunk_cache is None:
            return self.read_chunks(doc_ids, collection)
        scope = (tuple(sorted(set(doc_ids))) if doc_ids else None, collection, self.documents_signature())
        return self.chunk_cache.scope_chunks(scope, lambda: self.read_chunks(doc_ids, collection))

    def read_chunks(self, doc_ids: list[int] | None = None, collection: str | None = None) -> list[ChunkRecord]:
        """Chunks in scope, in document order, read from the database."""
        sql = (
            "select ch.*, d.title, d.kind, d.path from chunks ch join documents d on d.id = ch.doc_id "
            "join collections c on c.id = d.collection_id"
        )
        where, args = [], []
        if doc_ids:
            where.append(f"ch.doc_id in ({', '.join('?' for _ in doc_ids)})")
            args.extend(doc_ids)
        if collection is not None:
            check_collection_name(collection)
            where.append("c.name = ?")
            args.append(collection)
        if where:
            sql += " where " + " and ".join(where)
        sql += " order by ch.doc_id, ch.seq"
        return _chunk_records(self.db.conn.execute(sql, args))
