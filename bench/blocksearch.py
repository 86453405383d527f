"""BlockSearch routing on this machine: warm ask latency against scope size with the chunks' keys
cached, bytes per token of the key cache, and BM25 (index built) on the same scopes in the same run.

    python bench/blocksearch.py [--out bench/results/blocksearch.json] [--sizes 1000,10000,100000] [--quick]

The sample story's chunks are encoded once (block-sparse, up to the routing layer) and their keys
written to a key cache on disk; that encoding is timed (chunks per second) and the files read
back cold. Larger scopes are the story's keys repeated to N chunks (routing cost depends on the
number of key tokens, not on their values; encoding 10^5 real chunks would take hours on this
CPU), held packed in memory as the daemon holds a scope. Per question and size: MaxSim routing
(prefix mode, the fast path), attention-mass routing with and without SSMax, and BM25's scoring
over the same N chunk texts with its index already built (what a warm ask pays for each); each
row gives every routing variant's time as a multiple of BM25's, the time to pack the scope's keys
(once per scope: the daemon memoises it), the load average and the peak memory so far.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import load_1m, peak_rss_mib, write_result  # noqa: E402

QUESTIONS = ["Who killed Ambrose Tenterden?", "What did the keeper find on the stairs?",
             "Where was the knife hidden?", "Who sent the letter?", "What happened to the lamp oil?"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench/results/blocksearch.json")
    parser.add_argument("--sizes", default="1000,3000,10000,30000,100000")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a check that the script runs)")
    args = parser.parse_args(argv)
    sizes = [200, 400] if args.quick else [int(s) for s in args.sizes.split(",")]

    import numpy as np
    import torch
    from evsel.ingest import chunker
    from evsel.store.bm25_index import chunk_tokens, tokenize
    from evsel.engine import Engine
    from evsel.evaluation.report import run_info
    from evsel.models.blocksearch import routing as bs
    from evsel.ingest.parsers import parse_file
    from evsel.paths import sample_story_path
    from evsel.settings import Settings
    from rank_bm25 import BM25Okapi

    engine = Engine(Settings.resolve())
    backbone = engine.backbone
    _ = backbone.model
    doc = parse_file(sample_story_path())[0]
    texts = [c.text for c in chunker.chunk_document(doc, backbone, 140)]
    result: dict = {"run": run_info(["python", "bench/blocksearch.py", *(argv if argv is not None else sys.argv[1:])]),
                    "backbone": backbone.name, "threads": torch.get_num_threads(), "load_before": load_1m()}

    with tempfile.TemporaryDirectory() as store_dir:
        router = bs.BlockSearch(backbone, bs.BlockSearchConfig(), store_dir=store_dir)
        started = time.perf_counter()
        scope = router.scope(texts)
        encode_s = time.perf_counter() - started
        files = list(Path(store_dir).rglob("*.npy"))
        disk = sum(f.stat().st_size for f in files)
        started = time.perf_counter()
        bs.BlockSearch(backbone, bs.BlockSearchConfig(), store_dir=store_dir).scope(texts)  # cold read, no encode
        read_s = time.perf_counter() - started
        tokens = scope.packed.tokens
        result["cache"] = {"layer": router.layer, "chunks": len(texts), "key_tokens": tokens,
                           "bytes_per_token_keys": router.bytes_per_token, "disk_bytes": disk,
                           "disk_bytes_per_token": disk / tokens, "encode_s": encode_s,
                           "encode_chunks_per_s": len(texts) / encode_s, "read_s": read_s,
                           "disk_per_million_tokens_mb": disk / tokens * 1e6 / 2 ** 20}
        print(json.dumps(result["cache"]), flush=True)

        keys = [scope.packed.keys[:, int(a):int(b)] for a, b in zip(scope.packed.offsets[:-1], scope.packed.offsets[1:])]
        start = len(router.separator)
        seed = {"variant": "maxsim", "query_tokens": "last", "calibrate": False, "heads": "all"}
        variants = {"maxsim": bs.BlockSearchConfig(**seed), "mass": bs.BlockSearchConfig(**{**seed, "variant": "mass"}),
                    "mass+ssmax": bs.BlockSearchConfig(**{**seed, "variant": "mass"}, ssmax=True),
                    "heads (default)": bs.BlockSearchConfig()}
        routers = {name: bs.BlockSearch(backbone, cfg) for name, cfg in variants.items()}
        for r in routers.values():  # query vectors computed ahead: a warm daemon has them per question
            for q in QUESTIONS:
                r.prefix_query(q)
        rows = []
        for n in sizes:
            picked = [i % len(keys) for i in range(n)]
            started = time.perf_counter()
            packed = bs.pack([keys[i] for i in picked], start)
            pack_s = time.perf_counter() - started
            big = bs.Scope([f"{i}" for i in range(n)], [scope.blocks[i] for i in picked], packed)
            corpus = [chunk_tokens(texts[i]) for i in picked]
            index = BM25Okapi(corpus)
            row = {"chunks": n, "key_tokens": packed.tokens, "keys_mb": packed.keys.numel() * 2 / 2 ** 20,
                   "pack_s": pack_s}
            for name, r in routers.items():
                times = []
                for q in QUESTIONS:
                    t = time.perf_counter()
                    r.route(q, big)
                    times.append(time.perf_counter() - t)
                row[f"{name}_s"] = statistics.median(times)
            times = []
            for q in QUESTIONS:
                t = time.perf_counter()
                np.argsort(-index.get_scores(tokenize(q)))
                times.append(time.perf_counter() - t)
            row["bm25_s"] = statistics.median(times)
            for name in routers:
                row[f"{name}_over_bm25"] = row[f"{name}_s"] / row["bm25_s"]
            row.update(load=load_1m(), peak_rss_mib=peak_rss_mib())
            rows.append(row)
            print(json.dumps(row), flush=True)
        result["scaling"] = rows
    result["load_after"] = load_1m()
    out = Path(args.out)
    write_result(out, result)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
