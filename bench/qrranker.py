"""QRRanker on this machine: latency of one 50-candidate rerank (warm model) for both encodings,
truncated vs full depth, with BM25 alone in the same run; recall@k on a FairytaleQA val sample for
bm25 vs bm25>qrranker (the detected, untrained heads) per encoding; position bias per encoding.

    python bench/qrranker.py [--out bench/results/qrranker.json] [--questions 100] [--bias 20] [--quick]
    python bench/qrranker.py --only latency   # section 1 alone, merged into the existing --out file
    python bench/qrranker.py --only ingest-kv [--book PATH] [--kv-out bench/results/qrranker-kv.json] [--candidates-only]

--only ingest-kv: the block KV computed at ingest (EVSEL_QRRANKER_KV). The Sherlock Holmes book is
ingested into a fresh store, its chunks' block KV written as the daemon's background job does
(`QRRankerSelector.encode_missing_kv` in 0.5 s slices), then each question is asked `--evidence-only` by a
fresh engine (cold in-memory caches; the model loaded, its load time apart) three ways, in turns:
BM25 alone, `--rerank qrranker` reading the files, and `--rerank qrranker` with no files (what a
first rerank cost before). Evidence time = the ask's total less its model load; disk cost = the
files' bytes over the book's tokens.

Latency also times the block encoding with the trained adapter shipped beside the heads
("block-truncated+adapter") and with a memory block of 512 tokens ("block-truncated+memory").

Latency: the bundled sample story, its BM25 top 50 for a few questions; "cold" = the candidates'
KV is not cached (every candidate encoded), "warm KV" = the candidates' block KV is cached from an
earlier question (block encoding only; the causal prefill depends on the whole ordered list).
Recall: the same questions, chunks and gold mapping as `evsel eval fairytaleqa --limit N`
(questions evenly spaced), the reranker's order over BM25's top 50 then BM25's rest, exactly as
the pipeline combines them. Position bias: `models.qrranker.order_correlation` over each
question's BM25 top 50 in two random orders.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import load_1m, write_result  # noqa: E402

QUESTIONS = ["Who killed Ambrose Tenterden?", "What did the keeper find on the stairs?",
             "Where was the knife hidden?", "Who sent the letter?", "What happened to the lamp oil?",
             "When did the storm begin?", "Why did the boat leave early?"]


BOOK = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "nocha" / "books" / \
    "the_adventures_of_sherlock_holmes_arthur_conan_doyle.txt"
BOOK_QUESTIONS = ["Who is Irene Adler?", "What was the Red-Headed League really for?",
                  "What was the speckled band?", "Where was the blue carbuncle found?",
                  "Who was the man with the twisted lip?"]


def ingest_kv(args, argv) -> int:
    import tempfile

    import torch

    with tempfile.TemporaryDirectory(prefix="evsel-bench-qrkv-") as home:
        os.environ["EVSEL_HOME"] = home
        from evsel.engine import Engine
        from evsel.evaluation.report import run_info
        from evsel.models.qrranker import kv as qrranker_kv
        from evsel.requests import AskRequest
        from evsel.settings import Settings

        settings = Settings.resolve().with_(qrranker_kv=True, encode=False, no_daemon=True)
        engine = Engine(settings)
        backbone = engine.backbone
        _ = backbone.model
        result: dict = {"run": run_info(["python", "bench/qrranker.py", *(argv if argv is not None else sys.argv[1:])]),
                        "backbone": backbone.name, "fingerprint": backbone.fingerprint[:16],
                        "device": backbone.plan.device, "dtype": backbone.plan.dtype,
                        "threads": torch.get_num_threads(), "cpus": os.cpu_count(), "load_before": load_1m(),
                        "book": Path(args.book).name, "book_bytes": Path(args.book).stat().st_size}
        t = time.perf_counter()
        engine.ingest([args.book])
        result["ingest_s"] = time.perf_counter() - t
        chunks = engine.store.chunks()
        result["chunks"] = len(chunks)
        result["book_tokens"] = sum(c.n_tokens for c in chunks)
        events = []
        t = time.perf_counter()
        from evsel.models.selectors import IngestWork
        from evsel.models.selectors.qrranker import QRRankerSelector

        work = IngestWork(engine.selector_context(events.append), None, batch=16, slice_s=0.5)
        if args.candidates_only:  # the questions' BM25 top 50s: what their first reranks read
            from evsel.models.selectors import get_selector as selector_named

            bm25 = selector_named("bm25", engine.selector_context())
            chunks = list({s.chunk.id: s.chunk for q in BOOK_QUESTIONS for s in bm25.rank(q, chunks, 50)}.values())
            result["kv_chunks"] = len(chunks)
            result["kv_chunk_tokens"] = sum(c.n_tokens for c in chunks)
        encoded = QRRankerSelector(work.context).encode_missing_kv(chunks, work)
        result["background_s"] = time.perf_counter() - t
        result["background_chunks"] = encoded
        result["background_slices"] = sum(1 for e in events if e.get("type") == "progress") - 1
        files = list((Path(home) / qrranker_kv.FOLDER).rglob("*.npy"))
        disk = sum(f.stat().st_size for f in files)
        tokens = result.get("kv_chunk_tokens", result["book_tokens"])
        result.update(files=len(files), disk_bytes=disk, disk_bytes_per_token=disk / tokens,
                      disk_over_text=disk / result["book_bytes"])
        from evsel.models.selectors import get_selector

        scorer = get_selector("qrranker", engine.selector_context()).scorer
        result["kv"] = {"depth": scorer.depth, "captured_layers": list(scorer.captured), "bits": scorer.kv_files.bits,
                        "payload_bytes_per_block_token_at_140": scorer.kv_files.bytes_per_token(140),
                        "exact_bytes_per_block_token": 2 * (2 * scorer.depth * scorer.kv_files.kv_heads
                                                            * scorer.kv_files.head_dim
                                                            + len(scorer.captured) * scorer.kv_files.hidden)}
        print(json.dumps(result, default=str), flush=True)

        def ask(question: str, rerank: str | None, files: bool) -> dict:
            fresh = Engine(settings.with_(qrranker_kv=files))  # cold in-memory caches, the model shared
            fresh._backbone = backbone
            t = time.perf_counter()
            got = fresh.ask(AskRequest(question, rerank=rerank, evidence_only=True))
            wall = time.perf_counter() - t
            timings = got["timings"]
            return {"evidence_s": wall - timings.get("load_s", 0.0), "timings": timings,
                    "top": [e["chunk_id"] for e in got["evidence"]]}

        ask(BOOK_QUESTIONS[0], None, True)  # first-call costs (allocators, kernels) aside
        rows = []
        for question in BOOK_QUESTIONS:
            row = {"question": question, "bm25": ask(question, None, True),
                   "qrranker_files": ask(question, "qrranker", True),
                   "qrranker_no_files": ask(question, "qrranker", False)}
            row["same_evidence"] = row["qrranker_files"]["top"] == row["qrranker_no_files"]["top"]
            rows.append(row)
            print(question, {k: round(v["evidence_s"], 3) for k, v in row.items() if isinstance(v, dict)}, flush=True)
        result["asks"] = rows
        for name in ("bm25", "qrranker_files", "qrranker_no_files"):
            result[f"{name}_evidence_s"] = statistics.median(r[name]["evidence_s"] for r in rows)
        result["files_over_bm25"] = statistics.median(r["qrranker_files"]["evidence_s"] / r["bm25"]["evidence_s"]
                                                      for r in rows)
        result["files_over_no_files"] = statistics.median(
            r["qrranker_files"]["evidence_s"] / r["qrranker_no_files"]["evidence_s"] for r in rows)
        result["target_s"] = 2.0
        result["load_after"] = load_1m()
    out = Path(args.kv_out)
    write_result(out, result)
    print(f"wrote {out}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench/results/qrranker.json")
    parser.add_argument("--questions", type=int, default=100, help="FairytaleQA val questions for recall")
    parser.add_argument("--bias", type=int, default=20, help="questions for the position-bias correlation")
    parser.add_argument("--reps", type=int, default=7, help="reranks timed per configuration")
    parser.add_argument("--no-slot", action="store_true", help="skip the block encoding with slot labels")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a check that the script runs)")
    parser.add_argument("--only", choices=["latency", "ingest-kv"], help="run this section alone (latency: merged "
                        "into --out; ingest-kv: written to --kv-out)")
    parser.add_argument("--book", default=str(BOOK), help="ingest-kv: the book")
    parser.add_argument("--kv-out", default="bench/results/qrranker-kv.json")
    parser.add_argument("--candidates-only", action="store_true",
                        help="ingest-kv: compute the KV of the questions' BM25 top 50s only, not the whole book")
    args = parser.parse_args(argv)
    if args.only == "ingest-kv":
        return ingest_kv(args, argv)
    if args.quick:
        args.questions, args.bias, args.reps = 6, 2, 2

    import torch
    from evsel.ingest import chunker
    from evsel.engine import Engine
    from evsel.evaluation import metrics
    from evsel.evaluation.datasets import load_dataset
    from evsel.evaluation.report import run_info
    from evsel.evaluation.runner import build_corpus, gold_units, select_questions
    from evsel.models.qrranker import rerank as qr
    from evsel.models.selectors import SelectorContext, get_selector
    from evsel.ingest.parsers import parse_file
    from evsel.paths import sample_story_path
    from evsel.settings import Settings
    from evsel.store.store import ChunkRecord

    engine = Engine(Settings.resolve())
    backbone = engine.backbone
    _ = backbone.model
    context = SelectorContext(load_backbone=lambda: backbone, states=None)  # BM25 needs no state cache
    bm25 = get_selector("bm25", context)
    heads_data = qr.load_head_file(qr.shipped_heads_dir(backbone.fingerprint))
    heads = {e: qr.heads_of(heads_data, e) for e in qr.ENCODINGS}
    n_layers = backbone.model.config.num_hidden_layers
    result: dict = {
        "run": run_info(["python", "bench/qrranker.py", *(argv if argv is not None else sys.argv[1:])]),
        "backbone": backbone.name, "fingerprint": backbone.fingerprint[:16], "device": backbone.plan.device,
        "dtype": backbone.plan.dtype, "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
        "heads": {e: qr.format_heads(h) for e, h in heads.items()},
        "depth": {e: max(l for l, _ in h) + 1 for e, h in heads.items()}, "layers": n_layers,
        "load_before": load_1m(),
    }

    adapter_dir = qr.adapter_folder(backbone, None)
    adapter = qr.load_adapter(adapter_dir, backbone.model) if adapter_dir else None

    def scorer(encoding: str, truncate: bool = True, labels: str = "same", trained: bool = False) -> qr.QRScorer:
        chosen = [tuple(h) for h in adapter.config.heads] if trained else heads[encoding]
        return qr.QRScorer(backbone, chosen, qr.ScorerConfig(encoding=encoding, truncate=truncate,
                                                             block_labels=labels),
                           adapter=adapter if trained else None)

    # 1. latency of one 50-candidate rerank, warm model
    doc = parse_file(sample_story_path())[0]
    chunks = [ChunkRecord(id=i + 1, doc_id=1, title=doc.title, kind=doc.kind, path="sample", **c.record())
              for i, c in enumerate(chunker.chunk_document(doc, backbone, 140))]
    questions = (QUESTIONS * 4)[: args.reps + 1]
    candidates = {}
    bm25_s = []
    for q in questions:
        t = time.perf_counter()
        candidates[q] = [s.chunk.text for s in bm25.rank(q, chunks, 50)]
        bm25_s.append(time.perf_counter() - t)
    latency: dict = {"sample_chunks": len(chunks), "candidates": 50,
                     "candidate_tokens": int(np.mean([sum(backbone.count(v)) for v in candidates.values()])),
                     "bm25_s": {"median": statistics.median(bm25_s), "all": bm25_s}}
    warmup = scorer("block")
    warmup.scores(questions[0], candidates[questions[0]][:4])  # first-call costs (allocators, kernels) aside
    # configurations interleaved within each repetition, so that the load of a shared machine
    # drifting over the run hits them all alike; ratios are paired within a repetition
    configs = [(e, t, "") for e in qr.ENCODINGS for t in (True, False)]
    if adapter is not None:
        configs.append(("block", True, "+adapter"))
    configs.append(("block", True, "+memory"))
    # a memory of the budget's size: summaries of the story's own blocks, repeated to 512 tokens
    memory_text = " ".join(c.text for c in chunks[::20])
    memory_text = backbone.tokenizer.decode(backbone.tokenizer(memory_text, add_special_tokens=False)["input_ids"][:512])
    times: dict = {f"{e}-{'truncated' if t else 'full'}{x}": {"cold": [], "warm_kv": []} for e, t, x in configs}
    depths = {}
    for q in questions[1:]:
        for encoding, truncate, extra in configs:
            name = f"{encoding}-{'truncated' if truncate else 'full'}{extra}"
            s = scorer(encoding, truncate, trained=extra == "+adapter")  # a fresh scorer: nothing cached
            memory = memory_text if extra == "+memory" else None
            depths[name] = s.depth
            t = time.perf_counter()
            s.scores(q, candidates[q], memory)
            times[name]["cold"].append(time.perf_counter() - t)
            if encoding == "block":  # the candidates' KV cached by an earlier question
                s.encoded_contexts.clear()  # ... the context is assembled again from the cached blocks
                t = time.perf_counter()
                s.scores(questions[0], candidates[q], memory)
                times[name]["warm_kv"].append(time.perf_counter() - t)
        print("latency rep", {k: round(v["cold"][-1], 2) for k, v in times.items()}, flush=True)
    for name, got in times.items():
        entry = {"depth": depths[name], "cold_s": {"median": statistics.median(got["cold"]), "all": got["cold"]}}
        if got["warm_kv"]:
            entry["warm_kv_s"] = {"median": statistics.median(got["warm_kv"]), "all": got["warm_kv"]}
        latency[name] = entry
    for encoding in qr.ENCODINGS:
        pairs = [a / b for a, b in zip(times[f"{encoding}-truncated"]["cold"], times[f"{encoding}-full"]["cold"])]
        latency[f"{encoding}-truncated_over_full"] = {"median_of_paired": statistics.median(pairs), "all": pairs}
    print(json.dumps({k: (v.get("cold_s", {}).get("median"), v.get("warm_kv_s", {}).get("median"))
                      if isinstance(v, dict) and "cold_s" in v else v for k, v in latency.items()
                      if k.startswith(("block", "causal"))}, default=str), flush=True)
    result["latency"] = latency
    if args.only == "latency":
        out = Path(args.out)
        whole = json.loads(out.read_text()) if out.is_file() else {}
        whole["latency"] = latency
        whole["latency_run"] = {k: result[k] for k in ("run", "threads", "load_before")}
        whole["latency_run"]["load_after"] = load_1m()
        write_result(out, whole)
        print(f"wrote the latency section of {out}")
        return 0

    # 2. recall on FairytaleQA val, and 3. position bias
    dataset = load_dataset("fairytaleqa", split="val")
    picked = select_questions(dataset.questions, args.questions)
    keys = list(dict.fromkeys(k for q in picked for k in q.docs))
    corpus = build_corpus(dataset, keys, backbone, 140)
    tally: dict = {}
    units = {q.qid: gold_units(q, corpus, tally) for q in picked}
    picked = [q for q in picked if units[q.qid]]
    variants = {"block": scorer("block"), "causal": scorer("causal")}
    if not args.no_slot:
        variants["block-slot-labels"] = scorer("block", labels="slot")
    ks = [1, 3, 5, 10]
    per_method: dict = {name: [] for name in ["bm25", *[f"bm25>qrranker[{v}]" for v in variants]]}
    rerank_s: dict = {v: [] for v in variants}
    for n, q in enumerate(picked):
        scope = corpus.scope(q.docs)
        ranked = [s.chunk for s in bm25.rank(q.question, scope)]
        per_method["bm25"].append(metrics.ranking_metrics([c.id for c in ranked], units[q.qid], ks))
        top, rest = ranked[:50], ranked[50:]
        for name, s in variants.items():
            t = time.perf_counter()
            values = s.scores(q.question, [c.text for c in top])
            rerank_s[name].append(time.perf_counter() - t)
            order = [top[i] for i in np.argsort(-values, kind="stable")] + rest
            per_method[f"bm25>qrranker[{name}]"].append(metrics.ranking_metrics([c.id for c in order], units[q.qid], ks))
        if n % 10 == 0:
            print(f"recall: {n}/{len(picked)}", flush=True)
    recall = {"dataset": "fairytaleqa val", "questions": len(picked), "gold_mapping": tally,
              "note": "questions evenly spaced as evsel eval --limit; BM25 top 50 reranked, then BM25's rest"}
    for name, rows in per_method.items():
        recall[name] = {key: round(float(np.mean([r[key] for r in rows])), 4) for key in rows[0]}
    for name, times in rerank_s.items():
        recall[f"bm25>qrranker[{name}]"]["rerank_s_median"] = round(statistics.median(times), 3)
    result["recall"] = recall
    print(json.dumps(recall, indent=1), flush=True)

    bias: dict = {"questions": min(args.bias, len(picked)), "probe_before_code": {"causal_pearson": 0.53}}
    sample = picked[:: max(1, len(picked) // max(1, args.bias))][: args.bias]
    for name, s in variants.items():
        rows = []
        for i, q in enumerate(sample):
            top = [s.chunk.text for s in bm25.rank(q.question, corpus.scope(q.docs), 50)]
            rows.append(qr.order_correlation(s.scores, q.question, top, seed=i))
        bias[name] = {key: round(float(np.nanmean([r[key] for r in rows])), 4) for key in rows[0]}
        bias[name]["min_pearson"] = round(float(np.nanmin([r["pearson"] for r in rows])), 4)
        print(name, bias[name], flush=True)
    result["position_bias"] = bias
    result["load_after"] = load_1m()

    out = Path(args.out)
    write_result(out, result)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
