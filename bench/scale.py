"""Past one machine: query latency and recall@10 of a Lance corpus (`ask --corpus`) against exact
search and against the local SQLite store, at 10^4..10^6 chunks; build throughput of
`evsel corpus build` with 1 and 2 workers against the local encoder.

    python bench/scale.py query --sizes 10000,100000,1000000      # bench/results/scale-query-N.json per size
    python bench/scale.py build --docs 12                          # bench/results/scale-build.json

query: synthetic chunks of 100 words each, drawn (fixed seed) from the word frequencies of 80
FairytaleQA stories (bench/throughput.py's `word_distribution`, as bench/results/bm25.json),
1000 chunks a document. BM25 terms are the local tokenizer's (`chunk_tokens`). Dense states: not
MiniLM over the synthetic text (encoding 10^6 chunks takes hours here) but 384-d unit vectors
made from real MiniLM embeddings: each is normalize(e_j + 0.5 e_k + 0.03 g), e_j, e_k two of the
embeddings of 1000 real FairytaleQA sections (first 800 characters) and g Gaussian noise, so the
vectors cluster as real ones do. Questions: 20 FairytaleQA val questions (their words for BM25,
their MiniLM embeddings for dense).

Per size, in one run: the corpus written with bench/scale_corpus.py (full-text index on `text` as
`evsel corpus build` makes it; IVF_PQ on `dense`, dot, sqrt(N) partitions, 48 sub-vectors),
and a local store of the same chunks (`Store.replace_file`, the persisted BM25 index). Per question:
- corpus BM25, exact: every full-text match rescored with the local BM25 (what `ask --corpus`
  does by default); capped: Lance's top 1000 rescored (EVSEL_CORPUS_BM25_CANDIDATES=1000),
  recall@10 against exact;
- local BM25 as an in-process `ask` runs it: a fresh store connection, the scope's chunks read,
  the persisted index scored; its top 10 must equal the corpus' exact top 10 (checked);
- corpus dense: the IVF_PQ search for 200 candidates, rescored exactly (float32 dot); recall@10
  against the exact top 10; the same with the index off (Lance's flat scan, exact);
- local dense: the exact dot product over all vectors held in memory (what the daemon does once
  a scope's states are loaded; an in-process ask also reads them from SQLite first);
- bytes on disk of each part, and per chunk.
The corpus is opened once per size (the daemon's case); the first query of each kind is timed
apart (cold).

build: `evsel corpus build` of the first --docs FairytaleQA stories (as .txt files) with dense
states, with --workers 1 and 2 on a local Ray instance, against the local encoder on the same
rows in this process (parse + chunk + MiniLM, `evsel.corpus.rows`), per chunk.
"""

from __future__ import annotations

import argparse
import csv
import gc
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import data_dir, load_1m, peak_rss_mib, write_result  # noqa: E402

DOC_CHUNKS = 1000
WORDS = 100
QUESTIONS = 20
BASES = 1000
NOISE = 0.03
ANN_CANDIDATES = 200
BM25_CAP = 1000


