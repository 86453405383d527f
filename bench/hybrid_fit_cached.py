"""Fit the hybrid's weight sets from an `evsel train hybrid` feature cache alone, holding out every
4th story (sorted) of the cached FairytaleQA train questions as dev: what shipped when the full
extraction did not fit the time on a shared 2-core machine (docs/FUSION.md).

    python bench/hybrid_fit_cached.py FEATURES.jsonl OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from evsel.models.selectors import hybrid as hy
from evsel.recipes import hybrid as rc


def main(features: str, out: str) -> None:
    rows = [json.loads(line) for line in Path(features).read_text().splitlines()]
    stories = sorted({r["id"].split("/")[0] for r in rows})
    dev_stories = set(stories[::4])
    train = [r for r in rows if r["id"].split("/")[0] not in dev_stories]
    dev = [r for r in rows if r["id"].split("/")[0] in dev_stories]
    available = rows[0]["groups"]
    sets, ablation = rc.fit_sets(train, dev, available)
    best, bm25 = sets[0]["dev"], next(s for s in sets if s["name"] == "bm25")["dev"]
    better = best["recall@3"] >= bm25["recall@3"] + rc.MARGIN
    default = {"method": "hybrid" if better else "bm25",
               "why": (f"dev recall@3 {best['recall@3']:.3f} (hybrid) vs {bm25['recall@3']:.3f} (bm25) on {len(dev)} "
                       f"held-out FairytaleQA train questions: "
                       + ("the hybrid is better" if better else f"the hybrid is not better by {rc.MARGIN}, so BM25"))}
    summary = {"source": "fairytaleqa-train", "dev": "fairytaleqa-train (every 4th cached story)",
               "train_questions": len(train), "dev_questions": len(dev), "available": available,
               "pool_each": hy.POOL_EACH, "weight_sets": sets, "ablation": ablation, "default": default,
               "command": "python " + " ".join(sys.argv)}
    hy.save_weights(Path(out) / hy.WEIGHTS_FILE, summary)
    print(json.dumps({k: summary[k] for k in ("train_questions", "dev_questions", "default")}, indent=1))
    for ws in sets:
        print(ws["name"], {k: round(v, 3) for k, v in ws["dev"].items()}, [round(w, 2) for w in ws["weights"]])
    for name, m in ablation.items():
        print(name, {k: round(v, 3) for k, v in m.items()})


if __name__ == "__main__":
    main(*sys.argv[1:3])
