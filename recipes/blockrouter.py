"""`evsel train blocksearch --router`: BlockSearch's router (issue 22). A LoRA on q_proj / k_proj
of the `lora_layers` layers up to the routing layer L (models/blocksearch/trained_router.py), trained on the
routing score itself with QRRanker's listwise loss (the seed trains the layers below L with an
attention loss): per question, its gold chunks (at most `gold_per_question`) and `negatives`
others of its story, the hardest first (BM25's top non-gold chunks, then random ones), scored as
the router scores them (prefix mode, calibrated mass of the QR heads at L). Training splits only
(recipes/common.py's sources; FairytaleQA val is refused, LoCoMo / MuSiQue / HotpotQA train on one
`--fold` only). Dev: the router itself, with the adapter, over each held-out document's whole chunk
list (recall@1/5, MRR; BM25's on the same questions), so the best adapter is chosen by what
`blocksearch:router` does: held-out FairytaleQA train stories, or with a fold a held-out
conversation of that same fold (LoCoMo: questions over whole conversations, gold = the evidence
turns' chunks, negatives from the same conversation).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from evsel.errors import InputError

from .common import AdapterTrainer, check_sources, config_of, ignore_event, pick_recipe, question_groups


@dataclass
class RouterConfig:
    out: str = ""  # run folder: adapter (best by dev recall@5), metrics.json, checkpoint/, log.jsonl
    sources: list[str] = field(default_factory=lambda: ["fairytaleqa-train"])
    fold: int | None = None  # LoCoMo / MuSiQue / HotpotQA: train on this fold only (dev from it too)
    stories: int = 200  # FairytaleQA train stories trained on (documents per other source)
    dev_stories: int = 6  # held-out FairytaleQA train stories (never val)
    questions_per_story: int = 8
    dev_questions_per_story: int = 5
    negatives: int = 5  # non-gold chunks per question
    hard_negatives: int = 3  # of them, BM25's top non-gold
    gold_per_question: int = 2
    lora_layers: int | None = 6  # adapted layers: the top ones of 0..L (None: all)
    rank: int = 8
    alpha: float = 16.0
    batch: int = 2  # questions per step
    steps: int = 400
    minutes: float | None = None  # stop after this much wall time (a rerun resumes)
    lr: float = 5e-4
    warmup: int = 10
    weight_decay: float = 0.0
    clip: float = 1.0
    dev_every: int = 25
    checkpoint_every: int = 10
    chunk_tokens: int = 140
    threads: int | None = None
    seed: int = 0


# smoke: a minute on a CPU, proves the path; full: docs/BLOCKSEARCH.md's CPU run
SMOKE = {"stories": 2, "dev_stories": 1, "questions_per_story": 2, "dev_questions_per_story": 2, "steps": 2,
         "batch": 1, "negatives": 2, "hard_negatives": 1, "gold_per_question": 1, "lora_layers": 2,
         "dev_every": 2, "checkpoint_every": 1, "warmup": 1, "lr": 2e-3}
FULL = {}


def router_recipe(name: str) -> dict:
    return pick_recipe(name, SMOKE, FULL)


class RouterTrainer(AdapterTrainer):
    """One run over question groups (recipes/common.py's: a story's chunk texts and its questions,
    candidates = the whole story in BM25 order) in the shared loop. The step schedule is fixed by
    the seed, so a resumed run draws the same questions and negatives from its step on."""

    selection_key = "recall@5"
    progress_label = "training the BlockSearch router"

    def setup(self, train: list[dict], dev: list[dict], described: dict | None = None) -> None:
        import torch
        from evsel.models.blocksearch import trained_router as br
        from evsel.models.blocksearch.routing import BlockSearch

        cfg = self.config
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        for p in self.backbone.model.parameters():  # only the adapter trains
            p.requires_grad_(False)
        self.items = [(g, j) for g, group in enumerate(train) for j, q in enumerate(group["questions"])
                      if q["gold"] and len(q["gold"]) < len(q["candidates"])]
        self.train = train
        self.dev = [g for g in dev if g["questions"]]
        self.described = described or {}
        if not self.items:
            raise InputError("no training questions with a gold chunk", "use more --stories")
        self.base = BlockSearch(self.backbone)  # the untrained router: prompt, rows, heads, layer
        layers = br.router_layers(self.base.layer, cfg.lora_layers)
        model = self.backbone.model
        state = self.start_or_resume(lambda folder: br.load_router_adapter(folder, model),
                                     lambda: br.new_router_adapter(model, layers, cfg.rank, cfg.alpha, cfg.seed))
        if state is not None:
            self.log(f"resuming at step {self.step} of {cfg.steps}")
        rng = random.Random(cfg.seed)
        self.schedule = []
        while len(self.schedule) < cfg.steps * cfg.batch:
            order = list(self.items)
            rng.shuffle(order)
            self.schedule += order

    def instance(self, step: int, k: int) -> tuple[dict, list[int], list[int]]:
        """(question, candidate chunk indices into its story, gold positions among them) of the
        k-th question of schedule step `step`."""
        cfg = self.config
        g, j = self.schedule[step * cfg.batch + k]
        group, q = self.train[g], self.train[g]["questions"][j]
        rng = random.Random(cfg.seed * 1_000_003 + step * 101 + k)
        gold_all = {c for unit in q["units"] for c in unit}
        gold = rng.sample(sorted(gold_all), min(cfg.gold_per_question, len(gold_all)))
        ranked = [c for c in q["candidates"] + q["rest"] if c not in gold_all]
        hard = ranked[: cfg.hard_negatives]
        others = [c for c in range(len(group["texts"])) if c not in gold_all and c not in hard]
        easy = rng.sample(others, min(len(others), cfg.negatives - len(hard)))
        chosen = gold + hard + easy
        return q, chosen, list(range(len(gold)))

    def loss_of(self, step: int, k: int):
        from evsel.models.blocksearch import trained_router as br
        from evsel.models.qrranker.rerank import listwise_loss

        q, chosen, gold = self.instance(step, k)
        texts = [self.train[self.schedule[step * self.config.batch + k][0]]["texts"][c] for c in chosen]
        scores = br.routing_scores(self.base, self.adapter, q["question"], texts)
        return listwise_loss(scores, gold), scores

    def train_step(self) -> dict:
        cfg = self.config
        step = self.step
        self.begin_step()
        total, hits = 0.0, 0
        for k in range(cfg.batch):
            loss, scores = self.loss_of(step, k)
            (loss / cfg.batch).backward()
            total += float(loss.detach()) / cfg.batch
            hits += int(int(scores.detach().argmax()) == 0)
        norm = self.end_step()
        return {"loss": round(total, 5), "gold_first": hits / cfg.batch, "grad_norm": round(norm, 4),
                "lr": self.lr_at(step)}

    def fixed_loss(self, step: int = 0) -> float:
        """Schedule step `step`'s loss with the adapter as it is (no update): what a test watches fall."""
        import torch

        with torch.no_grad():
            return float(np.mean([float(self.loss_of(step, k)[0]) for k in range(self.config.batch)]))

    def router(self):
        """The router as `blocksearch:router` runs it with the current adapter (keys in memory,
        keyed by the adapter's digest)."""
        from evsel.models.blocksearch.routing import BlockSearch

        return BlockSearch(self.backbone, adapter=self.adapter)

    def dev_metrics(self) -> dict:
        """Routing recall@1/5 and MRR over each dev story's whole chunk list; BM25's alongside."""
        import torch
        from evsel.evaluation.metrics import ranking_metrics

        router = self.router()
        rows, bm25 = [], []
        with torch.no_grad():
            for group in self.dev:
                scope = router.scope(group["texts"])
                for q in group["questions"]:
                    scores = router.route(q["question"], scope).scores
                    ranked = [int(i) for i in np.argsort(-scores, kind="stable")]
                    units = [set(u) for u in q["units"]]
                    rows.append(ranking_metrics(ranked, units, [1, 5]))
                    bm25.append(ranking_metrics(q["candidates"] + q["rest"], units, [1, 5]))
        keys = ("recall@1", "recall@5", "mrr")

        def mean(items):
            return {k: round(float(np.mean([r[k] for r in items])), 4) for k in keys} if items else {}

        return {**mean(rows), "bm25": mean(bm25)}

    def save_best(self, dev: dict) -> None:
        """OUT/adapter.safetensors + adapter.json + metrics.json: what EVSEL_BLOCKSEARCH_ROUTER=OUT uses."""
        extra = {"backbone": self.backbone.name, "fingerprint": self.backbone.fingerprint, "step": self.step,
                 "routing_layer": self.base.layer, "routing": self.base.config.to_dict()}
        self.adapter.save(self.out, extra)
        metrics = {"step": self.step, "dev": dev, "data": self.described, "config": asdict(self.config),
                   "command": self.command}
        (self.out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")


def run_router_training(engine, out: str, recipe_name: str, options: dict, command: str | None = None,
                        data_dir: str | None = None, on_event: Callable[[dict], None] = ignore_event) -> dict:
    """`evsel train blocksearch --router`: the recipe's settings with the given options over them
    (options the router has no use for must be unset)."""
    given = {k: v for k, v in options.items() if v is not None}
    config = config_of(RouterConfig, out, router_recipe(recipe_name), given)
    check_sources(config.sources, config.fold)

    def log(line: str) -> None:
        on_event({"type": "log", "message": line})

    train, dev, described = question_groups(config, engine.backbone, Path(data_dir) if data_dir else None,
                                            frozenset(), on_event, candidates=100_000)
    trainer = RouterTrainer(config, engine.backbone, command or "", on_event, log)
    trainer.setup(train, dev, described)
    return trainer.run()
