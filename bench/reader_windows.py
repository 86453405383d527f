"""How much text beside each shown passage the reader should read (evsel/answer/windows.py BESIDE_WORDS),
in one run: answer F1 and the answer step's time, on the held-out novel questions
(bench/questions/sherlock.jsonl, gatsby.jsonl) with BM25's top 5 as `ask` shows them.

    python bench/reader_windows.py --words 0,40,150 --out bench/results/reader-windows.json

The books are ingested into a temporary home (BM25 needs no model states: EVSEL_ENCODE=0), or
--home DIR reuses one that holds them. Settings alternate within each question, so they see the
same machine load; times are medians, with each setting's ratio to the first. One thread (as
bench/run_all.sh runs everything) unless EVSEL_THREADS says otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETS = [ROOT / "bench" / "questions" / "sherlock.jsonl", ROOT / "bench" / "questions" / "gatsby.jsonl"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--words", default="0,40,150", help="BESIDE_WORDS settings, the first is the baseline")
    parser.add_argument("--home", help="an EVSEL_HOME holding the books (default: a temporary one)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "reader-windows.json"))
    args = parser.parse_args()
    settings = [int(w) for w in args.words.split(",")]
    os.environ.setdefault("EVSEL_THREADS", "1")
    questions = [json.loads(line) | {"set": path.stem} for path in SETS for line in path.read_text().splitlines()
                 if line.strip()]
    books = sorted({(path.parent / q["document"]).resolve() for path in SETS for q in
                    (json.loads(line) for line in path.read_text().splitlines() if line.strip())})
    with tempfile.TemporaryDirectory() as scratch:
        home = args.home or scratch
        os.environ["EVSEL_HOME"] = home
        if not args.home:
            for book in books:
                subprocess.run([sys.executable, "-m", "evsel", "--no-daemon", "ingest", str(book)], check=True,
                               env={**os.environ, "EVSEL_ENCODE": "0"}, stdout=subprocess.DEVNULL)
        result = run(questions, settings)
    from bench.common import load_1m, write_result
    from evsel.evaluation.report import run_info

    result.update(run=run_info(sys.argv), load_1m_after=load_1m())
    write_result(Path(args.out), result)
    for row in result["settings"]:
        print(f"words {row['words']:>4}: F1 {row['f1']:.3f}, answer holds the reference {row['contained']}"
              f"/{row['questions']}, in the text read {row['reference_read']}, answer step median "
              f"{row['answer_step_median_s']:.2f}s ({row['time_ratio']:.2f}x)")
    print(f"wrote {args.out}")


def run(questions: list[dict], settings: list[int]) -> dict:
    from evsel.answer import windows
    from evsel.engine import Engine
    from evsel.evaluation.metrics import contained, token_f1
    from evsel.pipeline import Pipeline, PipelineSpec, answer, in_document_order

    engine = Engine()
    chunks = engine.store.chunks()
    pipeline = Pipeline(PipelineSpec.parse("bm25"), engine.selector_context())
    pipeline.load()
    asked = []
    for q in questions:
        book = Path(q["document"]).name
        scope = [c for c in chunks if Path(c.path).name == book]
        ranked, _ = pipeline.rank(q["question"], scope, 5)
        asked.append((q, in_document_order(ranked[:5]), windows.neighbours_of(scope)))
    answer(engine.backbone, asked[0][0]["question"], asked[0][1], 16)  # warm the model
    rows = {w: [] for w in settings}
    default_words = windows.BESIDE_WORDS
    for q, evidence, beside in asked:
        for words in settings:
            windows.BESIDE_WORDS = words  # the setting ask reads with
            read = windows.reading_windows(sorted(evidence, key=lambda s: s.rank), beside)
            started = time.perf_counter()
            out = answer(engine.backbone, q["question"], evidence, 16, beside=beside)
            seconds = time.perf_counter() - started
            text = out["text"] or ""
            rows[words].append({"set": q["set"], "question": q["question"], "reference": q["answer"],
                                "answer": out["text"], "f1": token_f1(text, [q["answer"]]),
                                "contained": contained(text, [q["answer"]]),
                                "reference_shown": any(contained(s.chunk.text, [q["answer"]]) for s in evidence),
                                "reference_read": any(contained(w.text, [q["answer"]]) for w in read),
                                "seconds": seconds})
    windows.BESIDE_WORDS = default_words
    base = statistics.median(r["seconds"] for r in rows[settings[0]])
    summary = []
    for words in settings:
        got = rows[words]
        median = statistics.median(r["seconds"] for r in got)
        summary.append({"words": words, "questions": len(got), "f1": statistics.mean(r["f1"] for r in got),
                        "contained": int(sum(r["contained"] for r in got)),
                        "reference_shown": sum(r["reference_shown"] for r in got),
                        "reference_read": sum(r["reference_read"] for r in got),
                        "right_where_read": int(sum(r["contained"] for r in got if r["reference_read"])),
                        "answer_step_median_s": median, "time_ratio": median / base})
    return {"settings": summary, "per_question": rows, "default_words": default_words}


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
