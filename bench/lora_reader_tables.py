"""docs/ANSWERS.md's LoRA reader tables from bench/lora_reader.sh's files: per set and answer step,
F1 (LoCoMo's own F1 on LoCoMo), right when held (the answer contains the reference, of the questions whose shown evidence
holds it), and the printed answers' precision (right: contains the reference; an adversarial
LoCoMo question's printed answer is wrong) with the share of questions answered; where the records
carry the reader's confidence, also the precision had only the surest half been printed (the best a
threshold could do on that set, chosen on it: an upper bound, not a shipped setting)."""

import json
import sys
from pathlib import Path


def rows(path: Path):
    result = json.loads(path.read_text())
    for name, records in result["per_question"].items():
        style = name.split("[", 1)[-1].rstrip("]")
        step = "shipped readers" if style == "short" else "rules step" if style == "rules" \
            else f"{Path(style.partition('@')[2]).name} everywhere"
        n = len(records)
        score = lambda r: r.get("scores", {}).get("locomo_f1", r.get("scores", {}).get("f1", 0.0))  # noqa: E731
        f1 = sum(score(r) for r in records) / max(1, n)
        held = [r for r in records if r.get("answer_shown")]
        right_held = sum(r.get("scores", {}).get("contained", 0.0) >= 1.0 for r in held)
        printed = [r for r in records if r.get("answer_kind") != "abstained"]
        right = [r for r in printed if r.get("group") != "adversarial" and r.get("scores", {}).get("contained", 0.0) >= 1.0]
        answerable = [r for r in records if r.get("group") != "adversarial"]
        is_right = lambda r: r.get("group") != "adversarial" and r.get("scores", {}).get("contained", 0.0) >= 1.0  # noqa: E731
        sure = sorted((r for r in printed if r.get("confidence") is not None), key=lambda r: -r["confidence"])
        half = sure[: (n + 1) // 2] if len(sure) >= (n + 1) // 2 else []
        f1_answerable = sum(score(r) for r in answerable) / max(1, len(answerable))
        yield {"set": path.stem.replace("lora-reader-", "").replace("readers-", ""), "step": step, "questions": n, "f1": f1,
               "f1_answerable": f1_answerable, "answerable": len(answerable), "held": len(held),
               "right_held": right_held, "printed": len(printed), "precision": len(right) / max(1, len(printed)),
               "surest_half": sum(map(is_right, half)) / len(half) if half else None,
               "commit": result.get("run", {}).get("commit")}


def main(paths: list[str]) -> None:
    print("| set | answer step | questions | F1 | F1 answerable | right when held | printed | precision of printed "
          "| precision of the surest half |")
    print("|---|---|---|---|---|---|---|---|---|")
    total: dict = {}
    for path in paths:
        for r in rows(Path(path)):
            print(f"| {r['set']} | {r['step']} | {r['questions']} | {r['f1']:.3f} | {r['f1_answerable']:.3f} "
                  f"({r['answerable']}) | {r['right_held']}/{r['held']} | {r['printed']}/{r['questions']} | "
                  f"{r['precision']:.2f} | {'' if r['surest_half'] is None else format(r['surest_half'], '.2f')} |")
            if r["set"] in ("sherlock", "gatsby", "anne", "little_women"):
                t = total.setdefault(r["step"], [0, 0])
                t[0] += r["right_held"]
                t[1] += r["held"]
    for step, (right, held) in total.items():
        print(f"novels, all books, {step}: right when held {right}/{held} = {right / max(1, held):.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
