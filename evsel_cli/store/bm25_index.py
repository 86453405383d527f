"""BM25's index persisted in the store (migration m004), and Okapi BM25 scores read from it.

What `evsel ask --select bm25` needs from a scope of whole documents is written once, at ingest, in
the same transaction as the chunks, so an in-process ask no longer tokenizes and indexes every chunk
of its scope (seconds at 10^5 chunks):

- `bm25_terms(id, term)`: the vocabulary of the store, one integer id per token;
- `bm25_docs(doc_id, n_chunks, total_len, digest, lengths, term_ids, dfs)`: per document, the token
  count of each chunk (in seq order), the document's vocabulary in first-occurrence order with each
  term's chunk frequency inside the document, and a digest of its chunks' content hashes;
- `bm25_postings(term_id, doc_id, data)`: per (term, document), the (chunk ordinal, term frequency)
  pairs.

Any scope that is a list of whole documents (the whole store, `--doc`, `--collection`) gets its
statistics by adding up per-document rows: N and avgdl from the lengths, a query term's df from its
postings, and the average idf over the scope's whole vocabulary (rank-bm25's floor for negative
idf) from the documents' vocabularies. The scores are computed with rank-bm25's own arithmetic, in
its order (vocabulary summed in first-occurrence order, one query token after another), so they are
bit-for-bit those of `BM25Okapi` built on the scope's chunks. A chunk list that is not whole indexed
documents (a reranker's candidates, chunks held only in memory) gets None: build in memory then.

Its arithmetic (`okapi_idf`, `average_idf`, `term_scores`, `query_scores`) is the one BM25 of the
project: the corpus (evsel.corpus.query) scores with it too, and UNREAL's training recipe mines
with `term_scores` and `lucene_idf`.

This module sits beside the store (the store calls it at ingest and removal); it imports nothing
from evsel.models.
"""

from __future__ import annotations

import hashlib
import math
import re
import sys
from array import array
from operator import attrgetter
import sqlite3
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from .transaction import rollback

K1, B = 1.5, 0.75  # BM25Okapi's defaults, as the local selector uses them (the corpus scores with them)
EPSILON = 0.25  # BM25Okapi's default: negative idf becomes EPSILON * the scope's average idf
EMPTY_TOKEN = "<empty>"  # a chunk without words is indexed as this one token (rank-bm25 needs one)
_BATCH = 500  # bound parameters per IN (...) list, under SQLite's limit
_I4 = np.dtype("<i4")

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being
    below between both but by can could did do does doing down during each few for from further had
    has have having he her here hers herself him himself his how i if in into is it its itself just
    me more most my myself no nor not now of off on once only or other our ours ourselves out over own
    same she should so some such than that the their theirs them themselves then there these they this
    those through to too under until up very was we were what when where which while who whom why will
    with would you your yours yourself yourselves s t don""".split()
)


def stem(word: str) -> str:
    """A light suffix stripper: enough to match 'killed'/'kill', 'letters'/'letter'."""
    if word.endswith("'s"):
        word = word[:-2]
    for suffix in ("ingly", "edly", "ing", "ies", "ied", "ed", "es", "s", "ly"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            root = word[: -len(suffix)]
            if suffix in ("ies", "ied"):
                root += "y"
            return root
    return word


def words(text: str) -> list[str]:
    """The words BM25 reads, before stemming (stop words left out)."""
    return [w for w in _WORD.findall(text.lower()) if w not in STOPWORDS]


def tokenize(text: str) -> list[str]:
    return [stem(w) for w in words(text)]


def chunk_tokens(text: str) -> list[str]:
    """The tokens BM25 indexes for one chunk (as the in-memory BM25Okapi build gets them)."""
    return tokenize(text) or [EMPTY_TOKEN]


def digest(content_hashes: Iterable[str]) -> str:
    """Identifies a document's chunk list: its chunks' content hashes, in order."""
    return hashlib.sha1("\n".join(content_hashes).encode()).hexdigest()


# the scoring arithmetic: the store's index, the corpus (evsel.corpus) and the training recipes -----

def okapi_idf(n: int, df: int) -> float:
    """rank-bm25's BM25Okapi idf over N chunks: ln(N - df + 0.5) - ln(df + 0.5), negative for a
    term in more than half of them (callers floor it at EPSILON x `average_idf`)."""
    return math.log(n - df + 0.5) - math.log(df + 0.5)


def lucene_idf(n: int, df: int) -> float:
    """Lucene's idf, ln(1 + (N - df + 0.5) / (df + 0.5)): never negative, so it needs no floor.
    UNREAL's training recipe mines its hard negatives with it (its shipped data was mined so)."""
    return math.log((n - df + 0.5) / (df + 0.5) + 1.0)


