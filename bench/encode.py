"""The background encode of the fusion's per-chunk LLM states on the start of a novel: UNREAL's chunk
states and QRRanker's stored block KV (the dense MiniLM embeddings aside), tokens/s, two ways
alternating in one run, each in the daemon's slices of about 0.5 s:
- `separate`: each method's own pass through its ingest hook, as ingest runs them today (UNREAL:
  [BOS] + chunk to layer 24; QRRanker: the chunk's block after its prefix to layer 24);
- `shared`: one block-context pass per chunk (models/encode_pass.py), which writes the same KV files
  and, from the same forward, residual states at UNREAL's layer read in the block context (kept under
  their own key: they are not UNREAL's states, see below).

The book is cut to its first --chars characters (about --chars / 500 chunks; the result says how
many) so that a run takes minutes on a shared CPU; it is ingested once, and each arm starts from
no states and no KV files. Besides the times it records how close the shared pass comes to what
each method computes alone: the KV files byte for byte, and UNREAL's scores over the cut book's
chunks with its own states against the block-context ones (Spearman, top-10 overlap) for the
cold-ask questions.

    EVSEL_THREADS=1 python bench/encode.py [--chars 30000] [--rounds 2]

Writes bench/results/encode.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
BOOK = ROOT.parent / "shared" / "data" / "nocha" / "books" / "the_adventures_of_sherlock_holmes_arthur_conan_doyle.txt"
QUESTIONS = ["Where did the King of Bohemia meet Irene Adler?", "What was the speckled band?",
             "Who was the man with the twisted lip?", "Who is Irene Adler?", "What did the photograph show?",
             "Why did the King need the photograph back?"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--book", default=str(BOOK))
    parser.add_argument("--chars", type=int, default=30000, help="the book's first characters ingested")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each arm (alternating)")
    parser.add_argument("--slice-s", type=float, default=0.5, help="the daemon's slice length")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "encode.json"))
    args = parser.parse_args(argv)
    from common import load_1m, write_result

    with tempfile.TemporaryDirectory(prefix="evsel-bench-encode-") as home:
        os.environ["EVSEL_HOME"] = home
        import numpy as np
        import torch
        from evsel.engine import Engine
        from evsel.evaluation.report import run_info
        from evsel.models import encode_pass
        from evsel.models.qrranker import kv as qrranker_kv
        from evsel.models.unreal import selection as unreal
        from evsel.models.selectors import IngestWork, get_selector
        from evsel.models.selectors.base import timed_slices
        from evsel.models.selectors.qrranker import QRRankerSelector
        from evsel.models.selectors.unreal import UnrealSelector
        from evsel.settings import Settings

        text = Path(args.book).read_text(encoding="utf-8")[: args.chars]
        cut = Path(home) / f"{Path(args.book).stem}-first-{args.chars}.txt"
        cut.write_text(text, encoding="utf-8")
        settings = Settings.resolve().with_(qrranker_kv=True, encode=False, no_daemon=True)
        engine = Engine(settings)
        backbone = engine.backbone
        _ = backbone.model
        engine.ingest([str(cut)])
        chunks = engine.store.chunks()
        doc_ids = sorted({c.doc_id for c in chunks})
        tokens = sum(c.n_tokens for c in chunks)
        config = unreal.adapter_config(backbone)
        result: dict = {"run": run_info(["python", "bench/encode.py", *(argv if argv is not None else sys.argv[1:])]),
                        "backbone": backbone.name, "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
                        "load_before": load_1m(), "book": Path(args.book).name, "chars": len(text),
                        "chunks": len(chunks), "chunk_tokens": tokens, "slice_s": args.slice_s,
                        "unreal_layer": config.layer, "kv_format": qrranker_kv.FORMAT}
        kv_root = qrranker_kv.kv_root(Path(home))

        own_key = unreal.state_key(config.layer, config.pool)
        block_key = encode_pass.block_state_key(config.layer, config.pool)

        def reset(arm: str) -> None:
            """No KV files, and none of the states this arm writes (the other arm's stay, unread)."""
            with engine.store.transaction() as conn:
                conn.execute("delete from chunk_states where method = ? and config = ?",
                             [unreal.METHOD, own_key if arm == "separate" else block_key])
            shutil.rmtree(kv_root, ignore_errors=True)

        def separate() -> dict:
            events: list = []
            context = engine.selector_context(events.append)
            work = IngestWork(context, doc_ids, batch=64, slice_s=args.slice_s)
            started = time.perf_counter()
            got = {**UnrealSelector.ingest_work(chunks, work), **QRRankerSelector.ingest_work(chunks, work)}
            return {"seconds": time.perf_counter() - started, "did": got,
                    "slices": sum(1 for e in events if e.get("type") == "progress") - 2}

        def shared() -> dict:
            context = engine.selector_context()
            slices = []
            started = time.perf_counter()  # the selector built inside, as the hooks build theirs
            block_pass = encode_pass.BlockPass(QRRankerSelector(context).scorer, config.layer, config.pool)
            timed_slices(list(chunks), lambda part: block_pass.encode_store(part, context.states), args.slice_s,
                         slices.append, most=64)
            return {"seconds": time.perf_counter() - started, "slices": len(slices) - 1}

        runs = []
        kept: dict = {}
        for round_ in range(args.rounds):
            for arm in (("separate", "shared") if round_ % 2 == 0 else ("shared", "separate")):
                reset(arm)
                got = separate() if arm == "separate" else shared()
                got.update(arm=arm, round=round_, tokens_per_s=tokens / got["seconds"])
                runs.append(got)
                print(f"{arm:9s} {got['seconds']:7.1f} s  {got['tokens_per_s']:6.1f} tokens/s", flush=True)
                folder = Path(home) / f"kept-{arm}"  # the last run of each arm's files, to compare
                shutil.rmtree(folder, ignore_errors=True)
                shutil.copytree(kv_root, folder)
                kept[arm] = folder
        result["runs"] = runs
        for arm in ("separate", "shared"):
            result[f"{arm}_median_s"] = statistics.median(r["seconds"] for r in runs if r["arm"] == arm)
            result[f"{arm}_tokens_per_s"] = tokens / result[f"{arm}_median_s"]
        result["speedup"] = result["separate_median_s"] / result["shared_median_s"]

        # how close: the KV files byte for byte, UNREAL's ranking over own vs block-context states
        names = {p.relative_to(kept["separate"]) for p in kept["separate"].rglob("*.npy")}
        same = sum((kept["separate"] / n).read_bytes() == (kept["shared"] / n).read_bytes()
                   for n in names if (kept["shared"] / n).is_file())
        result["kv_files"] = len(names)
        result["kv_files_identical"] = same
        context = engine.selector_context()
        selector = get_selector("unreal", context)
        own = unreal.chunk_states(backbone, context.states, chunks, config.layer, config.pool)  # stored: read
        shared_states = engine.store.get_states(backbone.fingerprint, unreal.METHOD, block_key,
                                                [c.content_hash for c in chunks])
        block = np.stack([shared_states[c.content_hash] for c in chunks])
        own_keys, block_keys = selector.query.chunk_keys(own), selector.query.chunk_keys(block)
        cosine = torch.nn.functional.cosine_similarity(own_keys, block_keys, dim=-1)
        agreement = []
        for question in QUESTIONS:
            queries = selector.query.encode_question(question, selector.c0(question, chunks))
            a, b = selector.query.score_keys(queries, own_keys), selector.query.score_keys(queries, block_keys)
            rank_a, rank_b = np.argsort(np.argsort(-a)), np.argsort(np.argsort(-b))
            spearman = float(np.corrcoef(rank_a, rank_b)[0, 1])
            top_a, top_b = set(np.argsort(-a)[:10].tolist()), set(np.argsort(-b)[:10].tolist())
            agreement.append({"question": question, "spearman": round(spearman, 4), "top10_shared": len(top_a & top_b)})
        result["unreal_standardized_cosine"] = {"mean": float(cosine.mean()), "min": float(cosine.min())}
        result["unreal_agreement"] = agreement
        result["load_after"] = load_1m()
        print(f"separate {result['separate_tokens_per_s']:.1f} tokens/s, shared {result['shared_tokens_per_s']:.1f} "
              f"tokens/s: {result['speedup']:.2f}x; KV files identical {same}/{len(names)}; UNREAL top 10 shared "
              f"{[a['top10_shared'] for a in agreement]}, Spearman {[a['spearman'] for a in agreement]}", flush=True)
    write_result(Path(args.out), result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
