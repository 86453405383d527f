"""A corpus' rows, made exactly as `evsel ingest` makes a local store's chunks.

`rows_of_file` reads, hashes, parses and chunks one file with the parsers and chunker of
`Ingest.ingest_file` (evsel/ingest/run.py: the same `read_file`, `parse_file`, `chunker.iter_chunks` and
`Chunk.record`), so every row's content_hash is the one a local ingest of that file stores.
`rows_of_jsonl_document` does the same for one document of a JSONL source: its text is parsed as a
file `ID.txt` holding it would be. `StateEncoder` adds the per-chunk states with the code the local
methods use (MiniLM's `encode` for dense, `ChunkEncoder` at the adapter's layer and pool for UNREAL).
`write_local` writes rows into a corpus directory without Ray (tests, appends).

Rows are plain dicts keyed by `schema.COLUMNS`; `dense`/`unreal` are numpy arrays or None.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path, PurePath
from typing import Iterable, Iterator

from evsel.ingest import chunker
from evsel.store.bm25_index import chunk_tokens
from evsel.errors import InputError
from evsel.ingest.parsers import collect_files, parse_file, read_file

from . import schema

# a JSONL document's text is parsed as the text of a file with this suffix
JSONL_DOC_SUFFIX = ".txt"


def _rows_of_parsed(parsed, sha: str, doc_path: str, counter, chunk_tokens_: int, where: str) -> list[dict]:
    rows: list[dict] = []
    for doc in parsed:
        any_text = False
        for chunk in chunker.iter_chunks(doc, counter, chunk_tokens_):
            record = chunk.record()
            any_text = any_text or bool(chunk.text.strip())
            rows.append({
                "chunk_id": schema.chunk_id(sha, record["seq"], doc.part),
                "doc_sha256": sha, "doc_path": doc_path, "doc_part": doc.part, "doc_title": doc.title,
                "doc_kind": doc.kind, **record, "bm25_terms": chunk_tokens(record["text"]),
                "dense": None, "unreal": None,
            })
        if not any_text:  # as ingest: a document without text is refused, not stored empty
            raise InputError("no text to index", "check the file's contents", path=where)
    return rows


def rows_of_file(path: str | Path, root: str | Path | None, counter, chunk_tokens_: int = chunker.DEFAULT_CHUNK_TOKENS,
                 kind: str = "auto", warnings: list[str] | None = None) -> list[dict]:
    """The rows of one file (states not computed). `root`: the SOURCE folder, for `doc_path`;
    `counter`: the backbone (its tokenizer counts the chunker's tokens). Raises what ingest
    reports for a bad file (InputError, OSError)."""
    path = Path(path)
    data = read_file(path, kind)
    sha = hashlib.sha256(data).hexdigest()
    parsed = parse_file(path, kind, warnings, data=data)
    del data
    doc_path = PurePath(path.relative_to(root)).as_posix() if root is not None else path.name
    return _rows_of_parsed(parsed, sha, doc_path, counter, chunk_tokens_, str(path))


def jsonl_document(line: str, number: int, source: str) -> dict:
    """One line of a JSONL source: {"id": str, "text": str, "title"?: str, "kind"?: auto|book|dialogue}.
    InputError naming the line when it is not one."""
    where = f"{source}:{number}"
    try:
        doc = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InputError(f"line {number} is not JSON ({exc.msg})", "one JSON object a line", path=where) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("text"), str):
        raise InputError(f"line {number} has no \"text\" string", 'give {"id": ..., "text": ...} a line', path=where)
    doc_id = doc.get("id", str(number))
    if not isinstance(doc_id, (str, int)) or not str(doc_id).strip():
        raise InputError(f"line {number} has an empty or non-string \"id\"", "give each document an id", path=where)
    kind = doc.get("kind", "auto")
    if kind not in ("auto", "book", "dialogue"):
        raise InputError(f"line {number} has kind {kind!r}", "use auto, book or dialogue", path=where)
    title = doc.get("title")
    return {"id": str(doc_id), "text": doc["text"], "title": title if isinstance(title, str) else None, "kind": kind}


def iter_jsonl_documents(path: str | Path) -> Iterator[dict]:
    """The documents of a JSONL source in order (blank lines skipped); ids must be unique."""
    seen: set[str] = set()
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            doc = jsonl_document(line, number, str(path))
            if doc["id"] in seen:
                raise InputError(f"line {number} repeats the id {doc['id']!r}", "give each document its own id",
                                 path=f"{path}:{number}")
            seen.add(doc["id"])
            yield doc


def rows_of_jsonl_document(doc: dict, counter, chunk_tokens_: int = chunker.DEFAULT_CHUNK_TOKENS,
                           warnings: list[str] | None = None) -> list[dict]:
    """The rows of one JSONL document (`jsonl_document`'s dict): parsed as the file `ID.txt`
    holding its text would be, hashed as that file's bytes."""
    data = doc["text"].encode("utf-8")
    sha = hashlib.sha256(data).hexdigest()
    name = Path(PurePath(doc["id"]).name + JSONL_DOC_SUFFIX)
    parsed = parse_file(name, doc["kind"], warnings, data=data)
    if doc.get("title"):
        for p in parsed:
            p.title = doc["title"]
    return _rows_of_parsed(parsed, sha, doc["id"], counter, chunk_tokens_, doc["id"])


def source_items(source: str | Path) -> tuple[str, list]:
    """("files", [Path]) for a folder (or one file that is not .jsonl), ("jsonl", [doc dict]) for a
    JSONL of documents. InputError for what is neither."""
    source = Path(source).expanduser()
    if source.is_file() and source.suffix.lower() == ".jsonl":
        docs = list(iter_jsonl_documents(source))
        if not docs:
            raise InputError("the JSONL has no documents", 'give {"id": ..., "text": ...} a line', path=str(source))
        return "jsonl", docs
    return "files", collect_files(source)


# ---------------------------------------------------------------------------------------------
# states


class StateEncoder:
    """Computes the states a row carries, with the models the local methods use: `dense` (MiniLM,
    as `evsel.models.selectors.dense` stores it: float16, read back as float32) and `unreal` (the
    backbone's pooled states at the adapter's layer and pool, float16, as `unreal.chunk_states`
    caches them). Either is skipped when off (or, for UNREAL, without an adapter)."""

    def __init__(self, backbone, dense: bool = True, unreal: bool = True, adapter: str | None = None):
        self.backbone = backbone
        self.minilm = None
        self.unreal_config = None
        self._chunk_encoder = None
        if dense:
            from evsel.models.selectors.dense import MiniLM

            self.minilm = MiniLM()
        if unreal:
            from evsel.models.unreal import selection as unreal_model

            self.unreal_config = unreal_model.adapter_config(backbone, adapter)
            if self.unreal_config is not None:
                self._chunk_encoder = unreal_model.ChunkEncoder(backbone, [self.unreal_config.layer],
                                                                self.unreal_config.pool)

    def methods(self) -> list[str]:
        return ["bm25"] + (["dense"] if self.minilm else []) + (["unreal"] if self._chunk_encoder else [])

    def configs(self) -> dict:
        """Each state's key as the local state cache has it: {method: {"model", "config"}}."""
        out = {}
        if self.minilm is not None:
            from evsel.models.selectors import dense

            out["dense"] = {"model": self.minilm.fingerprint, "config": dense.CONFIG}
        if self._chunk_encoder is not None:
            from evsel.models.unreal import selection as unreal_model

            out["unreal"] = {"model": self.backbone.fingerprint,
                             "config": unreal_model.state_key(self.unreal_config.layer, self.unreal_config.pool)}
        return out

    def dims(self) -> dict:
        out = {}
        if self.minilm is not None:
            out["dense"] = int(self.minilm.model.config.hidden_size)
        if self._chunk_encoder is not None:
            out["unreal"] = [self.unreal_config.pool, int(self.backbone.config.hidden_size)]
        return out

    def encode(self, texts: list[str]) -> dict:
        """{"dense": (N, 384) float32 | None, "unreal": (N, pool, d) float16 | None}."""
        import numpy as np

        out = {"dense": None, "unreal": None}
        if self.minilm is not None:
            out["dense"] = self.minilm.encode(texts).astype(np.float16).astype(np.float32)
        if self._chunk_encoder is not None:
            out["unreal"] = self._chunk_encoder.encode(texts)[self.unreal_config.layer]
        return out

    def add_states(self, rows: list[dict]) -> list[dict]:
        states = self.encode([r["text"] for r in rows])
        for i, row in enumerate(rows):
            row["dense"] = None if states["dense"] is None else states["dense"][i]
            row["unreal"] = None if states["unreal"] is None else states["unreal"][i]
        return rows


# ---------------------------------------------------------------------------------------------
# Arrow and the Ray-free writer


def rows_to_table(rows: list[dict], dense_dim: int = schema.DENSE_DIM, unreal_hidden: int = schema.UNREAL_HIDDEN):
    """A pyarrow Table of `rows` in chunks.lance's schema."""
    import numpy as np
    import pyarrow as pa

    target = schema.arrow_schema(dense_dim, unreal_hidden)
    columns = {}
    for field in target:
        name = field.name
        if name == "dense":
            columns[name] = _fixed_vectors([r["dense"] for r in rows], field.type, np.float32)
        elif name == "unreal":
            columns[name] = _multivectors([r["unreal"] for r in rows], field.type)
        else:
            columns[name] = pa.array([r[name] for r in rows], type=field.type)
    return pa.Table.from_pydict(columns, schema=target)


def _fixed_vectors(values: list, type_, dtype):
    """fixed_size_list column from per-row 1-D arrays (None: a null row)."""
    import numpy as np
    import pyarrow as pa

    size = type_.list_size
    valid = np.array([v is not None for v in values], dtype=bool)
    flat = np.zeros((len(values), size), dtype=dtype)
    for i, v in enumerate(values):
        if v is not None:
            flat[i] = v
    mask = pa.array(~valid) if not valid.all() else None
    return pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1), type=type_.value_type), size, mask=mask)


