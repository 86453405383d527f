"""Which layer should UNREAL read chunk states from? A sweep on FairytaleQA val with cached states.

For each candidate layer l: chunk states at l (L_p=7, cached), and the question encoded the same
way (its tokens mean-pooled into G=4 segments), scored by MaxSim: the untrained "residual MaxSim"
signal of each layer, with and without per-dimension standardization. The intrinsic q.k selector
(paper A.2.1) is swept per layer on the same questions. BM25 and random are the references.
recall@k counts gold units (sections) with a chunk in the top k, as `evsel eval` does.

    python bench/unreal_layers.py --out bench/results/unreal_layers.json [--limit N]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default="8,12,16,20,24,28")
    parser.add_argument("--intrinsic-layers", default="1-30")
    parser.add_argument("--limit", type=int, default=None, help="questions (evenly spaced)")
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--out", default="bench/results/unreal_layers.json")
    args = parser.parse_args(argv)

    from evsel.engine import Engine
    from evsel.evaluation.datasets import load_dataset
    from evsel.evaluation.metrics import ranking_metrics
    from evsel.evaluation.runner import build_corpus, gold_units, select_questions
    from evsel.models.unreal import selection as unreal
    from evsel.models.selectors import get_selector

    def parse(spec):
        out = []
        for part in spec.split(","):
            lo, _, hi = part.partition("-")
            out += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
        return out

    layers = parse(args.layers)
    intrinsic_layers = parse(args.intrinsic_layers)
    engine = Engine()
    dataset = load_dataset("fairytaleqa", split="val")
    questions = select_questions(dataset.questions, args.limit)
    keys = list(dict.fromkeys(k for q in questions for k in q.docs))
    corpus = build_corpus(dataset, keys, engine.backbone, 140)
    tally: dict = {}
    units = {q.qid: gold_units(q, corpus, tally) for q in questions}
    questions = [q for q in questions if units[q.qid]]
    chunks = [c for k in keys for c in corpus.chunks[k]]
    row = {c.id: i for i, c in enumerate(chunks)}
    print(f"{len(questions)} questions, {len(keys)} stories, {len(chunks)} chunks", file=sys.stderr)

    def evaluate(score_fn) -> dict:
        results = []
        for q in questions:
            scope = corpus.scope(q.docs)
            s = np.asarray(score_fn(q, scope), dtype=np.float64)
            ranked = [scope[i].id for i in np.argsort(-s, kind="stable")]
            results.append(ranking_metrics(ranked, units[q.qid], [1, args.k]))
        return {key: round(float(np.mean([r[key] for r in results])), 4) for key in results[0]}

    table: dict = {"questions": len(questions), "chunks": len(chunks), "k": args.k, "rows": []}
    bm25 = get_selector("bm25", engine.selector_context(for_eval=True))
    table["rows"].append({"method": "bm25", **evaluate(lambda q, scope: bm25.scores(q.question, scope))})
    rng = random.Random(0)
    table["rows"].append({"method": "random", **evaluate(lambda q, scope: [rng.random() for _ in scope])})
    print(table["rows"], file=sys.stderr)

    t = time.perf_counter()
    states = {layer: unreal.chunk_states(engine.backbone, engine.states, chunks, layer, 7, extra_layers=layers) for layer in layers}
    table["encode_s"] = round(time.perf_counter() - t, 1)
    encoder = unreal.ChunkEncoder(engine.backbone, layers, pool=4)
    qstates = encoder.encode([q.question for q in questions])  # {layer: (Q, 4, d)}
    qrow = {q.qid: i for i, q in enumerate(questions)}
    for layer in layers:
        k_all = states[layer].astype(np.float32)  # (N, 7, d)
        mean = k_all.reshape(-1, k_all.shape[-1]).mean(0)
        std = k_all.reshape(-1, k_all.shape[-1]).std(0) + 1e-6
        for standardize in (False, True):
            def score(q, scope, layer=layer, standardize=standardize, mean=mean, std=std, k_all=k_all):
                keys_ = k_all[[row[c.id] for c in scope]]
                query = qstates[layer][qrow[q.qid]].astype(np.float32)
                if standardize:
                    keys_, query = (keys_ - mean) / std, (query - mean) / std
                return np.einsum("npd,gd->ngp", keys_, query).max(-1).sum(-1)

            name = f"residual-maxsim l={layer}" + (" std" if standardize else "")
            table["rows"].append({"method": name, "layer": layer, "standardize": standardize, **evaluate(score)})
            print(table["rows"][-1], file=sys.stderr)

    t = time.perf_counter()
    intrinsic = unreal.IntrinsicEncoder(engine.backbone, intrinsic_layers)
    ikeys = unreal.intrinsic_states(engine.backbone, engine.states, chunks, intrinsic_layers)
    iq = intrinsic.queries([q.question for q in questions])
    table["intrinsic_encode_s"] = round(time.perf_counter() - t, 1)
    per_layer = {}
    for q in questions:
        scope = corpus.scope(q.docs)
        per_layer[q.qid] = intrinsic.layer_scores(iq[qrow[q.qid]], ikeys[[row[c.id] for c in scope]])
    for index, layer in enumerate(intrinsic_layers):
        result = evaluate(lambda q, scope, index=index: per_layer[q.qid][:, index])
        table["rows"].append({"method": f"intrinsic l={layer}", "layer": layer, **result})
        print(table["rows"][-1], file=sys.stderr)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(table, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
