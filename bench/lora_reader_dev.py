"""The dev split of a LoRA reader run (OUT/examples.json: held-out FairytaleQA train stories, BM25's
top 5 passages) read by readers side by side: each reader's best span's token F1 (as `evsel train
reader` scores dev), and for the LoRA reader how often its no-answer wins.
Usage: python bench/lora_reader_dev.py OUT READER_DIR... > result.json"""

import json
import sys
import time
from pathlib import Path


def main(run: str, readers: list[str]) -> None:
    import torch

    from evsel.evaluation import metrics
    from evsel.models.runtime.backbone import Backbone
    from evsel.models.reader.shipped import reader_for
    from evsel.models.reader.span_head import Reader

    torch.set_num_threads(1)
    backbone = Backbone(device="cpu", threads=1)
    dev = json.loads((Path(run) / "examples.json").read_text())["dev"]
    out = {"run": run, "questions": len(dev), "readers": {}}
    for folder in readers:
        reader = reader_for(backbone, folder)
        started = time.perf_counter()
        f1, null_wins = [], 0
        for item in dev:
            if isinstance(reader, Reader):
                best = reader.read(backbone, item["question"], item["passages"], 1)
            else:
                reading = reader.reading(backbone, item["question"], item["passages"])
                best = reading.top(1)
                null_wins += bool(best) and reading.null_logp > torch.log(torch.tensor(best[0].probability)).item()
            f1.append(metrics.token_f1(best[0].text, item["answers"]) if best else 0.0)
        out["readers"][folder] = {"f1": round(sum(f1) / len(f1), 4), "null_wins": null_wins,
                                  "seconds": round(time.perf_counter() - started, 1)}
        print(folder, out["readers"][folder], file=sys.stderr)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
