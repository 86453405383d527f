"""Answer shown in the top 5, from retrieval-only `evsel eval --json --per-question` runs.

`evsel eval` reports `answer_shown` (does a shown passage hold the reference answer word for
word, after SQuAD normalisation: evaluation.metrics.shown) only with --generate. For the
retrieval-only runs in this folder it is recomputed here: the documents are chunked again exactly
as the eval chunks them (evaluation.runner.build_corpus, the backbone's tokenizer, the run's
--chunk-tokens), and each question's top-5 chunk ids (its `top` list) are looked up.

    .venv/bin/python bench/results/novels/answer_shown.py bench/results/novels/eval-*-retrieval.json
"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def main(paths):
    from evsel.engine import Engine
    from evsel.evaluation.datasets import load_dataset
    from evsel.evaluation.metrics import shown
    from evsel.evaluation.runner import build_corpus
    from evsel.settings import Settings

    engine = Engine(Settings.resolve())
    summary = {}
    for path in paths:
        result = json.loads(Path(path).read_text())
        data = load_dataset(str(ROOT / result["dataset"]["source"]))
        questions = {q.qid: q for q in data.questions}
        keys = list(dict.fromkeys(k for q in data.questions for k in q.docs))
        corpus = build_corpus(data, keys, engine.backbone, result["config"]["chunk_tokens"])
        text = {c.id: c.text for k in keys for c in corpus.chunks[k]}
        book = result["dataset"]["name"]
        for method, records in result["per_question"].items():
            rows = []
            for r in records:
                q = questions[r["qid"]]
                top5 = [text[i] for i in r["top"][:5]]
                rows.append({"qid": r["qid"], "question": q.question, "answer": q.answers,
                             "answer_in_top5": shown(top5, q.answers),
                             "evidence_in_top5": r["ranking"]["chunk_recall@5"] > 0})
            summary.setdefault(method, {})[book] = {
                "questions": len(rows),
                "answer_in_top5": sum(r["answer_in_top5"] for r in rows),
                "evidence_in_top5": sum(r["evidence_in_top5"] for r in rows),
                "chunk_recall@5": result["methods"][method]["chunk_recall@5"],
                "per_question": rows}
    return summary


if __name__ == "__main__":
    out = main(sys.argv[1:])
    for method, books in out.items():
        for book, s in books.items():
            print(f"{method:32s} {book:14s} answer_in_top5 {s['answer_in_top5']:2d}/{s['questions']}"
                  f"  evidence_in_top5 {s['evidence_in_top5']:2d}/{s['questions']}"
                  f"  chunk_recall@5 {s['chunk_recall@5']:.3f}")
    Path(__file__).with_name("answer-shown-top5.json").write_text(json.dumps(out, indent=1, ensure_ascii=False))
