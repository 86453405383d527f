"""QR-head detection for QRRanker (seed 003, QRHead's QR score): `evsel train qrranker --detect-heads`.

Seed set: questions from training splits only (FairytaleQA train by default; the HippoRAG MuSiQue /
HotpotQA train samples on request), chunked and gold-mapped exactly as `evsel eval` does. LoCoMo
and FairytaleQA val are refused: they report results.

For each question the candidates are its BM25 top-`candidates` chunks of the question's
document (the set the reranker is handed at ask time; a FairytaleQA story of at most 50 chunks is
all of it), in document order so that the questions of one story share one encoding of it;
questions whose gold chunks are not among them are skipped. A head's QR score is the mean over the
seed questions of its calibrated attention mass on the gold candidates (each candidate's mass
trimmed at mean - 2 std, as in scoring), read from one full-depth pass per encoding. The top
`keep` heads per encoding are written to OUT/heads.json with every head's score.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from evsel.errors import InputError

from .unreal import FORBIDDEN, SOURCES

DETECT_SOURCES = SOURCES


def _ignore(_event: dict) -> None:
    pass


@dataclass
class DetectConfig:
    sources: list[str] = field(default_factory=lambda: ["fairytaleqa-train"])
    documents: int = 32  # documents sampled per source (FairytaleQA: stories)
    questions_per_document: int = 3
    max_questions: int | None = None  # over all sources (None: documents x questions_per_document)
    candidates: int = 50  # BM25 top-k of the question's document
    keep: int = 16
    encodings: list[str] = field(default_factory=lambda: ["block", "causal"])
    chunk_tokens: int = 140
    minutes: float | None = None  # stop taking new questions once this much time has passed
    threads: int | None = None
    seed: int = 0


def check_sources(sources: list[str]) -> None:
    for source in sources:
        if source in FORBIDDEN:
            raise InputError(f"refusing to detect heads on {source!r}: {FORBIDDEN[source]}",
                             f"use one of: {', '.join(DETECT_SOURCES)}")
        if source not in DETECT_SOURCES:
            raise InputError(f"unknown seed-set source {source!r}", f"use one of: {', '.join(DETECT_SOURCES)}")


def seed_set(config: DetectConfig, backbone, data_dir: Path | None, on_event=_ignore) -> tuple[list[dict], dict]:
    """The seed questions: [{"id", "question", "texts": candidate texts in document order, "gold":
    indices into texts}], and a description of how they were drawn."""
    from evsel.evaluation.datasets import load_dataset
    from evsel.evaluation.runner import build_corpus, gold_units
    from evsel.models.selectors import SelectorContext, get_selector

    check_sources(config.sources)
    rng = random.Random(config.seed)
    bm25 = get_selector("bm25", SelectorContext(load_backbone=lambda: backbone, states=None))
    items: list[dict] = []
    described: dict = {}
    for source in config.sources:
        name = {"fairytaleqa-train": "fairytaleqa"}.get(source, source)
        dataset = load_dataset(name, data_dir=data_dir, split="train" if name == "fairytaleqa" else None)
        keys = sorted(dataset.loaders)
        rng.shuffle(keys)
        by_doc: dict[str, list] = {}
        for q in dataset.questions:
            if q.docs and q.gold:
                by_doc.setdefault(q.docs[0], []).append(q)
        keys = [k for k in keys if k in by_doc][: config.documents]
        corpus = build_corpus(dataset, keys, backbone, config.chunk_tokens, on_event)
        tally: dict[str, int] = {}
        skipped = {"gold_unresolved": 0, "gold_not_in_candidates": 0}
        taken = 0
        per_doc = config.questions_per_document
        if len(keys) == 1:  # one corpus document (MuSiQue, HotpotQA): draw all the questions from it
            per_doc = config.documents * config.questions_per_document
        for key in keys:
            pool = list(by_doc[key])
            rng.shuffle(pool)
            chunks = corpus.chunks[key]
            got = 0
            for q in pool:
                if got >= per_doc:
                    break
                units = gold_units(q, corpus, tally)
                if not units:
                    skipped["gold_unresolved"] += 1
                    continue
                top = [s.chunk for s in bm25.rank(q.question, chunks, config.candidates)]
                top.sort(key=lambda c: (c.doc_id, c.seq))
                gold_ids = set().union(*units)
                gold = [i for i, c in enumerate(top) if c.id in gold_ids]
                if not gold:
                    skipped["gold_not_in_candidates"] += 1
                    continue
                items.append({"id": f"{source}/{q.qid}", "question": q.question, "texts": [c.text for c in top],
                              "gold": gold})
                got += 1
                taken += 1
        described[source] = {"documents": len(keys), "questions": taken, "gold_mapping": tally, "skipped": skipped}
    if config.max_questions is not None:
        items = items[: config.max_questions]
    return items, described


def detect(config: DetectConfig, backbone, data_dir: Path | None = None, on_event: Callable[[dict], None] = _ignore,
           items: list[dict] | None = None) -> dict:
    """Every head's QR score on the seed set, per encoding; the result (heads.json's content).
    `items` replaces the seed set drawn from `config.sources` (tests)."""
    import torch
    from evsel.models import qrranker as qr

    started = time.perf_counter()
    if config.threads:
        torch.set_num_threads(config.threads)
    described: dict = {"given": len(items)} if items is not None else {}
    if items is None:
        items, described = seed_set(config, backbone, data_dir, on_event)
    if not items:
        raise InputError("the seed set is empty: no question had its gold chunk among its candidates",
                         "use more --documents or another --source")
    for encoding in config.encodings:
        if encoding not in qr.ENCODINGS:
            raise InputError(f"unknown encoding {encoding!r}", f"use {', '.join(qr.ENCODINGS)}")
    model = backbone.model
    n_layers, n_heads = model.config.num_hidden_layers, model.config.num_attention_heads
    totals = {e: np.zeros((n_layers, n_heads)) for e in config.encodings}
    used = 0
    scorers = {e: qr.QRScorer(backbone, None, qr.ScorerConfig(encoding=e, truncate=False)) for e in config.encodings}
    for n, item in enumerate(items):
        if config.minutes is not None and time.perf_counter() - started > config.minutes * 60:
            break
        on_event({"type": "progress", "task": "detect", "label": "QR scores of every head", "done": n,
                  "total": len(items)})
        for encoding, scorer in scorers.items():
            per_head = scorer.all_head_scores(item["question"], item["texts"])  # (N, L, H)
            totals[encoding] += per_head[item["gold"]].sum(axis=0)
        used += 1
    on_event({"type": "progress", "task": "detect", "label": "QR scores of every head", "done": used,
              "total": len(items)})
    by_encoding, scores = {}, {}
    for encoding, total in totals.items():
        mean = total / max(used, 1)
        order = np.argsort(-mean, axis=None, kind="stable")[: config.keep]
        by_encoding[encoding] = [{"layer": int(i // n_heads), "head": int(i % n_heads), "score": round(float(mean.flat[i]), 6)}
                                 for i in order]
        scores[encoding] = np.round(mean, 6).tolist()
    default = qr.DEFAULT_ENCODING if qr.DEFAULT_ENCODING in by_encoding else config.encodings[0]
    return {
        "format": qr.HEADS_FORMAT,
        "backbone": {"name": backbone.name, "fingerprint": backbone.fingerprint, "layers": n_layers,
                     "heads_per_layer": n_heads},
        "layer_index": "0-based (model.layers[i]), as the seed's l-h notation",
        "encoding": default,
        "heads": by_encoding[default],
        "by_encoding": by_encoding,
        "scores": scores,
        "score": "QR score: mean over seed questions of the head's calibrated attention mass on the gold "
                 "candidates (query span minus the null query 'N/A', trimmed at mean - 2 std per candidate)",
        "config": asdict(config),
        "scorer": {e: s.config.to_dict() for e, s in scorers.items()},
        "seed_set": {"sources": described, "questions": used,
                     "candidates": f"BM25 top-{config.candidates} of the question's document, in document order",
                     "question_ids": [item["id"] for item in items[:used]]},
        "seconds": round(time.perf_counter() - started, 1),
    }


def run_detection(engine, out: str, options: dict, command: str | None = None, data_dir: str | None = None,
                  on_event: Callable[[dict], None] = _ignore) -> dict:
    """`evsel train qrranker --detect-heads`: write OUT/heads.json; returns a summary."""
    known = set(DetectConfig.__dataclass_fields__)
    unknown = sorted(set(options) - known)
    if unknown:
        raise InputError(f"unknown detection options {', '.join(unknown)}")
    config = DetectConfig(**{k: v for k, v in options.items() if v is not None})
    result = detect(config, engine.backbone, Path(data_dir) if data_dir else None, on_event)
    result["command"] = command
    out_path = Path(out)
    out_path.mkdir(parents=True, exist_ok=True)
    target = out_path / "heads.json"
    tmp = target.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(target)
    return {"out": str(target), "questions": result["seed_set"]["questions"], "seconds": result["seconds"],
            "encoding": result["encoding"],
            "heads": {e: [f"{h['layer']}-{h['head']}" for h in hs] for e, hs in result["by_encoding"].items()}}
