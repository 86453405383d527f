"""A corpus that grows: `evsel corpus add DIR FILES...` and `evsel corpus rm DIR DOC...`.

An append parses and chunks the files as the build does (`rows.rows_of_file`, the corpus'
--chunk-tokens, this backbone's tokenizer), computes the same states with the same models
(`rows.StateEncoder`; the corpus' recorded model fingerprints and configs must match), appends
the rows as new Lance fragments, and folds them into the full-text and vector indexes
(`optimize_indices`: new data is indexed on its own and merged, nothing is retrained). A file
whose document is there already (same sha256) is left as it is; a file stored under the same
doc_path with other bytes is replaced. A delete drops a document's rows (a deletion vector: no
data is rewritten) by its sha256 (or a prefix of 8+ hex digits, as `ask` shows 12) or its doc_path.

The BM25 statistics are updated by the rows that came or went (df per term in
bm25_stats.lance, N and the total length in the manifest), never by rescanning the corpus.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path, PurePath

from evsel.errors import EvselError, InputError, NotFoundError

from . import rows as corpus_rows
from . import schema
from .query import check_directory, index_terms, require_extra

HEX = set("0123456789abcdef")


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _documents(dataset) -> list[dict]:
    """One entry per document (sha256, part, path, title) with its chunk count."""
    docs: dict[tuple, dict] = {}
    for batch in dataset.to_batches(columns=["doc_sha256", "doc_part", "doc_path", "doc_title"]):
        for sha, part, path, title in zip(*(c.to_pylist() for c in batch.columns)):
            entry = docs.get((sha, part))
            if entry is None:
                entry = docs[(sha, part)] = {"sha256": sha, "part": part, "path": path, "title": title, "chunks": 0}
            entry["chunks"] += 1
    return list(docs.values())


def _update_stats(directory: Path, manifest: dict, added: Counter, removed: Counter, n_delta: int,
                  len_delta: int, docs_delta: int) -> dict:
    """Apply df changes to bm25_stats.lance and counts to the manifest (written last)."""
    import lance

    stats_path = directory / schema.BM25_STATS
    df: Counter = Counter()
    if stats_path.exists():
        table = lance.dataset(str(stats_path)).to_table(columns=["term", "df"])
        df.update(dict(zip(table.column("term").to_pylist(), table.column("df").to_pylist())))
    df.update(added)
    df.subtract(removed)
    corpus_rows.write_bm25_stats(directory, Counter({t: c for t, c in df.items() if c > 0}))
    bm25 = manifest.get("bm25") or {"n_chunks": 0, "total_len": 0}
    n = bm25["n_chunks"] + n_delta
    manifest.update(n_chunks=n, n_docs=max(0, int(manifest.get("n_docs") or 0) + docs_delta),
                    bm25={"n_chunks": n, "total_len": bm25["total_len"] + len_delta})
    schema.write_manifest(directory, manifest)
    return manifest


def _term_counts(term_lists) -> tuple[Counter, int, int]:
    return corpus_rows.bm25_counts(term_lists)


def _delete(dataset, predicate_docs: list[tuple[str, str]]) -> tuple[Counter, int, int]:
    """Delete the rows of these (sha256, part) documents; the df, rows and length they held."""
    removed: Counter = Counter()
    n = length = 0
    for at in range(0, len(predicate_docs), 200):
        part = predicate_docs[at:at + 200]
        predicate = " OR ".join(f"(doc_sha256 = {_quote(sha)} AND doc_part = {_quote(p)})" for sha, p in part)
        for batch in dataset.to_batches(columns=["bm25_terms"], filter=predicate):
            df, rows, total = _term_counts(batch.column(0).to_pylist())
            removed.update(df)
            n += rows
            length += total
        dataset.delete(predicate)
    return removed, n, length


def _refresh_indexes(directory: Path, dataset, timings: dict) -> None:
    """Fold new rows into the indexes; a corpus without the index on bm25_terms gets it (exact
    BM25 candidates, evsel/corpus/query.py)."""
    t = time.perf_counter()
    if dataset.describe_indices():
        dataset.optimize.optimize_indices()
    index_terms(directory)
    timings["index_s"] = round(time.perf_counter() - t, 4)


def add(directory: str, targets: list[str], backbone, settings, on_event=None) -> dict:
    """Append the documents of `targets` (files or folders) to the corpus at `directory`."""
    import lance

    require_extra()
    path, manifest = check_directory(directory)
    on_event = on_event or (lambda _e: None)
    timings: dict[str, float] = {}
    t = time.perf_counter()
    encoder = _matching_encoder(manifest, backbone, settings)
    timings["load_s"] = round(time.perf_counter() - t, 4)
    dataset = lance.dataset(str(path / schema.CHUNKS))
    existing = _documents(dataset)
    by_sha = {d["sha256"] for d in existing}
    by_path: dict[str, list[dict]] = {}
    for d in existing:
        by_path.setdefault(d["path"], []).append(d)
    source = Path(manifest.get("source") or "/nonexistent")
    files: list[Path] = []
    for target in targets:
        files.extend(corpus_rows.collect_files(Path(target).expanduser()))
    t = time.perf_counter()
    results, new_rows, replaced = _parsed_files(files, source, manifest, backbone, by_sha, by_path, on_event)
    timings["parse_s"] = round(time.perf_counter() - t, 4)
    on_event({"type": "progress", "task": "files", "label": "", "done": len(files), "total": len(files)})
    t = time.perf_counter()
    batch = 64
    for at in range(0, len(new_rows), batch):
        on_event({"type": "progress", "task": "encode", "label": "chunk states", "done": at, "total": len(new_rows)})
        encoder.add_states(new_rows[at:at + batch])
    timings["encode_s"] = round(time.perf_counter() - t, 4)
    removed, n_removed, len_removed = Counter(), 0, 0
    t = time.perf_counter()
    if replaced:
        removed, n_removed, len_removed = _delete(dataset, replaced)
    added, n_added, len_added = _term_counts(r["bm25_terms"] for r in new_rows)
    if new_rows:
        dims = manifest.get("dims") or {}
        table = corpus_rows.rows_to_table(new_rows, dims.get("dense", schema.DENSE_DIM),
                                          (dims.get("unreal") or [0, schema.UNREAL_HIDDEN])[1])
        dataset = lance.write_dataset(table, str(path / schema.CHUNKS), mode="append")
    timings["write_s"] = round(time.perf_counter() - t, 4)
    if new_rows or replaced:
        _refresh_indexes(path, dataset, timings)
        docs_delta = len({(r["doc_sha256"], r["doc_part"]) for r in new_rows}) - len(set(replaced))
        manifest = _update_stats(path, manifest, added, removed, n_added - n_removed, len_added - len_removed,
                                 docs_delta)
    return {"corpus": str(path), "files": results, "added_chunks": n_added, "removed_chunks": n_removed,
            "n_chunks": manifest["n_chunks"], "n_docs": manifest["n_docs"], "timings": timings}


def _matching_encoder(manifest: dict, backbone, settings):
    """The state encoder for the corpus' methods; refused unless this backbone and its configs are
    the ones the corpus was built with."""
    if manifest.get("backbone") and manifest["backbone"] != backbone.fingerprint:
        raise InputError(f"the corpus was built with backbone {manifest['backbone'][:16]}, not this model's "
                         f"{backbone.fingerprint[:16]}", "add with the --model it was built with")
    methods = manifest.get("methods") or ["bm25"]
    encoder = corpus_rows.StateEncoder(backbone, dense="dense" in methods, unreal="unreal" in methods,
                                       adapter=settings.unreal_adapter)
    made = {k: v for k, v in encoder.configs().items()}
    wanted = {k: v for k, v in (manifest.get("configs") or {}).items() if k in methods}
    if made != wanted:
        raise InputError("the corpus' states were made with other models or configs than this evsel has "
                         f"({', '.join(sorted(set(wanted) | set(made)))})",
                         "add with the model and adapter it was built with (--model, EVSEL_UNREAL_ADAPTER)")
    return encoder


def _parsed_files(files: list[Path], source: Path, manifest: dict, backbone, by_sha: set[str],
                  by_path: dict[str, list[dict]], on_event) -> tuple[list[dict], list[dict], list[tuple]]:
    """(each file's result, the rows of the files not in the corpus yet, the (sha256, part) of the
    documents they replace). A file whose content is already there is unchanged."""
    results, new_rows, replaced = [], [], []
    for index, file in enumerate(files):
        on_event({"type": "progress", "task": "files", "label": file.name, "done": index, "total": len(files)})
        file = file.resolve()
        doc_path = PurePath(file.relative_to(source)).as_posix() if source in file.parents else str(file)
        try:
            rows = corpus_rows.rows_of_file(file, None, backbone, int(manifest.get("chunk_tokens") or 140))
        except EvselError as exc:
            results.append({"path": str(file), "status": "failed", "error": exc.to_dict()})
            continue
        except OSError as exc:
            results.append({"path": str(file), "status": "failed",
                            "error": InputError(f"cannot read the file: {exc.strerror or exc}").to_dict()})
            continue
        for row in rows:
            row["doc_path"] = doc_path
        sha = rows[0]["doc_sha256"]
        if sha in by_sha:
            results.append({"path": str(file), "status": "unchanged", "sha256": sha, "chunks": 0})
            continue
        replaced += [(d["sha256"], d["part"]) for d in by_path.get(doc_path, [])]
        by_sha.add(sha)
        new_rows.extend(rows)
        results.append({"path": str(file), "status": "added", "sha256": sha, "doc_path": doc_path,
                        "chunks": len(rows)})
    return results, new_rows, replaced


def resolve(existing: list[dict], names: list[str]) -> list[dict]:
    """The documents `names` designate (a sha256 or 8+ hex digit prefix, or a doc_path); raises
    for one that matches none or several, before anything is deleted."""
    chosen: list[dict] = []
    for name in names:
        matches = [d for d in existing if d["path"] == name]
        low = name.lower()
        if not matches and len(low) >= 8 and set(low) <= HEX:
            matches = [d for d in existing if d["sha256"].startswith(low)]
        if not matches:
            raise NotFoundError(f"no document {name!r} in the corpus",
                                "give a doc_path or a sha256 (or its first 12 digits) as ask --corpus shows them")
        if len({d["sha256"] for d in matches}) > 1:
            raise InputError(f"{name!r} matches {len(matches)} documents", "give more digits of the sha256")
        chosen += [d for d in matches if d not in chosen]
    return chosen


def remove(directory: str, docs: list[str]) -> dict:
    """Delete documents from the corpus at `directory` (all or none: unknown names fail first)."""
    import lance

    require_extra()
    if not docs:
        raise InputError("no documents given", "name them by doc_path or sha256: evsel corpus rm DIR DOC...")
    path, manifest = check_directory(directory)
    timings: dict[str, float] = {}
    dataset = lance.dataset(str(path / schema.CHUNKS))
    chosen = resolve(_documents(dataset), docs)
    t = time.perf_counter()
    removed, n_removed, len_removed = _delete(dataset, [(d["sha256"], d["part"]) for d in chosen])
    timings["delete_s"] = round(time.perf_counter() - t, 4)
    manifest = _update_stats(path, manifest, Counter(), removed, -n_removed, -len_removed, -len(chosen))
    return {"corpus": str(path), "removed": [{k: d[k] for k in ("sha256", "path", "title", "chunks")} for d in chosen],
            "removed_chunks": n_removed, "n_chunks": manifest["n_chunks"], "n_docs": manifest["n_docs"],
            "timings": timings}
