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

from .common import (AdapterTrainer, check_sources, config_of, folded_dataset, ignore_event, pick_recipe,
                     question_groups)


@dataclass
class DetectConfig:
    sources: list[str] = field(default_factory=lambda: ["fairytaleqa-train"])
    fold: int | None = None  # the fold of LoCoMo / MuSiQue / HotpotQA drawn from (required for them)
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


def seed_set(config: DetectConfig, backbone, data_dir: Path | None, on_event=ignore_event) -> tuple[list[dict], dict]:
    """The seed questions: [{"id", "question", "texts": candidate texts in document order, "gold":
    indices into texts}], and a description of how they were drawn."""
    from evsel.evaluation.runner import build_corpus, gold_units
    from evsel.models.selectors import SelectorContext, get_selector

    check_sources(config.sources, config.fold, "detect heads")
    rng = random.Random(config.seed)
    bm25 = get_selector("bm25", SelectorContext(load_backbone=lambda: backbone, states=None))
    items: list[dict] = []
    described: dict = {}
    for source in config.sources:
        dataset = folded_dataset(source, data_dir, config.fold)
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


def detect(config: DetectConfig, backbone, data_dir: Path | None = None,
           on_event: Callable[[dict], None] = ignore_event,
           items: list[dict] | None = None) -> dict:
    """Every head's QR score on the seed set, per encoding; the result (heads.json's content).
    `items` replaces the seed set drawn from `config.sources` (tests)."""
    import torch
    from evsel.models.qrranker import rerank as qr

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
                  on_event: Callable[[dict], None] = ignore_event) -> dict:
    """`evsel train qrranker --detect-heads`: write OUT/heads.json; returns a summary."""
    known = set(DetectConfig.__dataclass_fields__)
    unknown = sorted(set(options) - known)
    if unknown:
        raise InputError(f"unknown detection options {', '.join(unknown)}")
    config = DetectConfig(**{k: v for k, v in options.items() if v is not None})
    check_sources(config.sources, config.fold, "detect heads")  # before the backbone loads
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


# ---------------------------------------------------------------------------------------------
# training: `evsel train qrranker` (a LoRA adapter on the read layers' q/k, for reranking only)


@dataclass
class TrainConfig:
    out: str = ""  # run folder: adapter + heads.json + metrics (the best by dev recall), checkpoint/, log.jsonl
    sources: list[str] = field(default_factory=lambda: ["fairytaleqa-train"])
    fold: int | None = None  # LoCoMo / MuSiQue / HotpotQA: train on this fold only (dev from it too)
    stories: int = 24  # FairytaleQA train stories trained on (documents per other source)
    dev_stories: int = 8  # FairytaleQA train stories held out for the dev recall log (never val)
    questions_per_story: int = 6
    dev_questions_per_story: int = 4
    candidates: int = 50  # K: the question's BM25 top-K of its document is the listwise instance
    heads: str | None = None  # a head list or heads.json (default: the list shipped for the backbone)
    encoding: str = "block"
    rank: int = 8
    alpha: float = 16.0
    batch: int = 4  # questions per optimizer step
    steps: int = 100
    minutes: float | None = None  # stop after this much wall time (per invocation; a rerun resumes)
    lr: float = 1e-3
    warmup: int = 10
    weight_decay: float = 0.0
    clip: float = 1.0
    dev_every: int = 20
    checkpoint_every: int = 10
    k: int = 3  # dev recall@k picks the adapter written to OUT
    chunk_tokens: int = 140
    threads: int | None = None
    seed: int = 0


# smoke: minutes on a CPU, proves the path (2 stories, K=12); full: the CPU run of docs/QRRANKER.md
SMOKE = {"stories": 2, "dev_stories": 1, "questions_per_story": 2, "dev_questions_per_story": 3, "candidates": 12,
         "steps": 4, "batch": 2, "dev_every": 2, "checkpoint_every": 2, "warmup": 1, "lr": 2e-3}