def average_idf(n: int, dfs) -> float:
    """rank-bm25's average idf over a vocabulary (`dfs`: each term's df, in the order its terms
    are met): `okapi_idf` of each term summed one after another, as rank-bm25's `idf_sum += idf`
    (np.sum adds pairwise: other roundings), over the vocabulary size; 0.0 for none."""
    dfs = np.asarray(dfs, dtype=np.int64)
    if not len(dfs):
        return 0.0
    values, where = np.unique(dfs, return_inverse=True)
    idf = np.array([okapi_idf(n, f) for f in values.tolist()], dtype=np.float64)
    return float(np.add.accumulate(idf[where.ravel()])[-1]) / len(dfs)


def term_scores(tf, doc_len, avgdl: float, idf: float, k1: float, b: float, weight_first: bool = False):
    """One query term's BM25 score in each chunk, from its frequency `tf` and the chunk lengths
    `doc_len` (arrays alike), in rank-bm25's order of operations:
    idf * (tf (k1 + 1) / (tf + k1 (1 - b + b doc_len / avgdl))). `weight_first`: the same value as
    (idf tf (k1 + 1)) / (...), the order UNREAL's recipe mined its training data with (in float32
    the two round differently, and near-ties then rank otherwise)."""
    norm = k1 * (1 - b + b * doc_len / avgdl)
    if weight_first:
        return idf * tf * (k1 + 1) / (tf + norm)
    return idf * (tf * (k1 + 1) / (tf + norm))


def query_scores(query: Sequence[str], frequencies: Mapping[str, np.ndarray], idf: Mapping[str, float],
                 doc_len: np.ndarray, avgdl: float, k1: float, b: float) -> np.ndarray:
    """BM25 of every chunk for the query tokens `query`, added one token after another as
    rank-bm25's get_scores (a repeated token counts again): `frequencies` holds each query term's
    frequency in every chunk, `idf` its idf; a term absent from `frequencies` adds 0."""
    score = np.zeros(len(doc_len))
    for q in query:
        tf = frequencies.get(q)
        if tf is not None:
            score += term_scores(tf, doc_len, avgdl, idf[q], k1, b)
    return score


# schema and writes (inside the store's transactions) ------------------------------------------------

SCHEMA = [
    "create table bm25_terms (id integer primary key, term text not null unique)",
    "create table bm25_docs (doc_id integer primary key references documents(id), n_chunks integer not null,"
    " total_len integer not null, digest text not null, lengths blob not null, term_ids blob not null,"
    " dfs blob not null)",
    "create table bm25_postings (term_id integer not null, doc_id integer not null, data blob not null,"
    " primary key (term_id, doc_id)) without rowid",
]


def _term_ids(conn: sqlite3.Connection, terms: Sequence[str]) -> list[int]:
    conn.executemany("insert or ignore into bm25_terms (term) values (?)", [(t,) for t in terms])
    ids: dict[str, int] = {}
    for at in range(0, len(terms), _BATCH):
        part = terms[at:at + _BATCH]
        ids.update((term, i) for i, term in conn.execute(
            f"select id, term from bm25_terms where term in ({', '.join('?' for _ in part)})", part))
    return [ids[t] for t in terms]


