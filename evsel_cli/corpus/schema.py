"""The on-disk layout of a corpus directory, shared by `evsel corpus build` and `ask --corpus`.

DIR/manifest.json (written atomically; `read_manifest`/`write_manifest`)
    format "evsel-corpus", version 1, and what the rows were made with: `backbone` (the backbone's
    weights fingerprint: the chunker's tokenizer and the UNREAL states), `chunk_tokens`, `methods`
    (those with data in the table: "bm25" always, "dense", "unreal"), `dims` ({"dense": 384,
    "unreal": [pool, hidden]}), `configs` (each method's state key as the local state cache names
    it: model fingerprint + config string, so a local state and a corpus state compare 1:1),
    `created`, `source`, `n_chunks`, `n_docs`, `bm25` ({"n_chunks", "total_len"}) and `indexes`
    (what `build_indexes` made: {"fts": "text", "terms": "bm25_terms", "dense": "IVF_PQ" | "none"}),
    and `complete`:
    false while a build runs or after one was interrupted (the table then holds whole documents,
    but not all of them, and the statistics and indexes may be stale), true once it finished.

DIR/chunks.lance (`CHUNKS`), one row per chunk, columns `COLUMNS` (see `arrow_schema`):
    chunk_id      f"{doc_sha256}:{seq}", or f"{doc_sha256}:{doc_part}:{seq}" for one of several
                  documents of a file (a LoCoMo JSON file holds ten); unique: the build's resume
                  key and the append/delete key. A file whose bytes equal an earlier file's (in
                  path order) is one document: its chunks are stored once, under the first path.
    doc_sha256    sha256 of the file's bytes, as the local store's documents.sha256; for a
                  document of a JSONL source, sha256 of the line's "text" (UTF-8)
    doc_path      the file's path relative to SOURCE (POSIX separators), or the JSONL document's id
    doc_part      the document's key inside its file ("" for a file of one document)
    doc_title, doc_kind (book | pdf | dialogue)
    seq           int32, the chunk's place in its document (0-based, as the local store's seq)
    text          the chunk's text; a document's chunks concatenate to its parsed text
    content_hash  sha256 of `text` (UTF-8): exactly what local ingest stores for that chunk
    n_tokens      int32, backbone tokens (the chunker's count)
    char_start, char_end   int64 offsets of the chunk in its document's parsed text
    page_start, page_end   int32, nullable (PDF pages, 1-based)
    speakers      list<string>; session string nullable; turn_ids list<string>;
    time_start, time_end   string nullable: the dialogue provenance the local store keeps
    bm25_terms    list<string>: `evsel.bm25_index.chunk_tokens(text)`, with repeats, in order: the
                  tokens the local BM25 index counts (a chunk without words is ["<empty>"]), so
                  tf = count in the list and the chunk's BM25 length = len(bm25_terms)
    dense         fixed_size_list<float32>[384], nullable: the local `dense` state (MiniLM,
                  unit-normalised, stored float16 locally), widened to float32 exactly, so the
                  dot product with a query embedding is the local cosine score
    unreal        list<fixed_size_list<float16>[hidden]> (pool rows of hidden), nullable: the
                  UNREAL chunk states at the adapter's (layer, pool), as the local state cache
                  keeps them (before standardization; the query side applies the adapter's
                  chunk_keys). A multivector column in LanceDB's layout; null without an adapter.

DIR/bm25_stats.lance (`BM25_STATS`): the corpus' document frequencies, one row per term:
    term string, df int64 (chunks holding the term at least once). N and the total length
    (sum of len(bm25_terms)) are in the manifest's "bm25"; avgdl = total_len / N. Okapi BM25 as
    `rank_bm25.BM25Okapi` computes it (k1 1.5, b 0.75, negative idf floored at 0.25 x the average
    idf over this whole vocabulary) then gives the local scores of a whole-store scope.

Indexes on chunks.lance: an inverted (full-text) index on `text` (Lance's own tokenizer: its
ranking is a first stage, not the local BM25 score), one on `bm25_terms` with `TERMS_INDEX` (the
local terms as they are: a query's local terms find exactly the chunks that hold them; rescore
candidates from `bm25_terms` and bm25_stats for the local scores), and on `dense` an IVF index
(IVF_PQ, metric "dot") once the table has at least `IVF_MIN_ROWS` rows; below that no vector
index: a flat (exact) scan is fast enough. The `unreal` column is never ANN-indexed here
(LanceDB's multivector index is cosine-only and approximate); exact MaxSim over it, or over the
dense/BM25 candidates, is the query side's choice.

pyarrow is imported inside `arrow_schema`: this module loads without the `scale` extra.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

FORMAT = "evsel-corpus"
VERSION = 1
MANIFEST = "manifest.json"
CHUNKS = "chunks.lance"
BM25_STATS = "bm25_stats.lance"
DENSE_DIM = 384  # all-MiniLM-L6-v2 (models/selectors/dense.py)
UNREAL_HIDDEN = 576  # SmolLM2-135M; the manifest's dims["unreal"] says what a corpus holds
IVF_MIN_ROWS = 10_000  # below this a flat scan of `dense` is exact and quick; no ANN index
# the inverted index on `bm25_terms`: the local BM25 terms as they are, split on spaces, nothing
# stemmed, dropped, folded or cut (create_scalar_index("bm25_terms", "INVERTED", **TERMS_INDEX))
TERMS_INDEX = dict(base_tokenizer="whitespace", lower_case=False, stem=False, remove_stop_words=False,
                   ascii_folding=False, with_position=False, max_token_length=None)

COLUMNS = (
    "chunk_id", "doc_sha256", "doc_path", "doc_part", "doc_title", "doc_kind", "seq", "text", "content_hash",
    "n_tokens", "char_start", "char_end", "page_start", "page_end", "speakers", "session", "turn_ids",
    "time_start", "time_end", "bm25_terms", "dense", "unreal",
)


def chunk_id(doc_sha256: str, seq: int, part: str = "") -> str:
    return f"{doc_sha256}:{part}:{seq}" if part else f"{doc_sha256}:{seq}"


def arrow_schema(dense_dim: int = DENSE_DIM, unreal_hidden: int = UNREAL_HIDDEN):
    """The pyarrow schema of chunks.lance. `unreal_hidden`: the backbone's hidden size (the
    `unreal` column is always there, typed by it, and null when no states are stored)."""
    import pyarrow as pa

    hidden = unreal_hidden
    strings = pa.list_(pa.string())
    return pa.schema([
        pa.field("chunk_id", pa.string(), nullable=False),
        pa.field("doc_sha256", pa.string(), nullable=False),
        pa.field("doc_path", pa.string(), nullable=False),
        pa.field("doc_part", pa.string(), nullable=False),
        pa.field("doc_title", pa.string()),
        pa.field("doc_kind", pa.string()),
        pa.field("seq", pa.int32(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("content_hash", pa.string(), nullable=False),
        pa.field("n_tokens", pa.int32()),
        pa.field("char_start", pa.int64()),
        pa.field("char_end", pa.int64()),
        pa.field("page_start", pa.int32()),
        pa.field("page_end", pa.int32()),
        pa.field("speakers", strings),
        pa.field("session", pa.string()),
        pa.field("turn_ids", strings),
        pa.field("time_start", pa.string()),
        pa.field("time_end", pa.string()),
        pa.field("bm25_terms", strings),
        pa.field("dense", pa.list_(pa.float32(), dense_dim)),
        pa.field("unreal", pa.list_(pa.list_(pa.float16(), hidden))),
    ])


def bm25_stats_schema():
    import pyarrow as pa

    return pa.schema([pa.field("term", pa.string(), nullable=False), pa.field("df", pa.int64(), nullable=False)])


def new_manifest(*, backbone: str, chunk_tokens: int, source: str, methods: list[str], dims: dict,
                 configs: dict) -> dict:
    return {
        "format": FORMAT, "version": VERSION, "backbone": backbone, "chunk_tokens": chunk_tokens,
        "methods": methods, "dims": dims, "configs": configs,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "source": source,
        "n_chunks": 0, "n_docs": 0, "bm25": {"n_chunks": 0, "total_len": 0}, "indexes": {}, "complete": False,
    }


def write_manifest(directory: str | Path, manifest: dict) -> None:
    """Write DIR/manifest.json atomically (a temp file in DIR, fsynced, renamed over)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".manifest.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(manifest, handle, indent=1, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, directory / MANIFEST)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_manifest(directory: str | Path) -> dict:
    """The manifest of a corpus directory; ValueError saying what is wrong when it is not one."""
    path = Path(directory) / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{directory} is not an evsel corpus (no {MANIFEST})") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path} is not an evsel corpus manifest")
    if manifest.get("version") != VERSION:
        raise ValueError(f"{path} has corpus format version {manifest.get('version')}; this evsel reads {VERSION}")
    return manifest
