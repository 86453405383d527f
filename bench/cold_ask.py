"""A cold `evsel --no-daemon ask --evidence-only` per method, alternating in one run: the whole
process and the selection's own time (the reply's timings), on a book already ingested and encoded.

    python bench/cold_ask.py --home DIR --doc 1 --methods hybrid,bm25 --out bench/results/cold-ask.json

DIR is an EVSEL_HOME holding the book with its background work done (bench/daemon.py --versus
--home DIR leaves one). Each process imports, loads what the method needs (the model for the
LLM's signals; BM25 loads none), reads the chunks and ranks; one thread unless OMP_NUM_THREADS
says otherwise, as bench/daemon.py runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUESTIONS = ["Where did the King of Bohemia meet Irene Adler?", "What was the speckled band?",
             "Who was the man with the twisted lip?"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", type=Path, required=True, help="EVSEL_HOME with the book ingested and encoded")
    parser.add_argument("--doc", default="1", help="the book's document id there")
    parser.add_argument("--methods", default="hybrid,bm25", help="comma-separated --select methods")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "cold-ask.json")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "bench"))
    from common import write_result

    from evsel.evaluation.report import run_info

    env = dict(os.environ, EVSEL_HOME=str(args.home))
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("EVSEL_THREADS", env["OMP_NUM_THREADS"])
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    runs: dict[str, list[dict]] = {m: [] for m in methods}
    for question in QUESTIONS:
        for method in methods:
            started = time.perf_counter()
            result = subprocess.run([sys.executable, "-m", "evsel", "--no-daemon", "ask", question, "--doc", args.doc,
                                     "--select", method, "--evidence-only", "--json"],
                                    capture_output=True, text=True, env=env)
            wall = time.perf_counter() - started
            if result.returncode != 0:
                raise SystemExit(f"evsel ask --select {method} failed: {result.stderr.strip()}")
            reply = json.loads(result.stdout)
            timings = reply["timings"]
            runs[method].append({"question": question, "wall_s": round(wall, 3), "ran": reply["method"]["select"],
                                 "timings": timings})
            print(f"{method:24s} cold {wall:6.2f}s  select {timings.get('select_s', 0):.2f}s  "
                  f"load {timings.get('load_s', 0):.2f}s  {question}", flush=True)
    summary = {m: {"wall_median_s": round(statistics.median(r["wall_s"] for r in rows), 3),
                   "select_median_s": round(statistics.median(r["timings"].get("select_s", 0.0) for r in rows), 3),
                   "load_median_s": round(statistics.median(r["timings"].get("load_s", 0.0) for r in rows), 3)}
               for m, rows in runs.items()}
    for method, row in summary.items():
        print(f"{method}: whole process {row['wall_median_s']:.2f}s, selection {row['select_median_s']:.2f}s, "
              f"model load {row['load_median_s']:.2f}s (medians)")
    write_result(args.out, {"run": run_info(["python", "bench/cold_ask.py", *sys.argv[1:]]), "home": str(args.home),
                            "omp_num_threads": env["OMP_NUM_THREADS"], "cold": summary, "runs": runs})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