class DocumentIndexer:
    """Writes the BM25 rows of one document from its chunks, given a batch at a time in seq order,
    in bounded memory: each batch's postings go to a temporary staging table, merged per term into
    `bm25_postings` by `finish`. What stays in memory is the document's vocabulary (term ids, chunk
    frequencies), its chunk lengths and a running digest. The caller holds the write transaction and
    has dropped the document's previous rows."""

    def __init__(self, conn: sqlite3.Connection, doc_id: int):
        self.conn = conn
        self.doc_id = doc_id
        self.position: dict[str, int] = {}  # term -> index in first-occurrence order
        self.term_ids = array("i")
        self.dfs = array("i")
        self.lengths = array("i")
        self.digest = hashlib.sha1()
        self.batches = 0
        conn.execute("drop table if exists temp.bm25_staging")
        conn.execute("create temp table bm25_staging (term_id integer not null, batch integer not null,"
                     " data blob not null, primary key (term_id, batch)) without rowid")

    def add(self, chunks: Iterable[tuple[str, str]]) -> None:
        """Index the next chunks, (text, content_hash) in seq order."""
        postings: dict[str, array] = {}  # term -> [ordinal, tf, ...] of this batch
        for text, content_hash in chunks:
            ordinal = len(self.lengths)
            self.digest.update(f"\n{content_hash}".encode() if ordinal else content_hash.encode())
            tokens = chunk_tokens(text)
            self.lengths.append(len(tokens))
            frequencies: dict[str, int] = {}
            for token in tokens:
                frequencies[token] = frequencies.get(token, 0) + 1
            for term, tf in frequencies.items():
                pairs = postings.get(term)
                if pairs is None:
                    pairs = postings[term] = array("i")
                pairs.append(ordinal)
                pairs.append(tf)
        new = [t for t in postings if t not in self.position]
        for term, term_id in zip(new, _term_ids(self.conn, new)):
            self.position[term] = len(self.term_ids)
            self.term_ids.append(term_id)
            self.dfs.append(0)
        rows = []
        for term, pairs in postings.items():
            at = self.position[term]
            self.dfs[at] += len(pairs) // 2
            rows.append((self.term_ids[at], self.batches, _little_endian(pairs)))
        self.conn.executemany("insert into temp.bm25_staging values (?, ?, ?)", rows)
        self.batches += 1

    def finish(self, on_progress: Callable[[], None] | None = None) -> None:
        """Write the document's row and its postings, each term's batches joined in order;
        `on_progress` is called between writes of `MERGE_BATCH` terms (not after the last)."""
        self.conn.execute(
            "insert into bm25_docs (doc_id, n_chunks, total_len, digest, lengths, term_ids, dfs) "
            "values (?, ?, ?, ?, ?, ?, ?)",
            [self.doc_id, len(self.lengths), sum(self.lengths), self.digest.hexdigest(),
             _little_endian(self.lengths), _little_endian(self.term_ids), _little_endian(self.dfs)])
        staged = self.conn.execute("select term_id, data from temp.bm25_staging order by term_id, batch")
        term_id, parts, rows = None, [], []

        def flush(last: bool = False) -> None:
            self.conn.executemany("insert into bm25_postings (term_id, doc_id, data) values (?, ?, ?)", rows)
            rows.clear()
            if on_progress is not None and not last:
                on_progress()

        while True:
            fetched = staged.fetchmany(MERGE_BATCH)
            for next_id, data in fetched:
                if next_id != term_id and parts:
                    rows.append((term_id, self.doc_id, b"".join(parts)))
                    parts = []
                term_id = next_id
                parts.append(data)
            if not fetched:
                break
            if len(rows) >= MERGE_BATCH:
                flush()
        if parts:
            rows.append((term_id, self.doc_id, b"".join(parts)))
        flush(last=True)
        staged.close()
        self.conn.execute("drop table temp.bm25_staging")  # not a delete: no row-by-row work


MERGE_BATCH = 5000  # staged postings rows read, and postings rows written, between two progress calls


def _little_endian(values: array) -> bytes:
    """int32 values as the stored blobs hold them (little-endian, as numpy's '<i4')."""
    if sys.byteorder != "little":
        values = array("i", values)
        values.byteswap()
    return values.tobytes()


def index_document(conn: sqlite3.Connection, doc_id: int, chunks: Sequence[tuple[int, str, str]],
                   on_progress: Callable[[], None] | None = None) -> None:
    """Write the BM25 rows of one document from its chunks' (seq, text, content_hash); the caller
    holds the write transaction and has dropped the document's previous rows. `on_progress` is
    called every 10,000 chunks and while the postings are written: a cancel it raises stops a long
    document."""
    chunks = sorted(chunks, key=lambda c: c[0])
    indexer = DocumentIndexer(conn, doc_id)
    for at in range(0, len(chunks), 10_000):
        if on_progress is not None and at:
            on_progress()
        indexer.add((text, content_hash) for _seq, text, content_hash in chunks[at:at + 10_000])
    indexer.finish(on_progress)


def drop_document(conn: sqlite3.Connection, doc_id: int, on_progress: Callable[[], None] | None = None) -> None:
    """Delete one document's BM25 rows (its postings by their keys: no scan of the table), calling
    `on_progress` between batches of `MERGE_BATCH` terms."""
    row = conn.execute("select term_ids from bm25_docs where doc_id = ?", [doc_id]).fetchone()
    if row is None:
        return
    term_ids = np.frombuffer(row[0], _I4)
    for at in range(0, len(term_ids), MERGE_BATCH):
        if on_progress is not None and at:
            on_progress()
        conn.executemany("delete from bm25_postings where term_id = ? and doc_id = ?",
                         [(int(i), doc_id) for i in term_ids[at:at + MERGE_BATCH]])
    conn.execute("delete from bm25_docs where doc_id = ?", [doc_id])