def _multivectors(values: list, type_):
    """list<fixed_size_list<float16>[d]> column from per-row (pool, d) arrays (None: a null row)."""
    import numpy as np
    import pyarrow as pa

    inner = type_.value_type
    d = inner.list_size
    offsets = [0]
    parts = []
    for v in values:
        if v is not None:
            v = np.asarray(v, dtype=np.float16).reshape(-1, d)
            parts.append(v)
            offsets.append(offsets[-1] + len(v))
        else:
            offsets.append(offsets[-1])
    flat = np.concatenate(parts).reshape(-1) if parts else np.zeros(0, np.float16)
    vectors = pa.FixedSizeListArray.from_arrays(pa.array(flat, type=inner.value_type), d)
    valid = pa.array([v is not None for v in values])
    mask = pa.compute.invert(valid) if not all(v is not None for v in values) else None
    import pyarrow.compute  # noqa: F401  (pa.compute above)

    return pa.ListArray.from_arrays(pa.array(offsets, type=pa.int32()), vectors, type=type_, mask=mask)


def bm25_counts(term_lists: Iterable[list[str]]) -> tuple[Counter, int, int]:
    """(df per term, chunks, total length) of chunks' bm25_terms."""
    df: Counter = Counter()
    n = total = 0
    for terms in term_lists:
        df.update(set(terms))
        n += 1
        total += len(terms)
    return df, n, total


