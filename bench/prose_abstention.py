"""Could the LoRA reader abstain in prose? On a LoRA run's dev split (OUT/examples.json: held-out
FairytaleQA train stories, BM25's top 5), each question is read twice: with its own passages, and
with up to five passages of other questions of its story that hold none of its answer's words (near
misses: unanswerable). The gap between the reader's no-answer and its best span orders the readings;
for each share answered, the margin and the precision of the printed answers (right: every content
word of the reference in the answer); the smallest margins that still print a given share of the
right answers (`keep_right`), and the one the prose answer step ships (`shipped`: the smallest that
prints every right answer of the dev split; a margin that answers only half the readings abstained
on the quickstart's own question, docs/ANSWERS.md).
Usage: python bench/prose_abstention.py OUT READER_DIR > result.json"""

import json
import math
import sys
from collections import defaultdict
from pathlib import Path


KEEP_RIGHT_SHARES = (0.8, 0.9, 0.95, 1.0)  # the smallest margins printing these shares of the right answers
SHIPPED_KEEP_RIGHT = 1.0  # the shipped margin prints every right answer of the dev split


def near_misses(item: dict, story: list[dict]) -> list[str]:
    """Up to five passages of the story's other questions that hold none of `item`'s answer words."""
    from evsel.answer import grounding

    wanted = {w for answer in item["answers"] for w in grounding.content_words(answer)}
    out = []
    for other in story:
        for passage in other["passages"] if other is not item else ():
            if passage not in out and passage not in item["passages"] and \
                    not (wanted and wanted <= set(grounding.words(passage))):
                out.append(passage)
    return out[:5]


def main(run: str, reader_dir: str) -> None:
    import torch

    from evsel.answer import grounding
    from evsel.models.reader.shipped import reader_for
    from evsel.models.runtime.backbone import Backbone

    torch.set_num_threads(1)
    dev = json.loads((Path(run) / "examples.json").read_text())["dev"]
    stories = defaultdict(list)
    for item in dev:
        stories[item["id"].rsplit("/", 1)[0]].append(item)
    backbone = Backbone(device="cpu", threads=1)
    reader = reader_for(backbone, reader_dir)
    rows = []  # (gap, unanswerable, right)
    for item in dev:
        story = stories[item["id"].rsplit("/", 1)[0]]
        for passages, unanswerable in ((item["passages"], False), (near_misses(item, story), True)):
            if not passages:
                continue
            reading = reader.reading(backbone, item["question"], passages)
            top = [f for f in reading.top(20) if not grounding.echoes(item["question"], f.text)]
            if top:
                right = not unanswerable and grounding.contained(top[0].text, item["answers"][0])
                rows.append((reading.null_logp - math.log(top[0].probability), unanswerable, right))
    rows.sort()
    out = {"run": run, "reader": reader_dir, "readings": len(rows), "unanswerable": sum(r[1] for r in rows),
           "right": sum(r[2] for r in rows), "by_share": []}
    for share in (0.3, 0.5, 0.7, 0.9, 1.0):
        kept = rows[:int(len(rows) * share)]
        out["by_share"].append({"answered": share, "margin": round(kept[-1][0], 3), "printed": len(kept),
                                "precision": round(sum(r[2] for r in kept) / len(kept), 3),
                                "unanswerable_printed": sum(r[1] for r in kept)})
    out["shipped"] = keeping(rows, SHIPPED_KEEP_RIGHT)
    out["keep_right"] = [keeping(rows, share) for share in KEEP_RIGHT_SHARES]
    out["gaps"] = [[round(gap, 4), unanswerable, right] for gap, unanswerable, right in rows]
    print(json.dumps(out, indent=1))


def keeping(rows: list[tuple], share: float) -> dict:
    """The smallest margin that still prints `share` of the right answers, and what it prints."""
    gaps = sorted(r[0] for r in rows if r[2])
    margin = gaps[min(len(gaps) - 1, math.ceil(share * len(gaps)) - 1)]
    kept = [r for r in rows if r[0] <= margin]
    return {"share_of_right": share, "margin": round(margin, 3), "printed": len(kept),
            "answered": round(len(kept) / len(rows), 3), "precision": round(sum(r[2] for r in kept) / len(kept), 3),
            "right_printed": sum(r[2] for r in kept), "unanswerable_printed": sum(r[1] for r in kept)}


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