def backfill(conn: sqlite3.Connection) -> int:
    """Index every document without BM25 rows (a store from before m004). Returns how many."""
    missing = [r[0] for r in conn.execute(
        "select id from documents where id not in (select doc_id from bm25_docs) order by id").fetchall()]
    for doc_id in missing:
        index_document(conn, doc_id, conn.execute(
            "select seq, text, content_hash from chunks where doc_id = ? order by seq", [doc_id]).fetchall())
    return len(missing)


TABLES = ("bm25_terms", "bm25_docs", "bm25_postings")


def repair(conn: sqlite3.Connection) -> bool:
    """Rebuild the index from the chunks when one of its tables is gone (dropped by hand, a damaged
    file): it holds nothing the chunks do not, so nothing is lost. True when it was rebuilt."""
    if conn.execute("select 1 from _evsel_migrations where name = 'm004_bm25_index'").fetchone() is None:
        return False  # a store its migration has not reached yet (the migration creates the index)

    def whole() -> bool:
        names = {r[0] for r in conn.execute("select name from sqlite_master where type = 'table' and name in "
                                            f"({', '.join('?' for _ in TABLES)})", TABLES)}
        return len(names) == len(TABLES)

    if whole():
        return False
    conn.execute("begin immediate")
    try:
        if whole():  # another process rebuilt it while we waited for the write lock
            conn.execute("commit")
            return False
        for table in TABLES:
            conn.execute(f"drop table if exists {table}")
        for sql in SCHEMA:
            conn.execute(sql)
        backfill(conn)
        conn.execute("commit")
    except BaseException:
        rollback(conn)
        raise
    return True


# reads: scores over a scope of whole documents ------------------------------------------------------

@dataclass
class _Doc:
    doc_id: int
    offset: int  # position of its first chunk in the scope's chunk list
    n_chunks: int
    total_len: int
    digest: str
    lengths: bytes
    term_ids: bytes
    dfs: bytes


def _runs(doc_ids: list[int]) -> list[tuple[int, int, int]] | None:
    """(doc_id, start, end) of each run of equal doc ids; None when a document's chunks are not contiguous."""
    n = len(doc_ids)
    arr = np.fromiter(doc_ids, dtype=np.int64, count=n)
    starts = np.concatenate(([0], np.flatnonzero(arr[1:] != arr[:-1]) + 1))
    ends = np.concatenate((starts[1:], [n]))
    docs = arr[starts]
    if len(np.unique(docs)) != len(docs):
        return None
    return [(int(d), int(s), int(e)) for d, s, e in zip(docs, starts, ends)]


def _in_batches(conn: sqlite3.Connection, sql: str, head: list, values: list) -> list[tuple]:
    """Rows of `sql` (with one `{marks}` IN list) over `values` in batches under the parameter limit."""
    out: list[tuple] = []
    for at in range(0, len(values), _BATCH):
        part = values[at:at + _BATCH]
        out += conn.execute(sql.format(marks=", ".join("?" for _ in part)), [*head, *part]).fetchall()
    return out


def _scope_docs(conn: sqlite3.Connection, chunks: Sequence) -> list[_Doc] | None:
    """The scope as whole indexed documents, each checked against the chunks it was given; else None."""
    runs = _runs(list(map(attrgetter("doc_id"), chunks)))
    if runs is None:
        return None
    hashes = list(map(attrgetter("content_hash"), chunks))
    rows = {r[0]: r for r in _in_batches(
        conn, "select doc_id, n_chunks, total_len, digest, lengths, term_ids, dfs from bm25_docs "
              "where doc_id in ({marks})", [], [d for d, _, _ in runs])}
    docs = []
    for doc_id, start, end in runs:
        row = rows.get(doc_id)
        if row is None or row[1] != end - start:
            return None
        if digest(hashes[start:end]) != row[3]:
            return None  # not this document's stored chunks (another version, or chunks made elsewhere)
        docs.append(_Doc(doc_id, start, *row[1:]))
    return docs


