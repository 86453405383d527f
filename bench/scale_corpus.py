"""Writing a corpus directory (the layout of evsel/corpus/schema.py) from rows in hand, for the
query benchmark's synthetic corpora (bench/scale.py): the chunks in Lance, the BM25 document
frequencies, the manifest, a full-text index and, at IVF_MIN_ROWS rows or more, an IVF index on
`dense`. Rows are plain dicts with schema.COLUMNS' keys (missing ones null)."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Iterable

from evsel.corpus import schema


from evsel.corpus.query import TERMS_INDEX


def write_corpus(directory: Path, batches: Iterable[list[dict]], *, backbone: str = "synthetic",
                 methods: tuple[str, ...] = ("bm25", "dense"), dense_dim: int = schema.DENSE_DIM,
                 unreal_dims: tuple[int, int] | None = None, fts_columns: tuple[str, ...] = ("text",),
                 ivf: str | None = "auto", ivf_partitions: int | None = None, ivf_sub_vectors: int = 48,
                 configs: dict | None = None) -> dict:
    """Write the corpus; returns the manifest with the seconds each part took (`timings`)."""
    import lance
    import pyarrow as pa

    directory.mkdir(parents=True, exist_ok=True)
    arrow = schema.arrow_schema(dense_dim, unreal_dims[1] if unreal_dims else schema.UNREAL_HIDDEN)
    df: Counter = Counter()
    totals = {"n_chunks": 0, "total_len": 0, "docs": set()}
    timings = {"write_s": 0.0}

    def record_batches():
        for rows in batches:
            t = time.perf_counter()
            for row in rows:
                terms = row["bm25_terms"]
                df.update(set(terms))
                totals["n_chunks"] += 1
                totals["total_len"] += len(terms)
                totals["docs"].add(row["doc_sha256"])
            columns = {name: [row.get(name) for row in rows] for name in schema.COLUMNS if name != "dense"}
            if rows and rows[0].get("dense") is not None:  # one flat array: far quicker than lists
                import numpy as np

                flat = np.stack([row["dense"] for row in rows]).astype(np.float32).reshape(-1)
                columns["dense"] = pa.FixedSizeListArray.from_arrays(pa.array(flat), dense_dim)
            else:
                columns["dense"] = [None] * len(rows)
            columns = {name: columns[name] for name in schema.COLUMNS}
            batch = pa.RecordBatch.from_pydict(columns, schema=arrow)
            timings["write_s"] += time.perf_counter() - t
            yield batch

    t = time.perf_counter()
    reader = pa.RecordBatchReader.from_batches(arrow, record_batches())
    dataset = lance.write_dataset(reader, str(directory / schema.CHUNKS), mode="create",
                                  max_rows_per_file=1 << 20)
    timings["write_s"] = time.perf_counter() - t
    t = time.perf_counter()
    stats = pa.table({"term": list(df), "df": list(df.values())}, schema=schema.bm25_stats_schema())
    lance.write_dataset(stats, str(directory / schema.BM25_STATS), mode="create")
    timings["stats_s"] = time.perf_counter() - t
    for column in fts_columns:
        t = time.perf_counter()
        dataset.create_scalar_index(column, "INVERTED", **(TERMS_INDEX if column == "bm25_terms" else {}))
        timings[f"fts_{column}_index_s"] = time.perf_counter() - t
    indexes = {"fts": fts_columns[0], "dense": "none"}
    n = totals["n_chunks"]
    if "dense" in methods and (ivf == "auto" and n >= schema.IVF_MIN_ROWS or ivf not in ("auto", None)):
        kind = "IVF_PQ" if ivf == "auto" else ivf
        t = time.perf_counter()
        options = {"num_partitions": ivf_partitions or max(1, int(n ** 0.5))}
        if kind == "IVF_PQ":
            options["num_sub_vectors"] = ivf_sub_vectors
        dataset.create_index("dense", kind, metric="dot", **options)
        timings["dense_index_s"] = time.perf_counter() - t
        indexes["dense"] = kind
    dims = {"dense": dense_dim}
    if unreal_dims:
        dims["unreal"] = list(unreal_dims)
    manifest = schema.new_manifest(backbone=backbone, chunk_tokens=140, source="synthetic", methods=list(methods),
                                   dims=dims, configs=configs or {})
    manifest.update(n_chunks=n, n_docs=len(totals["docs"]), bm25={"n_chunks": n, "total_len": totals["total_len"]},
                    indexes=indexes)
    schema.write_manifest(directory, manifest)
    return {**manifest, "timings": timings}
