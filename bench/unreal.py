"""UNREAL speed on this machine: chunk encoding with l_c truncation vs full depth, MaxSim over
10^3..10^5 chunks, and ask latency vs document length (cold: chunks encoded; warm: cached).

    python bench/unreal.py [--out bench/results/unreal.json] [--sizes 16,32,64,128,256,512] [--quick]

Documents are built from the FairytaleQA train stories (their text, chunked by evsel's chunker),
so every chunk is distinct. Cold latency should grow linearly with the number of chunks: each
chunk is encoded on its own, and the query pass does not depend on the document's length.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import load_1m  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench/results/unreal.json")
    parser.add_argument("--sizes", default="16,32,64,128,256,512", help="document lengths in chunks for the ask latency")
    parser.add_argument("--encode-chunks", type=int, default=64, help="chunks for the throughput measurement")
    parser.add_argument("--quick", action="store_true", help="small sizes (a check that the script runs)")
    args = parser.parse_args(argv)

    import tempfile

    import torch

    # A fresh state cache, so that every cold ask really encodes; the dense model copy is shared.
    from evsel.paths import model_cache_dir

    os.environ["EVSEL_MODEL_CACHE"] = str(model_cache_dir())
    os.environ["EVSEL_HOME"] = tempfile.mkdtemp(prefix="evsel-bench-")
    from evsel.engine import Engine
    from evsel.evaluation.datasets import load_dataset
    from evsel.evaluation.report import run_info
    from evsel.evaluation.runner import build_corpus
    from evsel.models.unreal import selection as unreal
    from evsel.models.selectors import get_selector
    from evsel.store.store import ChunkRecord

    sizes = [int(x) for x in args.sizes.split(",")]
    if args.quick:
        sizes, args.encode_chunks = [4, 8], 8
    engine = Engine()
    backbone = engine.backbone
    _ = backbone.model
    selector = get_selector("unreal", engine.selector_context(for_eval=True))
    cfg = selector.adapter.config
    n_layers = backbone.model.config.num_hidden_layers
    dataset = load_dataset("fairytaleqa", split="train")  # 5K+ chunks: every size gets unseen ones
    keys = sorted(dataset.loaders)
    corpus = build_corpus(dataset, keys, backbone, 140)
    pool = [c for k in keys for c in corpus.chunks[k]]
    need = sum(sizes) + args.encode_chunks
    if len(pool) < need:
        raise SystemExit(f"only {len(pool)} chunks available, {need} needed")
    result: dict = {"run": run_info(["python", "bench/unreal.py", *(argv if argv is not None else sys.argv[1:])]),
                    "backbone": backbone.name, "fingerprint": backbone.fingerprint[:16], "device": backbone.plan.device,
                    "dtype": backbone.plan.dtype, "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
                    "layer": cfg.layer, "layers": n_layers}

    # 1. encoding throughput: stop at l_c vs run every layer
    texts = [c.text for c in pool[: args.encode_chunks]]
    throughput = {}
    for label, depth in (("l_c", cfg.layer), ("full", n_layers)):
        encoder = unreal.ChunkEncoder(backbone, [depth], cfg.pool)
        encoder.encode(texts[:4])  # warm-up
        encoder.encoded_tokens, encoder.seconds = 0, 0.0
        load = load_1m()
        encoder.encode(texts)
        throughput[label] = {"depth": depth, "tokens": encoder.encoded_tokens, "seconds": round(encoder.seconds, 2),
                             "tokens_per_s": round(encoder.encoded_tokens / encoder.seconds, 1),
                             "loadavg_1m": round(load, 2)}
        print(f"encode to layer {depth}: {throughput[label]['tokens_per_s']} tokens/s", file=sys.stderr)
    throughput["speedup"] = round(throughput["l_c"]["tokens_per_s"] / throughput["full"]["tokens_per_s"], 2)
    result["encoding"] = throughput

    # 2. MaxSim as the selector runs it (synthetic fp16 states as stored; the cost does not depend
    # on their values): the scope's keys are standardized to fp32 once (kept by the daemon), then
    # every ask scores them
    rng = np.random.default_rng(0)
    d = backbone.model.config.hidden_size
    queries = rng.normal(size=(cfg.groups, d)).astype(np.float32)
    result["maxsim"] = []
    for n in ([1000, 10000] if args.quick else [1000, 10000, 100000]):
        states = rng.normal(size=(n, cfg.pool, d)).astype(np.float16)
        t = time.perf_counter()
        keys = selector.query.chunk_keys(states)
        build = time.perf_counter() - t
        del states
        selector.query.score_keys(queries, keys[:100])
        times = []
        for _ in range(3):
            t = time.perf_counter()
            selector.query.score_keys(queries, keys)
            times.append(time.perf_counter() - t)
        result["maxsim"].append({"chunks": n, "seconds": round(float(np.median(times)), 4),
                                 "keys_build_seconds": round(build, 4)})
        print(f"MaxSim over {n} chunks: {result['maxsim'][-1]['seconds']} s (keys built in {build:.2f} s)",
              file=sys.stderr)
        del keys

    # 3. ask latency vs document length (evidence only: selection is what grows with length)
    question = "What did the king promise the youngest son?"
    rows = []
    offset = args.encode_chunks  # chunks never encoded in this run, so each cold ask is cold
    for size in sizes:
        chunks = [ChunkRecord(**{**c.__dict__, "doc_id": 1000 + size}) for c in pool[offset:offset + size]]
        offset += size
        selector._scope = None
        load = load_1m()
        t = time.perf_counter()
        selector.rank(question, chunks, 5)  # cold: states encoded now
        cold = time.perf_counter() - t
        selector._scope = None
        selector._queries.clear()
        t = time.perf_counter()
        selector.rank(question, chunks, 5)  # warm: states read from the cache, the query pass run again
        warm = time.perf_counter() - t
        tokens = sum(c.n_tokens for c in chunks)
        rows.append({"chunks": size, "tokens": tokens, "cold_s": round(cold, 2), "warm_s": round(warm, 2),
                     "cold_s_per_1k_tokens": round(1000 * cold / tokens, 3), "loadavg_1m": round(load, 2)})
        print(rows[-1], file=sys.stderr)
    result["ask"] = rows
    # linear growth: the cold time per chunk stays flat as documents grow
    if len(rows) >= 2:
        slope, intercept = np.polyfit([r["tokens"] for r in rows], [r["cold_s"] for r in rows], 1)
        fitted = np.polyval([slope, intercept], [r["tokens"] for r in rows])
        ss = float(np.sum((np.array([r["cold_s"] for r in rows]) - fitted) ** 2))
        total = float(np.sum((np.array([r["cold_s"] for r in rows]) - np.mean([r["cold_s"] for r in rows])) ** 2))
        result["cold_linear_fit"] = {"seconds_per_1k_tokens": round(1000 * slope, 3), "intercept_s": round(intercept, 2),
                                     "r2": round(1 - ss / total, 4) if total else None}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