class Scope:
    """A scope of whole indexed documents: N, the chunk lengths and avgdl, read once; the average idf
    when a query first needs it. Small, so the daemon's memo keeps it between requests; postings are
    read from the store at every query."""

    def __init__(self, docs: list[_Doc]):
        self.docs = docs
        self.doc_len = np.concatenate([np.frombuffer(d.lengths, _I4) for d in docs]).astype(np.int64)
        self.n = len(self.doc_len)
        self.avgdl = sum(d.total_len for d in docs) / self.n  # as rank-bm25: an int sum over N
        self.offsets = {d.doc_id: d.offset for d in docs}
        self._average_idf: float | None = None

    def average_idf(self) -> float:
        """rank-bm25's average idf over the scope's vocabulary: idf = ln(N - df + 0.5) - ln(df + 0.5)
        per term, summed in the order the terms first occur in the scope, over the vocabulary size."""
        if self._average_idf is None:
            ids = np.concatenate([np.frombuffer(d.term_ids, _I4) for d in self.docs])
            dfs = np.concatenate([np.frombuffer(d.dfs, _I4) for d in self.docs]).astype(np.int64)
            # each document's vocabulary is stored in first-occurrence order and the documents come in
            # scope order, so a term's first index in the concatenation orders the vocabulary as
            # rank-bm25 inserts it into its dict (dense arrays over term ids: linear, no sort of all rows)
            first = np.full(int(ids.max()) + 1, len(ids), dtype=np.int64)
            np.minimum.at(first, ids, np.arange(len(ids), dtype=np.int64))
            total = np.bincount(ids, weights=dfs, minlength=len(first)).astype(np.int64)  # exact below 2^53
            present = np.flatnonzero(first < len(ids))
            self._average_idf = average_idf(self.n, total[present[np.argsort(first[present], kind="stable")]])
        return self._average_idf

    def _frequencies(self, conn: sqlite3.Connection, terms: list[str]) -> dict[str, np.ndarray]:
        """Per query term present in the scope: its frequency in every chunk (int64, scope order)."""
        ids = dict(_in_batches(conn, "select term, id from bm25_terms where term in ({marks})", [], terms))
        docs = list(self.offsets)
        out = {}
        for term in terms:
            if term not in ids:
                continue
            if len(docs) <= _BATCH:
                rows = conn.execute(f"select doc_id, data from bm25_postings where term_id = ? and doc_id in "
                                    f"({', '.join('?' for _ in docs)})", [ids[term], *docs]).fetchall()
            else:
                rows = [r for r in conn.execute("select doc_id, data from bm25_postings where term_id = ?",
                                                [ids[term]]) if r[0] in self.offsets]
            if rows:  # every document's (ordinal, tf) pairs at once, shifted to the document's offset
                pairs = np.frombuffer(b"".join([data for _, data in rows]), _I4).reshape(-1, 2)
                shift = np.repeat(np.array([self.offsets[doc_id] for doc_id, _ in rows], dtype=np.int64),
                                  [len(data) // 8 for _, data in rows])
                q_freq = np.zeros(self.n, dtype=np.int64)
                q_freq[shift + pairs[:, 0]] = pairs[:, 1]
                out[term] = q_freq
        return out

    def scores(self, conn: sqlite3.Connection, query: list[str], k1: float, b: float,
               epsilon: float = EPSILON) -> np.ndarray | None:
        """BM25Okapi(scope's chunk tokens, k1, b, epsilon).get_scores(query); None when one of the
        documents changed in the store meanwhile (score the chunks in hand another way then)."""
        freqs = self._frequencies(conn, list(dict.fromkeys(query)))
        idf: dict[str, float] = {}
        for term, q_freq in freqs.items():
            idf[term] = okapi_idf(self.n, int(np.count_nonzero(q_freq)))
            if idf[term] < 0:  # in more than half of the chunks: rank-bm25's floor
                idf[term] = epsilon * self.average_idf()
        score = query_scores(query, freqs, idf, self.doc_len, self.avgdl, k1, b)
        now = dict(_in_batches(conn, "select doc_id, digest from bm25_docs where doc_id in ({marks})", [],
                               list(self.offsets)))
        if any(now.get(d.doc_id) != d.digest for d in self.docs):
            return None
        return score


def open_scope(conn: sqlite3.Connection, chunks: Sequence) -> Scope | None:
    """The persisted index of `chunks`; None unless they are whole indexed documents of this store,
    each in order (a reranker's candidates, chunks that exist only in memory)."""
    if not chunks:
        return None
    docs = _scope_docs(conn, chunks)
    return None if docs is None else Scope(docs)


def scores(conn: sqlite3.Connection, chunks: Sequence, query: list[str], k1: float, b: float,
           epsilon: float = EPSILON) -> np.ndarray | None:
    """BM25Okapi(chunk tokens of `chunks`, k1, b, epsilon).get_scores(query), from the persisted
    index; None when `chunks` are not whole indexed documents of this store."""
    scope = open_scope(conn, chunks)
    return None if scope is None else scope.scores(conn, query, k1, b, epsilon)
