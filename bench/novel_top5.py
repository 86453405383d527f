"""On the held-out novel questions (bench/questions/sherlock.jsonl, gatsby.jsonl): per question and
method, does the top 5 hold the reference answer word for word (evaluation.metrics.shown, the
"answer shown" of evsel eval --generate) and the question's evidence passage? From the chunks and
stored states of a home where both books are ingested (as `ask` finds them); no generation.

    EVSEL_THREADS=1 EVSEL_HOME=DIR python bench/novel_top5.py --methods bm25,default --out FILE.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETS = [ROOT / "bench" / "questions" / "sherlock.jsonl", ROOT / "bench" / "questions" / "gatsby.jsonl"]


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default="bm25,default", help="--select methods, comma-separated")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "novel-top5.json"))
    args = parser.parse_args()
    from evsel.engine import Engine
    from evsel.evaluation.metrics import shown
    from evsel.evaluation.report import run_info
    from evsel.pipeline import Pipeline, PipelineSpec
    from evsel.settings import Settings

    engine = Engine(Settings.resolve())
    chunks = engine.store.chunks()
    methods = [m for m in args.methods.split(",") if m]
    rows: dict[str, list[dict]] = {m: [] for m in methods}
    for method in methods:
        pipeline = Pipeline(PipelineSpec.parse(method), engine.selector_context())
        pipeline.load()
        for path in SETS:
            for line in path.read_text().splitlines():
                if not line.strip():
                    continue
                q = json.loads(line)
                scope = [c for c in chunks if Path(c.path).name == Path(q["document"]).name]
                if not scope:
                    sys.exit(f"{Path(q['document']).name} is not ingested in this EVSEL_HOME")
                started = time.perf_counter()
                ranked, _ = pipeline.rank(q["question"], scope, 5)
                top = [s.chunk.text for s in ranked[:5]]
                rows[method].append({
                    "set": path.stem, "question": q["question"], "answer": q["answer"],
                    "answer_in_top5": shown(top, [q["answer"]]),
                    "evidence_in_top5": any(_flat(e) in _flat(t) for e in q.get("evidence", []) for t in top),
                    "ran": getattr(pipeline.first, "resolved", pipeline.first.name),
                    "seconds": round(time.perf_counter() - started, 3)})
    summary = {m: {s.stem: {"questions": len(r := [x for x in rows[m] if x["set"] == s.stem]),
                            "answer_in_top5": sum(x["answer_in_top5"] for x in r),
                            "evidence_in_top5": sum(x["evidence_in_top5"] for x in r)} for s in SETS}
               for m in methods}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"run": run_info(sys.argv), "summary": summary, "per_question": rows}, indent=1) + "\n")
    for m in methods:
        for s, c in summary[m].items():
            print(f"{m:40s} {s:9s} answer in top 5: {c['answer_in_top5']}/{c['questions']}, "
                  f"evidence passage in top 5: {c['evidence_in_top5']}/{c['questions']}")
    print(f"wrote {out}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
