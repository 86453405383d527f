"""docs/FUSION.md's cross-fold tables, from the records `evsel train hybrid --source DATASET --fold N`
writes (its --json output, saved as bench/results/fusion-xfold-DATASET-fN.json).

    python bench/fusion_tables.py locomo musique hotpotqa

Each record's dev metrics are of the other fold, so the two records of a dataset give both folds
and their mean. Recall is over every gold chunk of the scope (a gold chunk outside the pool is a
miss), which for k <= 10 is the hybrid's own order in `evsel eval` (eval's chunk_recall@k)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
ROWS = [("all", "hybrid (all signals)"), ("no-unreal", "hybrid without UNREAL"), ("no-qr", "hybrid without QR heads"),
        ("no-llm", "hybrid without the LLM (bm25+dense+dialogue)")]
ALONE = [("bm25 alone", "bm25"), ("dense alone", "dense (MiniLM)"), ("unreal alone", "unreal"),
         ("qr alone", "QR heads over the pool")]


def records(dataset: str) -> list[dict]:
    out = []
    for fold in (1, 2):
        data = json.loads((RESULTS / f"fusion-xfold-{dataset}-f{fold}.json").read_text())
        out.append(data.get("result", data))
    return out


def table(dataset: str) -> str:
    runs = records(dataset)
    lines = [f"| {dataset} | R@3 {runs[0]['dev']} | R@3 {runs[1]['dev']} | mean R@1 | mean R@3 | mean R@5 | mean R@10 |",
             "|---|---|---|---|---|---|---|"]

    def row(name: str, metrics: list[dict]) -> str:
        mean = {k: sum(m[k] for m in metrics) / 2 for k in ("recall@1", "recall@3", "recall@5", "recall@10")}
        return (f"| {name} | {metrics[0]['recall@3']:.3f} | {metrics[1]['recall@3']:.3f} | {mean['recall@1']:.3f} | "
                f"**{mean['recall@3']:.3f}** | {mean['recall@5']:.3f} | {mean['recall@10']:.3f} |")

    for key, name in ROWS:
        sets = [next((w for w in r["weight_sets"] if w["name"] == key), None) for r in runs]
        if all(sets):
            lines.append(row(name, [s["dev"] for s in sets]))
    for key, name in ALONE:
        if all(key in r["ablation"] for r in runs):
            lines.append(row(name, [r["ablation"][key] for r in runs]))
    head = (f"{runs[0]['train_questions']} training and {runs[0]['dev_questions']} held-out questions a fold; "
            f"commands: `{runs[0]['command']}`, `{runs[1]['command']}`")
    return head + "\n\n" + "\n".join(lines)


if __name__ == "__main__":
    for name in sys.argv[1:] or ["locomo", "musique", "hotpotqa"]:
        print(f"### {name}\n\n{table(name)}\n")