def scan_bm25_counts(directory: str | Path, batch_rows: int = 65536) -> tuple[Counter, int, int]:
    """`bm25_counts` over every row of DIR/chunks.lance, read a batch of the one column at a time."""
    import lance

    dataset = lance.dataset(str(Path(directory) / schema.CHUNKS))
    df: Counter = Counter()
    n = total = 0
    for batch in dataset.to_batches(columns=["bm25_terms"], batch_size=batch_rows):
        part, rows, length = bm25_counts(batch.column(0).to_pylist())
        df.update(part)
        n += rows
        total += length
    return df, n, total


def write_bm25_stats(directory: str | Path, df: Counter) -> None:
    """Replace DIR/bm25_stats.lance with these document frequencies (terms sorted)."""
    import lance
    import pyarrow as pa

    terms = sorted(df)
    table = pa.Table.from_pydict({"term": terms, "df": [df[t] for t in terms]}, schema=schema.bm25_stats_schema())
    path = Path(directory) / schema.BM25_STATS
    lance.write_dataset(table, str(path), mode="overwrite" if path.exists() else "create")


def refresh_stats(directory: str | Path) -> dict:
    """Recount BM25 statistics, chunks and documents from chunks.lance into bm25_stats.lance and
    the manifest (after a build, an append or a delete). Returns the manifest."""
    import lance

    directory = Path(directory)
    manifest = schema.read_manifest(directory)
    df, n, total = scan_bm25_counts(directory)
    write_bm25_stats(directory, df)
    dataset = lance.dataset(str(directory / schema.CHUNKS))
    docs = set()
    for batch in dataset.to_batches(columns=["doc_sha256", "doc_part"]):
        docs.update(zip(batch.column(0).to_pylist(), batch.column(1).to_pylist()))
    manifest.update(n_chunks=n, n_docs=len(docs), bm25={"n_chunks": n, "total_len": total})
    schema.write_manifest(directory, manifest)
    return manifest