FULL = {"stories": 24, "dev_stories": 8, "questions_per_story": 6, "dev_questions_per_story": 4, "candidates": 50,
        "steps": 100, "batch": 4, "dev_every": 20, "checkpoint_every": 10, "warmup": 10, "lr": 1e-3}


def train_recipe(name: str) -> dict:
    return pick_recipe(name, SMOKE, FULL)


def _detection_stories(heads_data: dict | None) -> set[str]:
    """Question ids of the head list's seed set (so dev stories can avoid them)."""
    ids = ((heads_data or {}).get("seed_set") or {}).get("question_ids") or []
    return {i.split("/", 1)[1] for i in ids if i.startswith("fairytaleqa-train/")}


class ListwiseTrainer(AdapterTrainer):
    """One run: features of every instance once (the frozen backbone, no gradients; block
    encoding, so a story's chunks are encoded once for all its questions), then AdamW steps on the
    adapter alone (recipes/common.py's loop). Resumes from OUT/checkpoint."""

    log_nested = True

    @property
    def selection_key(self) -> str:
        return f"recall@{self.config.k}"

    # setup
    def setup(self, train: list[dict], dev: list[dict], heads: list[tuple[int, int]], heads_data: dict | None,
              described: dict | None = None) -> None:
        import torch
        from evsel.models.qrranker import rerank as qr
        from evsel.models.shared.blocksparse import BlockStateCache

        cfg = self.config
        if cfg.encoding != "block":
            raise InputError("training reads block-encoded candidates", "use --encoding block (the default)")
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        self.heads, self.heads_data, self.described = list(heads), heads_data, described or {}
        self.train = [(g, q) for g in train for q in g["questions"]]
        self.dev = [(g, q) for g in dev for q in g["questions"]]
        if not self.train:
            raise InputError("no training questions had a gold chunk among their candidates",
                             "use more --stories or a larger --candidates")
        model = self.backbone.model
        state = self.start_or_resume(lambda folder: qr.load_adapter(folder, model),
                                     lambda: qr.new_adapter(model, self.heads, cfg.rank, cfg.alpha, cfg.encoding,
                                                            cfg.seed))
        if state is not None:
            if state.get("asked_steps") == cfg.steps:
                self.total_steps = state["total_steps"]
            if [list(h) for h in self.heads] != self.adapter.config.heads:
                raise InputError(f"{self.out / 'checkpoint'} was trained with other heads",
                                 "use another --out or the same heads")
            self.log(f"resuming at step {self.step} of {self.total_steps}")
        self.order = self._batch_order()
        self.scorer = qr.QRScorer(self.backbone, self.heads, qr.ScorerConfig(encoding="block"),
                                  kv_cache=BlockStateCache(max_bytes=2 << 30), adapter=self.adapter)
        started = time.perf_counter()
        groups = list({id(g): g for g, _ in self.train + self.dev}.values())
        self.features: dict = {}
        for n, group in enumerate(groups):
            self.on_event({"type": "progress", "task": "features", "label": "encoding candidates (frozen backbone)",
                           "done": n, "total": len(groups)})
            self._group_features(group)
        self.feature_seconds = time.perf_counter() - started
        self.log(f"features of {len(self.train)} training and {len(self.dev)} dev questions in "
                 f"{self.feature_seconds:.0f} s")

    def _batch_order(self) -> list[int]:
        """Training questions in seeded shuffled epochs, enough for every step's batch (the same
        on a resumed run)."""
        order_rng = random.Random(self.config.seed)
        order: list[int] = []
        while len(order) < self.total_steps * self.config.batch:
            epoch = list(range(len(self.train)))
            order_rng.shuffle(epoch)
            order += epoch
        return order

    def _group_features(self, group: dict) -> None:
        """One block encoding of the group's candidate chunks; per question its token index into
        it, its candidate spans, and its two suffix passes (question and null query)."""
        import torch
        from evsel.models.shared.blocksparse import read_states

        scorer = self.scorer
        used = sorted({c for q in group["questions"] for c in q["candidates"]})
        states, starts = scorer.block_states([group["texts"][c] for c in used])
        whole = states.context(spans=starts)
        read = read_states(whole, scorer.layers).detached()
        lengths, p = states.lengths(), states.prefix_len
        offset, at = {}, p
        for j, c in enumerate(used):
            offset[c] = (at, lengths[j], starts[j])
            at += lengths[j]
        device = read.positions.device
        for q in group["questions"]:
            texts = [group["texts"][c] for c in q["candidates"]]
            parts = []
            for members, context in scorer.contexts(texts):
                index, spans, at = [torch.arange(p, device=device)], [], p
                for i in members:
                    start, length, first = offset[q["candidates"][i]]
                    index.append(torch.arange(start, start + length, device=device))
                    spans.append((at + first, at + length))
                    at += length
                suffix = [s.detached() for s in scorer.suffix_states(q["question"], context)]
                parts.append((members, torch.cat(index), spans, suffix))
            self.features[q["id"]] = (read, parts)
        scorer.kv_cache = type(scorer.kv_cache)(scorer.kv_cache.max_bytes)  # the next group shares nothing
        scorer.encoded_contexts.clear()

    def scores(self, q: dict):
        """(K,) float32 scores of a question's candidates with the adapter (differentiable)."""
        import torch
        from evsel.models.qrranker import rerank as qr
        from evsel.models.shared.blocksparse import head_attention

        read, parts = self.features[q["id"]]
        out = [None] * len(q["candidates"])
        model = self.backbone.model
        for members, index, spans, suffix in parts:
            real, null = head_attention(model, read.select(index), suffix, self.scorer.layers, self.adapter)
            values = qr.chunk_score_tensor(qr.calibrated(real, null), spans, self.heads)
            for i, v in zip(members, values):
                out[i] = v
        return torch.stack(out)

    def loss(self, q: dict):
        from evsel.models.qrranker import rerank as qr

        return qr.listwise_loss(self.scores(q), q["gold"])

    def dev_metrics(self) -> dict:
        """recall@1/k and MRR on the dev questions: reranked top-K, then BM25's rest."""
        import torch
        from evsel.evaluation.metrics import ranking_metrics

        cfg = self.config
        rows = []
        with torch.no_grad():
            for _, q in self.dev:
                s = self.scores(q).cpu().numpy()
                ranked = [q["candidates"][i] for i in np.argsort(-s, kind="stable")] + q["rest"]
                rows.append(ranking_metrics(ranked, [set(u) for u in q["units"]], [1, cfg.k, 5]))
        keys = ("recall@1", f"recall@{cfg.k}", "recall@5", "mrr")
        return {key: round(float(np.mean([r[key] for r in rows])), 4) for key in keys} if rows else {}

    def bm25_dev(self) -> dict:
        from evsel.evaluation.metrics import ranking_metrics

        rows = [ranking_metrics(q["candidates"] + q["rest"], [set(u) for u in q["units"]], [1, self.config.k, 5])
                for _, q in self.dev]
        keys = ("recall@1", f"recall@{self.config.k}", "recall@5", "mrr")
        return {key: round(float(np.mean([r[key] for r in rows])), 4) for key in keys} if rows else {}

    # the loop's hooks
    def train_step(self) -> dict:
        cfg = self.config
        batch = [self.train[i][1] for i in self.order[self.step * cfg.batch:(self.step + 1) * cfg.batch]]
        self.begin_step()
        total = 0.0
        for q in batch:  # one graph per question: memory stays that of one instance
            loss = self.loss(q) / len(batch)
            loss.backward()
            total += float(loss.detach())
        norm = self.end_step()
        return {"loss": round(total, 5), "lr": self.lr_at(self.step - 1), "grad_norm": round(norm, 4)}

    def first_record(self, dev: dict) -> dict:
        return {"step": 0, "bm25_dev": self.bm25_dev(), **{f"dev_{k}": v for k, v in dev.items()},
                "features_s": round(self.feature_seconds, 1)}

    def trainer_state(self) -> dict:
        return {"step": self.step, "total_steps": self.total_steps, "asked_steps": self.config.steps,
                "best": self.best}

    def summary(self, last: dict) -> dict:
        return {"steps": self.step, "total_steps": self.total_steps, "k": self.config.k, "best_dev": self.best,
                "last_dev": last, "dev_bm25": self.bm25_dev(), "out": str(self.out)}

    def trained_on(self) -> dict:
        """The sources and fold the adapter learned from (a fold-trained adapter is evaluated on the other fold)."""
        from evsel.evaluation.folds import other_fold

        fold = self.config.fold
        return {"sources": list(self.config.sources), "fold": fold,
                "evaluate_on": None if fold is None else f"fold {other_fold(fold)} (evsel eval DATASET --fold {other_fold(fold)})",
                "dev": (self.described.get("dev") or {}).get("source")}

    def save_best(self, dev: dict) -> None:
        """OUT/adapter.safetensors, adapter.json, heads.json and metrics.json: what EVSEL_QRRANKER_HEADS=OUT uses."""
        from evsel.models.qrranker import rerank as qr

        extra = {"backbone": self.backbone.name, "fingerprint": self.backbone.fingerprint, "step": self.step}
        self.adapter.save(self.out, extra)
        heads = {"format": qr.HEADS_FORMAT,
                 "backbone": {"name": self.backbone.name, "fingerprint": self.backbone.fingerprint},
                 "layer_index": "0-based (model.layers[i]), as the seed's l-h notation",
                 "encoding": self.config.encoding, "heads": [{"layer": l, "head": h} for l, h in self.heads],
                 "trained": "adapter.safetensors beside this file (LoRA on the read layers' q_proj/k_proj, "
                            "applied inside QR scoring only)",
                 "detected": (self.heads_data or {}).get("command"), "trained_on": self.trained_on()}
        (self.out / qr.HEADS_FILE).write_text(json.dumps(heads, indent=1) + "\n")
        metrics = {"trained_on": self.trained_on(), "step": self.step, "dev": dev, "dev_bm25": self.bm25_dev(), "data": self.described,
                   "train_questions": len(self.train), "dev_questions": len(self.dev),
                   "config": asdict(self.config), "command": self.command}
        (self.out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
        if self.command:
            (self.out / "command.txt").write_text(self.command + "\n")


def run_training(engine, out: str, recipe_name: str, options: dict, command: str | None = None,
                 data_dir: str | None = None, on_event: Callable[[dict], None] = ignore_event) -> dict:
    """`evsel train qrranker`: the recipe's settings with the given options over them; build the
    listwise instances, then train (or resume). Log lines go to `on_event` as {"type": "log"}."""
    from evsel.models.qrranker import rerank as qr

    config = config_of(TrainConfig, out, train_recipe(recipe_name), options)
    check_sources(config.sources, config.fold)  # before the backbone loads
    backbone = engine.backbone

    def log(line: str) -> None:
        on_event({"type": "log", "message": line})

    heads, where = qr.resolve_heads(backbone, config.heads or engine.settings.qrranker_heads, config.encoding)
    heads_data = None
    if Path(where).exists():
        heads_data = qr.load_head_file(where)
    log(f"heads from {where}: {qr.format_heads(heads)}")
    train, dev, described = question_groups(config, backbone, Path(data_dir) if data_dir else None,
                                            _detection_stories(heads_data), on_event)
    trainer = ListwiseTrainer(config, backbone, command or "", on_event, log)
    trainer.setup(train, dev, heads, heads_data, described)
    return trainer.run()
