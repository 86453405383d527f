"""`evsel train blocksearch`: BlockSearch's code decoder (seed 001, Sec. 3.2, Appx. F) on training
splits only (FairytaleQA train by default; the HippoRAG MuSiQue / HotpotQA train samples on request;
LoCoMo and FairytaleQA val are refused: they report results).

A context is `stories_per_context` training stories' chunks, each chunk given a fresh random
four-digit code whenever the context is built (the seed's random identifiers), encoded once
block-sparse by the frozen backbone; its stories' questions are then trained on in batches. The loss
is teacher-forced cross-entropy on the gold chunk's code plus λ times the on-policy auxiliary loss
(Algorithm 1: roll a code out of the model, build each slot's teacher from the candidates whose
prefix matches, replay), λ ramped in linearly over `aux_warmup` steps. The teacher's relevance is
1 + `gold_margin` for gold chunks and the chunk's BM25 rank within its story (in [0, 1]) for the
rest. What trains is the decoder's LoRA on q_proj / v_proj, read by the query block only
(models/blocksearch/decoder.py). Dev recall is the beam search's on held-out FairytaleQA train stories.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from evsel.errors import InputError

from .common import AdapterTrainer, config_of, ignore_event, pick_recipe, question_groups


@dataclass
class TrainConfig:
    out: str = ""  # run folder: adapter (best by dev recall@1), metrics.json, checkpoint/, log.jsonl
    sources: list[str] = field(default_factory=lambda: ["fairytaleqa-train"])
    fold: int | None = None  # LoCoMo / MuSiQue / HotpotQA: train on this fold only (dev from it too)
    stories: int = 64  # FairytaleQA train stories trained on (documents per other source)
    dev_stories: int = 8  # held-out FairytaleQA train stories (never val)
    questions_per_story: int = 6
    dev_questions_per_story: int = 3
    stories_per_context: int = 2  # stories whose chunks share one context (more codes to tell apart)
    rank: int = 8
    alpha: float = 16.0
    batch: int = 4
    steps: int = 100
    minutes: float | None = None  # stop after this much wall time (a rerun resumes)
    lr: float = 1e-3
    warmup: int = 10
    aux_weight: float = 1.0  # λ of the auxiliary loss once ramped in
    aux_warmup: int = 20  # steps over which λ ramps in from 0
    gold_margin: float = 4.0
    weight_decay: float = 0.0
    clip: float = 1.0
    dev_every: int = 25
    checkpoint_every: int = 10
    chunk_tokens: int = 140
    threads: int | None = None
    seed: int = 0


# smoke: seconds to a minute on a CPU, proves the path; full: docs/BLOCKSEARCH.md's CPU run
SMOKE = {"stories": 2, "dev_stories": 1, "questions_per_story": 2, "dev_questions_per_story": 2, "steps": 3,
         "batch": 2, "dev_every": 3, "checkpoint_every": 1, "warmup": 1, "aux_warmup": 1, "lr": 2e-3}
FULL = {"stories": 64, "dev_stories": 8, "questions_per_story": 6, "dev_questions_per_story": 3, "steps": 100,
        "batch": 4, "dev_every": 25, "checkpoint_every": 10, "warmup": 10, "aux_warmup": 20, "lr": 1e-3}


def train_recipe(name: str) -> dict:
    return pick_recipe(name, SMOKE, FULL)


def training_groups(config: TrainConfig, backbone, data_dir: Path | None, on_event=ignore_event):
    """(train groups, dev groups, description), as `evsel train qrranker` draws them, every chunk
    of a story a candidate, so a question's candidates are its story's chunks in BM25 order."""
    return question_groups(config, backbone, data_dir, frozenset(), on_event, candidates=100_000)


class DecoderTrainer(AdapterTrainer):
    """One run over groups ({"texts", "questions": [{"id", "question", "candidates", "units", ...}]})
    in recipes/common.py's loop. Steps follow a schedule fixed by the seed, so a resumed run
    replays the same contexts, codes and batches from its checkpoint's step on."""

    progress_label = "training the code decoder"

    def setup(self, train: list[dict], dev: list[dict], described: dict | None = None) -> None:
        import torch
        from evsel.models.blocksearch import decoder as bd
        from evsel.models.shared.blocksparse import BlockStateCache

        cfg = self.config
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        self.train = [g for g in train if g["questions"]]
        self.dev = [g for g in dev if g["questions"]]
        self.described = described or {}
        if not self.train:
            raise InputError("no training questions with a gold chunk", "use more --stories")
        model = self.backbone.model
        if self.start_or_resume(lambda folder: bd.load_decoder_adapter(folder, model),
                                lambda: bd.new_adapter(model, cfg.rank, cfg.alpha, cfg.seed)) is not None:
            self.log(f"resuming at step {self.step} of {cfg.steps}")
        self.decoder = bd.Decoder(self.backbone, self.adapter)
        self.dev_cache = BlockStateCache(1 << 30)
        self.schedule = self._schedule()
        self._context_key = None
        self._context = None

    # the schedule: step -> (context: group indices and a code seed, the batch's questions)
    def _schedule(self) -> list[tuple[tuple, int, list[tuple[int, int]]]]:
        cfg = self.config
        rng = random.Random(cfg.seed)
        out: list = []
        round_no = 0
        while len(out) < cfg.steps:
            order = list(range(len(self.train)))
            rng.shuffle(order)
            for at in range(0, len(order), cfg.stories_per_context):
                groups = tuple(order[at:at + cfg.stories_per_context])
                items = [(g, j) for g in groups for j in range(len(self.train[g]["questions"]))]
                rng.shuffle(items)
                code_seed = rng.randrange(1 << 30)
                for b in range(0, len(items), cfg.batch):
                    out.append(((groups, round_no), code_seed, items[b:b + cfg.batch]))
                round_no += 1
        return out[: cfg.steps]

    def context_for(self, key: tuple, code_seed: int):
        """The context of a schedule round: its stories' chunks, fresh random codes."""
        from evsel.models.blocksearch import decoder as bd

        if self._context_key != key:
            groups = key[0]
            texts, offsets = [], {}
            for g in groups:
                offsets[g] = len(texts)
                texts += self.train[g]["texts"]
            codes = bd.random_codes(len(texts), random.Random(code_seed))
            self.decoder.kv_cache = None  # fresh codes: no block comes back
            self._context = (self.decoder.context(texts, codes).trainable(), offsets)
            self._context_key = key
        return self._context

    def question_loss(self, ctx, offset: int, q: dict, aux_weight: float, rng):
        from evsel.models.blocksearch import decoder as bd

        cfg = self.config
        n = len(ctx.codes)
        gold = sorted({offset + c for unit in q["units"] for c in unit})
        ranked = q["candidates"]
        relevance = {offset + c: 1.0 - r / max(1, len(ranked)) for r, c in enumerate(ranked)}
        weights = bd.teacher_weights(n, gold, relevance, cfg.gold_margin)
        gold_code = ctx.codes[gold[rng.randrange(len(gold))]]  # one gold chunk's code per visit
        sampler = np.random.default_rng(rng.randrange(1 << 30))
        return bd.decoder_loss(self.decoder, ctx, q["question"], gold_code, weights, aux_weight, sampler)[:2]

    def aux_at(self, step: int) -> float:
        cfg = self.config
        return cfg.aux_weight * min(1.0, step / max(1, cfg.aux_warmup))

    def train_step(self) -> dict:
        cfg = self.config
        key, code_seed, items = self.schedule[self.step]
        ctx, offsets = self.context_for(key, code_seed)
        rng = random.Random(cfg.seed * 1_000_003 + self.step)
        self.begin_step()
        aux_weight = self.aux_at(self.step)
        totals = {"loss": 0.0, "ce": 0.0, "aux": 0.0}
        for g, j in items:  # one graph per question
            loss, parts = self.question_loss(ctx, offsets[g], self.train[g]["questions"][j], aux_weight, rng)
            (loss / len(items)).backward()
            totals["loss"] += float(loss.detach()) / len(items)
            totals["ce"] += parts["ce"] / len(items)
            totals["aux"] += parts.get("aux", 0.0) / len(items)
        norm = self.end_step()
        return {**{k: round(v, 5) for k, v in totals.items()}, "aux_weight": round(aux_weight, 3),
                "grad_norm": round(norm, 4), "context_chunks": len(ctx.codes), "lr": self.lr_at(self.step - 1)}

    def fixed_loss(self, step: int = 0) -> float:
        """The teacher-forced loss of schedule step `step`'s batch with its context (no update):
        what a test watches fall."""
        import torch

        key, code_seed, items = self.schedule[step]
        ctx, offsets = self.context_for(key, code_seed)
        rng = random.Random(0)
        with torch.no_grad():
            values = [float(self.question_loss(ctx, offsets[g], self.train[g]["questions"][j], 0.0, rng)[0])
                      for g, j in items]
        return float(np.mean(values))

    def dev_metrics(self) -> dict:
        """Beam-search recall@1/5 and MRR on the dev stories, each its own context, codes as at
        inference (from the chunks' content hashes); BM25's in the same questions."""
        from evsel.evaluation.metrics import ranking_metrics
        from evsel.models.blocksearch import decoder as bd
        from evsel.ingest.chunker import content_hash

        rows, bm25 = [], []
        self.decoder.kv_cache = self.dev_cache  # the dev contexts are the same every time
        for group in self.dev:
            texts = group["texts"]
            codes = bd.scope_codes([content_hash(t) for t in texts])
            ctx = self.decoder.context(texts, codes)
            where = {c: i for i, c in enumerate(codes)}
            for q in group["questions"]:
                found = [where[c] for c, _ in self.decoder.beam_search(ctx, q["question"])]
                ranked = found + [i for i in q["candidates"] if i not in set(found)]
                units = [set(u) for u in q["units"]]
                rows.append(ranking_metrics(ranked, units, [1, 5]))
                bm25.append(ranking_metrics(q["candidates"], units, [1, 5]))
        keys = ("recall@1", "recall@5", "mrr")

        def mean(items):
            return {k: round(float(np.mean([r[k] for r in items])), 4) for k in keys} if items else {}

        return {**mean(rows), "bm25": mean(bm25)}

    def save_best(self, dev: dict) -> None:
        """OUT/adapter.safetensors + adapter.json + metrics.json: what EVSEL_BLOCKSEARCH_DECODER=OUT uses."""
        extra = {"backbone": self.backbone.name, "fingerprint": self.backbone.fingerprint, "step": self.step,
                 "prompt": asdict(self.decoder.config.prompt)}
        self.adapter.save(self.out, extra)
        metrics = {"step": self.step, "dev": dev, "data": self.described, "config": asdict(self.config),
                   "command": self.command}
        (self.out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")


def run_training(engine, out: str, recipe_name: str, options: dict, command: str | None = None,
                 data_dir: str | None = None, on_event: Callable[[dict], None] = ignore_event) -> dict:
    """`evsel train blocksearch`: the recipe's settings with the given options over them; with
    the option `router` true, the router instead (recipes/blockrouter.py)."""
    if options.pop("router", None):
        from .blockrouter import run_router_training

        return run_router_training(engine, out, recipe_name, options, command, data_dir, on_event)
    options = {k: v for k, v in options.items() if k != "router"}
    config = config_of(TrainConfig, out, train_recipe(recipe_name), options)

    def log(line: str) -> None:
        on_event({"type": "log", "message": line})

    train, dev, described = training_groups(config, engine.backbone, Path(data_dir) if data_dir else None, on_event)
    trainer = DecoderTrainer(config, engine.backbone, command or "", on_event, log)
    trainer.setup(train, dev, described)
    return trainer.run()
