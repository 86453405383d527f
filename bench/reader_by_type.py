"""Readers side by side per asked answer type, on a LoRA reader run's held-out examples
(OUT/examples.json: `dev`, held-out FairytaleQA train stories; `calibration`, the held-out LoCoMo
conversation), each question with BM25's top 5 passages: each reader's best span's token F1,
grouped by what the question asks for (evsel.answer.grounding.answer_type). This is the split the
reader routing (docs/ANSWERS.md) is chosen on; no evaluation set is read. With --answer-step, the
F1 of the whole answer step's answer (`ask`'s, that reader forced for every kind) instead of the
best span's.
Usage: python bench/reader_by_type.py [--answer-step] OUT READER_DIR... > result.json"""

import json
import re
import sys
import time
from collections import defaultdict
from pathlib import Path


def _evidence(item: dict) -> list:
    """The example's passages as the answer step takes them (best first); a dialogue's speakers
    from its "Name: ..." lines."""
    from evsel.pipeline import Scored
    from evsel.store.store import ChunkRecord

    out = []
    for rank, text in enumerate(item["passages"], 1):
        speakers = sorted(set(re.findall(r"^\s*([A-Z][\w.' -]{0,40}?):", text, re.M))) if item.get("dialogue") else []
        out.append(Scored(ChunkRecord(id=rank, doc_id=1, seq=rank, text=text, content_hash=str(rank),
                                      n_tokens=len(text.split()), char_start=0, char_end=len(text),
                                      speakers=speakers, title="example"), 1.0, rank))
    return out


def main(run: str, readers: list[str], answer_step: bool = False) -> None:
    import torch

    from evsel.answer.grounding import answer_type
    from evsel.evaluation import metrics
    from evsel.models.runtime.backbone import Backbone
    from evsel.models.reader.shipped import reader_for
    from evsel.models.reader.span_head import Reader

    torch.set_num_threads(1)
    backbone = Backbone(device="cpu", threads=1)
    examples = json.loads((Path(run) / "examples.json").read_text())
    items = [dict(item, split=split) for split in ("dev", "calibration") for item in examples[split]
             if not item.get("unanswerable")]
    out = {"run": run, "questions": len(items), "measure": "answer step F1" if answer_step else "best span F1",
           "readers": {}}
    for folder in readers:
        reader = reader_for(backbone, folder)
        started = time.perf_counter()
        by_group = defaultdict(list)
        for item in items:
            if answer_step:
                from evsel.answer.step import grounded_answer

                found = grounded_answer(backbone, item["question"], _evidence(item), "short", reader_dir=folder)
                by_group[(item["split"], answer_type(item["question"]))].append(
                    metrics.token_f1(found.text, item["answers"]) if found.text else 0.0)
                continue
            if isinstance(reader, Reader):
                best = reader.read(backbone, item["question"], item["passages"], 1)
            else:
                best = reader.reading(backbone, item["question"], item["passages"]).top(1)
            f1 = metrics.token_f1(best[0].text, item["answers"]) if best else 0.0
            by_group[(item["split"], answer_type(item["question"]))].append(f1)
        out["readers"][folder] = {
            "seconds": round(time.perf_counter() - started, 1),
            "groups": {f"{split}:{kind}": {"n": len(v), "f1": round(sum(v) / len(v), 4)}
                       for (split, kind), v in sorted(by_group.items())},
        }
        for part in ("dev", "calibration"):
            values = [f for (split, _), v in by_group.items() if split == part for f in v]
            out["readers"][folder][part] = {"n": len(values), "f1": round(sum(values) / max(1, len(values)), 4)}
        print(folder, json.dumps(out["readers"][folder]), file=sys.stderr)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    flags = [a for a in sys.argv[1:] if a.startswith("--")]
    paths = [a for a in sys.argv[1:] if not a.startswith("--")]
    if set(flags) - {"--answer-step"} or len(paths) < 2:
        sys.exit(__doc__.rsplit("Usage: ", 1)[1])
    main(paths[0], paths[1:], "--answer-step" in flags)