def du(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def fairytale_texts(limit: int) -> list[str]:
    root = data_dir() / "fairytaleqa" / "section-stories"
    out = []
    for path in sorted(root.glob("*/*.csv")):
        with open(path, encoding="utf-8") as handle:
            out += [row["text"][:800] for row in csv.DictReader(handle)]
        if len(out) >= limit:
            break
    return out[:limit]


def fairytale_questions(limit: int) -> list[str]:
    root = data_dir() / "fairytaleqa" / "questions" / "val"
    out = []
    for path in sorted(root.glob("*.csv")):
        with open(path, encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
        out += [r["question"] for r in rows[:1]]
        if len(out) >= limit:
            break
    return out[:limit]


def embeddings(cache: Path, questions: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(BASES, 384) section embeddings and (Q, 384) question embeddings, MiniLM, cached."""
    if cache.is_file():
        data = np.load(cache)
        if len(data["questions"]) == len(questions):
            return data["bases"], data["questions"]
    from evsel.models.selectors.dense import MiniLM

    encoder = MiniLM()
    bases = encoder.encode(fairytale_texts(BASES))
    q = encoder.encode(questions)
    np.savez(cache, bases=bases, questions=q)
    return bases, q


def synthetic_docs(n: int, seed: int, words: list[str], p: np.ndarray, bases: np.ndarray):
    """(doc index, texts, vectors) per document of DOC_CHUNKS chunks, deterministic in `seed`."""
    rng = np.random.default_rng(seed)
    vocab = np.array(words, dtype=object)
    for d, start in enumerate(range(0, n, DOC_CHUNKS)):
        m = min(DOC_CHUNKS, n - start)
        picks = rng.choice(len(words), size=(m, WORDS), p=p)
        texts = [" ".join(row) for row in vocab[picks]]
        j, k = rng.integers(0, len(bases), size=(2, m))
        v = bases[j] + 0.5 * bases[k] + NOISE * rng.standard_normal((m, bases.shape[1]))
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        yield d, texts, v.astype(np.float16).astype(np.float32)  # as the local store keeps them: fp16


def doc_sha(d: int) -> str:
    return hashlib.sha256(f"synthetic-doc-{d}".encode()).hexdigest()


def corpus_rows(n: int, seed: int, words, p, bases, vectors_out: list):
    from evsel.store.bm25_index import chunk_tokens

    for d, texts, vectors in synthetic_docs(n, seed, words, p, bases):
        vectors_out.append(vectors)
        sha = doc_sha(d)
        rows = []
        offset = 0
        for seq, (text, vec) in enumerate(zip(texts, vectors)):
            rows.append({"chunk_id": f"{sha}:{seq}", "doc_sha256": sha, "doc_path": f"doc{d}.txt", "doc_part": "",
                         "doc_title": f"doc {d}", "doc_kind": "book", "seq": seq, "text": text,
                         "content_hash": hashlib.sha256(text.encode()).hexdigest(), "n_tokens": WORDS,
                         "char_start": offset, "char_end": offset + len(text), "speakers": [], "turn_ids": [],
                         "bm25_terms": chunk_tokens(text), "dense": vec})
            offset += len(text) + 1
        yield rows


def local_store(path: Path, n: int, seed: int, words, p, bases) -> float:
    from evsel.store.store import Store, connect

    store = Store(connect(path))
    cid = store.collection_id("bench", create=True)
    t = time.perf_counter()
    for d, texts, _ in synthetic_docs(n, seed, words, p, bases):
        rows = []
        offset = 0
        for seq, text in enumerate(texts):
            rows.append({"seq": seq, "text": text, "content_hash": hashlib.sha256(text.encode()).hexdigest(),
                         "n_tokens": WORDS, "char_start": offset, "char_end": offset + len(text)})
            offset += len(text) + 1
        doc = {"part": "", "kind": "book", "title": f"doc {d}", "metadata": {}, "n_chars": offset, "chunks": rows}
        store.replace_file(cid, f"/bench/doc{d}.txt", doc_sha(d), [doc])
    seconds = time.perf_counter() - t
    store.db.execute("pragma wal_checkpoint(truncate)")
    store.db.conn.close()
    return seconds


def summary(values: list[float]) -> dict:
    ordered = sorted(values)
    return {"median_ms": round(1000 * statistics.median(ordered), 3),
            "p90_ms": round(1000 * ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 3),
            "max_ms": round(1000 * ordered[-1], 3)}


def recall(found: list, exact: list) -> float:
    return len(set(found) & set(exact)) / max(1, len(exact))


def query_size(n: int, work: Path, words, p, bases, questions: list[str], qvecs: np.ndarray,
               text_index: bool = True, partitions: int | None = None, local: bool = True,
               existing: bool = False) -> dict:
    from scale_corpus import write_corpus

    from evsel.corpus import schema

    seed = 1000 + n
    out: dict = {"chunks": n, "load_1m_start": load_1m(), "questions": len(questions), "text_index": text_index,
                 "ivf_partitions": partitions or max(1, int(n ** 0.5))}
    directory = work / f"corpus-{n}"
    vectors: list[np.ndarray] = []
    if existing:  # measure a corpus written by an earlier run (its vectors read back)
        import lance

        dataset = lance.dataset(str(directory / schema.CHUNKS))
        matrix = np.concatenate([np.asarray(b.column(0).flatten().to_numpy(), dtype=np.float32).reshape(-1, 384)
                                 for b in dataset.to_batches(columns=["dense"])])
        out["existing"] = True
        out["indexes"] = [getattr(i, "name", "") for i in dataset.describe_indices()]
        return _queries(out, n, directory, matrix, {"chunks_lance": du(directory / schema.CHUNKS) - du(
            directory / schema.CHUNKS / "_indices"), "indexes": du(directory / schema.CHUNKS / "_indices"),
            "bm25_stats": du(directory / schema.BM25_STATS)}, work, questions, qvecs, text_index, False)
    shutil.rmtree(directory, ignore_errors=True)
    t = time.perf_counter()
    manifest = write_corpus(directory, corpus_rows(n, seed, words, p, bases, vectors), backbone="synthetic",
                            methods=("bm25", "dense"), ivf="IVF_PQ" if n >= schema.IVF_MIN_ROWS else None,
                            fts_columns=("text", "bm25_terms") if text_index else ("bm25_terms",),
                            ivf_partitions=partitions,
                            ivf_sub_vectors=48)
    out["corpus_build"] = {"total_s": round(time.perf_counter() - t, 2),
                           **{k: round(v, 2) for k, v in manifest["timings"].items()}}
    matrix = np.concatenate(vectors)  # (n, 384) float32, the exact reference
    del vectors
    chunks_dir = directory / schema.CHUNKS
    index_dir = chunks_dir / "_indices"
    sizes = {"chunks_lance": du(chunks_dir) - du(index_dir), "indexes": du(index_dir),
             "bm25_stats": du(directory / schema.BM25_STATS)}
    print(f"[{n}] corpus written: {out['corpus_build']}", file=sys.stderr, flush=True)
    db = work / f"local-{n}.db"
    if local:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        out["local_ingest_s"] = round(local_store(db, n, seed, words, p, bases), 2)
        sizes["local_sqlite"] = du(db)
    print(f"[{n}] bytes {sizes}", file=sys.stderr, flush=True)
    return _queries(out, n, directory, matrix, sizes, work, questions, qvecs, text_index, local)


def local_bm25_ask(db: Path, question: str, timing: dict[str, list[float]]) -> list:
    """The local store's in-process ask: the scope read from SQLite, then the persisted BM25 (its
    top 10); the two times go into `timing`."""
    from evsel.models.selectors import SelectorContext
    from evsel.models.selectors.bm25 import BM25Selector
    from evsel.store.store import Store, connect

    t = time.perf_counter()
    store = Store(connect(db))
    chunks = store.chunks()
    scope = time.perf_counter() - t
    ranked = BM25Selector(SelectorContext(load_backbone=lambda: None, states=None, store=store)).rank(
        question, chunks, 10)
    timing["local_bm25_ask"].append(time.perf_counter() - t)
    timing["local_bm25_scope"].append(scope)
    store.db.conn.close()
    return ranked


def _queries(out, n, directory, matrix, sizes, work, questions, qvecs, text_index, local) -> dict:
    from evsel.store.bm25_index import tokenize
    from evsel.corpus.query import open_corpus, question_words

    db = work / f"local-{n}.db"
    out["bytes"] = sizes
    out["bytes_per_chunk"] = {k: round(v / n, 1) for k, v in sizes.items()}

    corpus = open_corpus(directory)
    t = time.perf_counter()
    corpus.df()
    out["corpus_open_stats_s"] = round(time.perf_counter() - t, 3)
    timing: dict[str, list[float]] = {k: [] for k in ("bm25_exact", "bm25_capped", "bm25_text_index", "local_bm25_ask", "local_bm25_scope",
                                                      "dense_ivf", "dense_flat", "local_dense_exact")}
    recalls: dict[str, list[float]] = {"bm25_capped": [], "bm25_text_index": [], "dense_ivf": [], "dense_ivf_pq_only": [], "dense_int8": []}
    matches: list[int] = []
    local_equal = 0
    mismatches: list[dict] = []
    top10: dict[str, list] = {"corpus_exact": []}
    cold: dict = {}
    scale = np.abs(matrix).max(axis=1, keepdims=True) / 127.0
    int8 = np.round(matrix / scale).astype(np.int8)  # per-vector scale: 384 B + 4 B a chunk
    # row ids in scan (write) order: a hit's row id -> its row in `matrix`
    all_ids = corpus.dataset.to_table(columns=[], with_row_id=True).column("_rowid").to_numpy()
    assert (np.diff(all_ids.astype(np.int64)) > 0).all()

    def position(row_ids) -> list[int]:
        return np.searchsorted(all_ids, np.asarray(row_ids, dtype=all_ids.dtype)).tolist()
    for i, (question, qv) in enumerate(zip(questions, qvecs)):
        terms, qwords = tokenize(question), question_words(question)
        t = time.perf_counter()
        exact = corpus.bm25(terms, 10, None, qwords)
        timing["bm25_exact"].append(time.perf_counter() - t)
        t = time.perf_counter()
        capped = corpus.bm25(terms, 10, BM25_CAP, qwords)
        timing["bm25_capped"].append(time.perf_counter() - t)
        recalls["bm25_capped"].append(recall([h.row_id for h in capped], [h.row_id for h in exact]))
        if text_index:
            t = time.perf_counter()
            on_text = corpus.bm25(terms, 10, None, qwords, column="text")
            timing["bm25_text_index"].append(time.perf_counter() - t)
            recalls["bm25_text_index"].append(recall([h.row_id for h in on_text], [h.row_id for h in exact]))
        exact_records = corpus.records(exact)
        top10["corpus_exact"].append([(int(r.chunk.path[3:-4]), r.chunk.seq, r.score) for r in exact_records])
        if local:
            local = local_bm25_ask(db, question, timing)
            same = [round(s.score, 9) for s in local] == [round(s.score, 9) for s in exact_records] and \
                [(s.chunk.doc_id - 1, s.chunk.seq) for s in local] == \
                [(int(s.chunk.path[3:-4]), s.chunk.seq) for s in exact_records]
            local_equal += same
            if not same:
                mismatches.append({"question": question,
                                   "local": [(s.chunk.doc_id - 1, s.chunk.seq, s.score) for s in local],
                                   "corpus": [(int(s.chunk.path[3:-4]), s.chunk.seq, s.score) for s in exact_records]})
        t = time.perf_counter()
        hits = corpus.dense(qv, 10, ANN_CANDIDATES)
        timing["dense_ivf"].append(time.perf_counter() - t)
        t = time.perf_counter()
        scores = matrix @ qv
        top = np.argpartition(-scores, 10)[:10]
        top = top[np.argsort(-scores[top])]
        timing["local_dense_exact"].append(time.perf_counter() - t)
        recalls["dense_ivf"].append(recall(position([h.row_id for h in hits]), top.tolist()))
        rows, _ = corpus.nearest("dense", qv, 10)  # the PQ-scored order, no exact rescore
        recalls["dense_ivf_pq_only"].append(recall(position(rows), top.tolist()))
        q8 = (int8.astype(np.float32) * scale) @ qv if n <= 100_000 else None
        if q8 is not None:
            top8 = np.argpartition(-q8, 10)[:10]
            recalls["dense_int8"].append(recall(top8.tolist(), top.tolist()))
        t = time.perf_counter()
        corpus.dataset.to_table(columns=["dense"], nearest={"column": "dense", "q": qv, "k": 10, "metric": "dot",
                                                            "use_index": False}, with_row_id=True)
        timing["dense_flat"].append(time.perf_counter() - t)
        matches.append(len(corpus.dataset.scanner(columns=[], with_row_id=True, limit=None,
                                                  full_text_query=_match(corpus, terms, qwords)).to_table()))
        if i == 0:
            cold = {k: round(1000 * v[0], 3) for k, v in timing.items() if v}
        print(f"[{n}] q{i}: bm25 exact {timing['bm25_exact'][-1] * 1000:.1f} ms, dense ivf "
              f"{timing['dense_ivf'][-1] * 1000:.1f} ms", file=sys.stderr, flush=True)
    out["cold_first_query_ms"] = cold
    out["latency"] = {k: summary(v[1:] if len(v) > 1 else v) for k, v in timing.items() if v}
    out["recall_at_10"] = {k: round(float(np.mean(v)), 4) for k, v in recalls.items() if v}
    out["bm25_full_text_matches_median"] = int(statistics.median(matches))
    out["local_bm25_top10_equal"] = f"{local_equal}/{len(questions)}" if timing["local_bm25_ask"] else None
    out["local_bm25_mismatches"] = mismatches
    out["bm25_top10"] = top10
    out["load_1m_end"] = load_1m()
    out["peak_rss_mib"] = round(peak_rss_mib(), 1)
    del matrix, int8, corpus
    gc.collect()
    return out


def local_only(n: int, work: Path, words, p, bases, questions: list[str]) -> dict:
    """The local store's side of `query_size` alone (a process of its own at 10^6, beside the
    corpus run): ingest, then per question an in-process ask's scope read and persisted BM25."""
    seed = 1000 + n
    db = work / f"local-{n}.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    out: dict = {"chunks": n, "load_1m_start": load_1m(), "questions": len(questions)}
    out["local_ingest_s"] = round(local_store(db, n, seed, words, p, bases), 2)
    out["bytes_per_chunk"] = {"local_sqlite": round(du(db) / n, 1)}
    print(f"[{n}] local store written in {out['local_ingest_s']} s", file=sys.stderr, flush=True)
    timing: dict[str, list[float]] = {"local_bm25_ask": [], "local_bm25_scope": []}
    top10 = []
    for question in questions:
        local = local_bm25_ask(db, question, timing)
        top10.append([(s.chunk.doc_id - 1, s.chunk.seq, s.score) for s in local])
        gc.collect()
        print(f"[{n}] local ask {timing['local_bm25_ask'][-1]:.2f} s", file=sys.stderr, flush=True)
    out["cold_first_query_ms"] = {k: round(1000 * v[0], 3) for k, v in timing.items()}
    out["latency"] = {k: summary(v[1:]) for k, v in timing.items()}
    out["bm25_top10"] = {"local": top10}
    out["load_1m_end"] = load_1m()
    out["peak_rss_mib"] = round(peak_rss_mib(), 1)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    return out


def _match(corpus, terms, words):
    import lance.query as lq

    return lq.MatchQuery(" ".join(dict.fromkeys(terms)), corpus.fts_column)


def run_query(args) -> None:
    from throughput import word_distribution

    from evsel.evaluation.report import run_info

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    words, p = word_distribution()
    questions = fairytale_questions(QUESTIONS)
    bases, qvecs = embeddings(work / "minilm.npz", questions)
    for n in [int(x) for x in args.sizes.split(",")]:
        light = n >= args.light_from  # the largest size: fewer questions, no text index, fewer partitions
        result = {"benchmark": "scale-query", "run": run_info(["python", "bench/scale.py", *sys.argv[1:]]),
                  "setup": {"doc_chunks": DOC_CHUNKS, "words_per_chunk": WORDS, "questions": questions,
                            "dense": f"normalize(e_j + 0.5 e_k + {NOISE} g) of {BASES} MiniLM embeddings",
                            "ann_candidates": ANN_CANDIDATES, "bm25_cap": BM25_CAP},
                  "size": None if args.local_only else query_size(n, work, words, p, bases, questions[:args.light_questions] if light else questions,
                                     qvecs[:args.light_questions] if light else qvecs, text_index=not light,
                                     partitions=args.light_partitions if light else None,
                                     local=not args.no_local, existing=args.existing)}
        if args.local_only:
            result["benchmark"] = "scale-query-local"
            qs = questions[:args.light_questions] if light else questions
            result["size"] = local_only(n, work, words, p, bases, qs)
            write_result(HERE / "results" / f"scale-query-local-{n}.json", result)
            continue
        write_result(HERE / "results" / f"scale-query-{n}.json", result)
        print(json.dumps(result["size"], indent=1), file=sys.stderr, flush=True)
        if not args.keep and not args.existing:
            shutil.rmtree(work / f"corpus-{n}", ignore_errors=True)
            for suffix in ("", "-wal", "-shm"):
                Path(f"{work / f'local-{n}.db'}{suffix}").unlink(missing_ok=True)


def run_build(args) -> None:
    """`evsel corpus build` with 1 and 2 workers, and the local encoder on the same documents."""
    from evsel.evaluation.report import run_info

    sys.path.insert(0, str(HERE.parent / "tests"))
    work = Path(args.work) / "build"
    shutil.rmtree(work, ignore_errors=True)
    source = work / "docs"
    source.mkdir(parents=True)
    root = data_dir() / "fairytaleqa" / "section-stories"
    for story in sorted(root.glob("*/*.csv"), key=lambda q: q.name)[:args.docs]:
        with open(story, encoding="utf-8") as handle:
            text = "\n\n".join(row["text"].strip() for row in csv.DictReader(handle))
        (source / (story.stem + ".txt")).write_text(text + "\n", encoding="utf-8")
    result: dict = {"benchmark": "scale-build", "run": run_info(["python", "bench/scale.py", *sys.argv[1:]]),
                    "docs": args.docs, "states": args.states, "load_1m_start": load_1m()}
    # the local encoder, in this process: the same rows and states the build's workers make
    from evsel.corpus import rows as corpus_rows
    from evsel.models.runtime.backbone import Backbone

    t = time.perf_counter()
    backbone = Backbone(threads=1)
    encoder = corpus_rows.StateEncoder(backbone, dense="dense" in args.states, unreal="unreal" in args.states)
    load_s = time.perf_counter() - t
    t = time.perf_counter()
    rows = [r for f in sorted(source.iterdir()) for r in corpus_rows.rows_of_file(f, source, backbone)]
    parse_s = time.perf_counter() - t
    t = time.perf_counter()
    for at in range(0, len(rows), 64):
        encoder.add_states(rows[at:at + 64])
    encode_s = time.perf_counter() - t
    result["local"] = {"chunks": len(rows), "load_s": round(load_s, 2), "parse_chunk_s": round(parse_s, 2),
                       "encode_s": round(encode_s, 2),
                       "per_chunk_ms": round(1000 * (parse_s + encode_s) / len(rows), 2)}
    print(f"local: {result['local']}", file=sys.stderr, flush=True)
    del encoder, backbone
    gc.collect()
    result["build"] = []
    for workers in [int(w) for w in args.workers_list.split(",")]:
        out = work / f"corpus-{workers}"
        env = dict(os.environ, EVSEL_THREADS="1")
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "evsel", "corpus", "build", str(source), "--out", str(out),
                               "--workers", str(workers), "--states", args.states, "--json"],
                              capture_output=True, text=True, env=env, timeout=3600)
        wall = time.perf_counter() - t
        entry = {"workers": workers, "wall_s": round(wall, 2), "rc": proc.returncode,
                 "stderr_tail": proc.stderr[-1500:]}
        if proc.returncode == 0:
            manifest = json.loads(proc.stdout)
            entry.update(chunks=manifest["n_chunks"], chunks_per_s=round(manifest["n_chunks"] / wall, 2),
                         per_chunk_ms=round(1000 * wall / manifest["n_chunks"], 2), bytes=du(out))
            entry["overhead_vs_local_per_chunk_ms"] = round(entry["per_chunk_ms"] - result["local"]["per_chunk_ms"], 2)
        result["build"].append(entry)
        print(f"build: {entry}", file=sys.stderr, flush=True)
    result["load_1m_end"] = load_1m()
    write_result(HERE / "results" / args.out, result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="part", required=True)
    q = sub.add_parser("query", help="query latency and recall@10 per corpus size")
    q.add_argument("--sizes", default="10000,100000,1000000")
    q.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "evsel-scale"))
    q.add_argument("--keep", action="store_true", help="keep the corpora and stores")
    q.add_argument("--light-from", type=int, default=1_000_000,
                   help="from this size on: --light-questions questions, no index on text, --light-partitions")
    q.add_argument("--light-questions", type=int, default=10)
    q.add_argument("--no-local", action="store_true", help="no local store (run it apart with --local-only)")
    q.add_argument("--local-only", action="store_true", help="the local store's side alone")
    q.add_argument("--existing", action="store_true", help="measure the corpus an earlier run left in --work")
    q.add_argument("--light-partitions", type=int, default=256)
    b = sub.add_parser("build", help="build throughput: 1 vs 2 workers, and the local encoder")
    b.add_argument("--docs", type=int, default=12)
    b.add_argument("--states", default="dense")
    b.add_argument("--workers-list", default="1,2")
    b.add_argument("--out", default="scale-build.json", help="file name in bench/results")
    b.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "evsel-scale"))
    args = parser.parse_args()
    run_query(args) if args.part == "query" else run_build(args)


if __name__ == "__main__":
    main()
