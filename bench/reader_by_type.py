"""Readers side by side per asked answer type, on a LoRA reader run's held-out examples
(OUT/examples.json: `dev`, held-out FairytaleQA train stories; `calibration`, the held-out LoCoMo
conversation), each question with BM25's top 5 passages: each reader's best span's token F1,
grouped by what the question asks for (evsel.answer.grounding.answer_type). This is the split the
reader routing (docs/ANSWERS.md) is chosen on; no evaluation set is read.
Usage: python bench/reader_by_type.py OUT READER_DIR... > result.json"""

import json
import sys
import time
from collections import defaultdict
from pathlib import Path


def main(run: str, readers: list[str]) -> None:
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
    out = {"run": run, "questions": len(items), "readers": {}}
    for folder in readers:
        reader = reader_for(backbone, folder)
        started = time.perf_counter()
        by_group = defaultdict(list)
        for item in items:
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
        print(folder, json.dumps(out["readers"][folder]), file=sys.stderr)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
