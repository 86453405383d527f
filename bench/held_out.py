"""A default candidate's run where no fit looked, against the issue's target: what `evsel train
defaults --held-out FILE` reads (format: docs/FUSION.md, Held-out runs) to keep a kind on BM25
where the target is missed.

    evsel eval fairytaleqa --split val --methods default,bm25,dense,hybrid:bm25+dense --limit 300 \
        --json --per-question > val.json
    python bench/held_out.py val.json --kind book --target bm25+0.03 --out held-out.json

Reads an `evsel eval --json --per-question` result holding `default`, `bm25` and the target's
reference method, and appends to --out (a JSON list) one entry: the headline questions (the
dataset's separately reported groups left out, as eval's own figures do), each method's recall@3
and MRR, the paired sign-flip test of `default` against BM25 on recall@3 (models/fusion/paired.py), how
many questions moved either way, the target and by how much it was met or missed. Several
results (one per novel, with the candidate named, e.g. --candidate hybrid) count as one set:

    python bench/held_out.py anne-hybrid.json anne-bm25.json gatsby-hybrid.json gatsby-bm25.json \
        --candidate hybrid --kind book --target bm25+0.03 --set novels --out held-out.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NO_LLM = "hybrid:bm25+dense"


def headline(record: dict, method: str) -> list[dict]:
    """A method's per-question rows that make eval's headline: not in a separate group, with gold."""
    separate = set(record["dataset"].get("separate_groups") or [])
    return [q for q in record["per_question"][method] if q.get("group") not in separate and q.get("gold")]


def merged(records: list[dict], candidate: str) -> dict:
    """Several `evsel eval --per-question` results (one per book, say) as one: each method's rows
    in order, question ids prefixed by their dataset, `candidate`'s rows named `default`."""
    out = {"dataset": {"name": "+".join(r["dataset"]["name"] for r in records), "separate_groups": []},
           "per_question": {}, "run": records[0].get("run", {})}
    for record in records:
        separate = set(record["dataset"].get("separate_groups") or [])
        for method, rows in record.get("per_question", {}).items():
            name = "default" if method == candidate else method
            out["per_question"].setdefault(name, []).extend(
                dict(q, qid=f"{record['dataset']['name']}:{q['qid']}") for q in rows if q.get("group") not in separate)
    return out


def summarise(record: dict, kind: str, reference: str, margin: float, results: str = "", name: str = "") -> dict:
    import numpy as np

    from evsel.models.fusion import paired

    for method in ("default", "bm25", reference):
        if method not in record.get("per_question", {}):
            raise SystemExit(f"{method} is not in this result: run evsel eval with --methods "
                             f"default,bm25,{reference} --per-question")
    rows = {m: headline(record, m) for m in record["per_question"]}
    ids = [q["qid"] for q in rows["default"]]
    for method, got in rows.items():
        if [q["qid"] for q in got] != ids:
            raise SystemExit(f"{method} was not scored on the same questions as default")

    def column(method: str, metric: str):
        return np.array([q["ranking"][metric] for q in rows[method]], dtype=np.float64)

    candidate, base = column("default", "recall@3"), column("bm25", "recall@3")
    target = float(column(reference, "recall@3").mean()) + margin
    run = record.get("run", {})
    entry = {"kind": kind, "set": name or record["dataset"]["name"], "questions": len(ids),
             "command": run.get("command", ""), "commit": run.get("commit", ""), "results": results}
    for method in rows:
        key = "" if method == "default" else ("no_llm_" if method == NO_LLM else method.replace(":", "_") + "_")
        entry[f"{key}recall@3"] = round(float(column(method, "recall@3").mean()), 4)
        entry[f"{key}mrr"] = round(float(column(method, "mrr").mean()), 4)
    entry.update({
        "p": round(paired.sign_flip_p(candidate, base), 4),
        "test": f"paired sign-flip randomisation, one-sided (models/fusion/paired.py, {paired.RESAMPLES} flips, seed 0)",
        "better": int((candidate > base).sum()), "worse": int((candidate < base).sum()),
        "target": f"recall@3 >= {reference}'s + {margin:g} ({target:.3f})" if margin else
                  f"recall@3 >= {reference}'s ({target:.3f})",
        "met": bool(candidate.mean() >= target - 1e-9),
        "missed_by": round(max(0.0, target - float(candidate.mean())), 4)})
    return entry


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("result", type=Path, nargs="+",
                        help="an evsel eval --json --per-question result; several (one per book) count as one set")
    parser.add_argument("--candidate", default="default",
                        help="the method judged (default: default, as the result names it; e.g. hybrid when the "
                             "runs named the candidate, as results from several runs may)")
    parser.add_argument("--kind", required=True, choices=("dialogue", "book", "pdf"),
                        help="the kind of document whose default this run judges")
    parser.add_argument("--target", required=True, metavar="METHOD[+MARGIN]",
                        help="default's recall@3 must reach this method's plus MARGIN, e.g. bm25+0.04, dense")
    parser.add_argument("--set", default="", help="the set's name in the entry (default: the result's dataset)")
    parser.add_argument("--out", type=Path, help="a JSON list to append the entry to (default: print it)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    reference, _, margin = args.target.partition("+")
    records = [json.loads(path.read_text()) for path in args.result]
    record = records[0] if len(records) == 1 and args.candidate == "default" else merged(records, args.candidate)
    shown = ", ".join(str(p.resolve().relative_to(ROOT)) if p.resolve().is_relative_to(ROOT) else str(p)
                      for p in args.result)
    entry = summarise(record, args.kind, reference, float(margin or 0.0), shown, args.set)
    if args.candidate != "default":  # the method judged (train defaults applies it to that candidate only)
        entry["candidate"] = args.candidate
    print(json.dumps(entry, indent=1))
    if args.out:
        entries = json.loads(args.out.read_text()) if args.out.exists() else []
        entries = [e for e in entries if (e["kind"], e["set"]) != (entry["kind"], entry["set"])] + [entry]
        args.out.write_text(json.dumps(entries, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
