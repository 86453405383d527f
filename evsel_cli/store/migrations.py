"""The store's schema, grown by numbered migrations (sqlite-utils), each applied once in its own
transaction and recorded in `_evsel_migrations`. `evsel.store.store.connect` runs `migrate` on every open."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

from ..errors import StoreError
from .transaction import rollback

if TYPE_CHECKING:
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
    # BM25's per-document postings and vocabulary (evsel/store/bm25_index.py), written by replace_file in
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
    # Block and session summaries for QRRanker's memory prefix (models/qrranker/memory.py), keyed by the
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
                rollback(db.conn)
                raise
        finally:
            if fk_off and fk_was:
                db.conn.execute("pragma foreign_keys = on")
        applied.append(name)
    return applied