def write_local(rows: list[dict], directory: str | Path, manifest: dict | None = None, index: bool = False) -> dict:
    """Append rows to DIR/chunks.lance without Ray (made with `manifest` when DIR is new, and then
    marked complete; an existing corpus keeps its own). Rows whose chunk_id is there already are
    skipped, so a rerun adds nothing twice. Then the BM25 statistics and counts are recounted,
    and with `index` the indexes rebuilt (`build_indexes`). Returns the manifest."""
    import lance

    directory = Path(directory)
    path = directory / schema.CHUNKS
    if (directory / schema.MANIFEST).is_file():
        manifest = schema.read_manifest(directory)
    elif manifest is None:
        raise ValueError(f"{directory} is not a corpus yet: give the manifest to create it with")
    else:
        schema.write_manifest(directory, dict(manifest, complete=True))
    dims = manifest.get("dims", {})
    unreal_hidden = dims.get("unreal", [0, schema.UNREAL_HIDDEN])[1]
    if path.exists():
        have = committed_ids(directory)
        rows = [r for r in rows if r["chunk_id"] not in have]
    if rows:
        table = rows_to_table(rows, dims.get("dense", schema.DENSE_DIM), unreal_hidden)
        lance.write_dataset(table, str(path), mode="append" if path.exists() else "create")
    manifest = refresh_stats(directory)
    if index:
        manifest["indexes"] = build_indexes(directory, manifest)
        schema.write_manifest(directory, manifest)
    return manifest


def committed_ids(directory: str | Path) -> set[str]:
    """chunk_ids already in DIR/chunks.lance (empty when there is none)."""
    import lance

    path = Path(directory) / schema.CHUNKS
    if not path.exists():
        return set()
    ids: set[str] = set()
    for batch in lance.dataset(str(path)).to_batches(columns=["chunk_id"]):
        ids.update(batch.column(0).to_pylist())
    return ids


def build_indexes(out_dir: Path, manifest: dict) -> dict:
    """The full-text indexes on `text` and on `bm25_terms` (`schema.TERMS_INDEX`), and on `dense`
    an IVF index (dot product) at IVF_MIN_ROWS rows or more; none below (a flat scan is exact and
    quick)."""
    import math

    import lance

    dataset = lance.dataset(str(Path(out_dir) / schema.CHUNKS))
    made = {}
    n = dataset.count_rows()
    if n:
        dataset.create_scalar_index("text", "INVERTED", replace=True)
        made["fts"] = "text"
        dataset.create_scalar_index("bm25_terms", "INVERTED", replace=True, **schema.TERMS_INDEX)
        made["terms"] = "bm25_terms"
    made["dense"] = "none"
    if "dense" in manifest.get("methods", []) and n >= schema.IVF_MIN_ROWS:
        dim = manifest["dims"]["dense"]
        dataset.create_index("dense", "IVF_PQ", metric="dot", replace=True,
                             num_partitions=max(1, int(math.sqrt(n))), num_sub_vectors=dim // 8)
        made["dense"] = "IVF_PQ"
    return made
