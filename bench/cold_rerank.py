"""The first `--rerank qrranker` of a process on the Sherlock Holmes book, with the candidates'
block KV files written (as the background encode leaves them), before and after this change's query
pass, alternating in one run. `before`, as up to this change: the question's and the null query's
suffixes as one padded batch (blocksparse.SHARE_LEADING off), over KV heads copied to every query
head (blocksparse.GQA_SDPA off), every head's attention rows built (qrranker.READ_HEADS_ONLY off).
`after`: their shared leading tokens once, then each suffix's own rest, torch's SDPA reading the KV
heads as they are, the selected heads' rows only. Each ask is a fresh engine over the same loaded
model (cold in-memory KV cache: every candidate is read from its file), as bench/qrranker.py
--only ingest-kv asks. (The files are this version's in both arms: reading them is not compared.)

    EVSEL_THREADS=1 python bench/cold_rerank.py [--questions 3] [--rounds 2]

Writes bench/results/cold-rerank.json: per ask the evidence time (the ask's wall time less the
model load) and the rerank stage's, the medians per arm, after/before, and the largest score
difference between the arms (the same candidates, the same files).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
BOOK = ROOT.parent / "shared" / "data" / "nocha" / "books" / "the_adventures_of_sherlock_holmes_arthur_conan_doyle.txt"
QUESTIONS = ["Where did the King of Bohemia meet Irene Adler?", "What was the speckled band?",
             "Who was the man with the twisted lip?", "Who is Irene Adler?",
             "What was the Red-Headed League really for?"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=3, help="how many of the questions (their BM25 top 50s get files)")
    parser.add_argument("--rounds", type=int, default=2, help="asks per question and arm")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "cold-rerank.json"))
    args = parser.parse_args(argv)
    from common import load_1m, write_result

    with tempfile.TemporaryDirectory(prefix="evsel-bench-cold-rerank-") as home:
        os.environ["EVSEL_HOME"] = home
        import numpy as np
        import torch
        from evsel.engine import Engine
        from evsel.evaluation.report import run_info
        from evsel.requests import AskRequest
        from evsel.models.shared import blocksparse
        from evsel.models.qrranker import kv as qrranker_kv
        from evsel.models.qrranker import rerank as qr_model
        from evsel.models.selectors import IngestWork, get_selector
        from evsel.models.selectors.qrranker import QRRankerSelector
        from evsel.settings import Settings

        settings = Settings.resolve().with_(qrranker_kv=True, encode=False, no_daemon=True)
        engine = Engine(settings)
        backbone = engine.backbone
        _ = backbone.model
        questions = QUESTIONS[: args.questions]
        result: dict = {"run": run_info(["python", "bench/cold_rerank.py", *(argv if argv is not None else sys.argv[1:])]),
                        "backbone": backbone.name, "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
                        "load_before": load_1m(), "book": BOOK.name, "questions": questions,
                        "kv_format": qrranker_kv.FORMAT, "kv_bits": list(qrranker_kv.BITS)}
        engine.ingest([str(BOOK)])
        chunks = engine.store.chunks()
        bm25 = get_selector("bm25", engine.selector_context())
        pools = {q: [s.chunk for s in bm25.rank(q, chunks, 50)] for q in questions}
        wanted = list({c.id: c for pool in pools.values() for c in pool}.values())
        t = time.perf_counter()
        work = IngestWork(engine.selector_context(), None, batch=16, slice_s=0.5)
        result["files_written"] = QRRankerSelector(work.context).encode_missing_kv(wanted, work)
        result["files_s"] = time.perf_counter() - t
        files = list((Path(home) / qrranker_kv.FOLDER).rglob("*.npy"))
        result["disk_bytes_per_chunk_token"] = sum(f.stat().st_size for f in files) / sum(c.n_tokens for c in wanted)
        print(f"{len(files)} KV files, {result['disk_bytes_per_chunk_token']:.0f} bytes a chunk token", flush=True)

        def set_arm(after: bool) -> None:
            blocksparse.SHARE_LEADING = blocksparse.GQA_SDPA = qr_model.READ_HEADS_ONLY = after

        def ask(question: str, shared: bool) -> dict:
            set_arm(shared)
            fresh = Engine(settings)  # cold in-memory caches, the model shared
            fresh._backbone = backbone
            started = time.perf_counter()
            got = fresh.ask(AskRequest(question, rerank="qrranker", evidence_only=True))
            wall = time.perf_counter() - started
            timings = got["timings"]
            return {"evidence_s": wall - timings.get("load_s", 0.0), "rerank_s": timings.get("rerank_s"),
                    "top": [e["chunk_id"] for e in got["evidence"]]}

        def scores(question: str, shared: bool):
            set_arm(shared)
            fresh = Engine(settings)
            fresh._backbone = backbone
            return np.array(get_selector("qrranker", fresh.selector_context()).scores(question, pools[question]))

        ask(questions[0], True)  # first-call costs (allocators, kernels) aside
        rows = []
        for round_ in range(args.rounds):
            for question in questions:
                arms = ("before", "after") if round_ % 2 == 0 else ("after", "before")
                row = {"question": question, "round": round_}
                for arm in arms:
                    row[arm] = ask(question, arm == "after")
                rows.append(row)
                print(question, {arm: round(row[arm]["evidence_s"], 3) for arm in ("before", "after")}, flush=True)
        diffs = [float(np.abs(scores(q, True) - scores(q, False)).max()) for q in questions]
        set_arm(True)
        result["asks"] = rows
        for arm in ("before", "after"):
            result[f"{arm}_evidence_median_s"] = statistics.median(r[arm]["evidence_s"] for r in rows)
            result[f"{arm}_rerank_median_s"] = statistics.median(r[arm]["rerank_s"] for r in rows)
        result["after_over_before"] = statistics.median(r["after"]["evidence_s"] / r["before"]["evidence_s"] for r in rows)
        result["same_top"] = all(r["after"]["top"] == r["before"]["top"] for r in rows)
        result["max_score_diff"] = max(diffs)
        result["target_s"] = 2.0
        result["load_after"] = load_1m()
        print(f"first rerank, evidence time: before {result['before_evidence_median_s']:.2f} s, after "
              f"{result['after_evidence_median_s']:.2f} s (after/before {result['after_over_before']:.2f}); "
              f"scores differ by at most {result['max_score_diff']:.2g}", flush=True)
    write_result(Path(args.out), result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
