"""`evsel train reader --lora`: the LoRA reader (models/reader/lora.py), trained end to end for span
extraction on two CPU cores, resumable.

Examples are drawn as `evsel train reader` draws them (recipes/reader.py `training_examples`: a training
question with BM25's top 5 passages of its document, the answer located in them; FairytaleQA
train, and LoCoMo / MuSiQue / HotpotQA on one --fold), plus no-answer examples: a question shown
the near misses (its top passages without the ones that hold the answer, topped up with BM25's
next ones), labelled with the null span.

What is frozen is computed once: the output of layers 1..cut of every example, cached in
OUT/states (bf16, one file per example, written when first needed), so a step costs only the
adapted layers (cut+1..deepest, run in float32). OUT/examples.json holds the examples; a
checkpoint (OUT/checkpoint: the deltas, AdamW's state, the step, the best dev) is written every
--checkpoint-minutes and when stopped, each by rename, so `--resume` continues where it stopped.
The best reader by dev F1 is OUT/adapter.safetensors + OUT/reader.json.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from evsel.errors import InputError

from .common import config_of, ignore_event, pick_recipe, warmup_then_linear, write_record


@dataclass
class LoraTrainConfig:
    out: str = ""
    sources: list[str] = field(default_factory=lambda: ["fairytaleqa-train"])
    fold: int | None = None
    stories: int = 220
    questions_per_story: int = 3
    dev_stories: int = 12  # held-out FairytaleQA train stories (the same ones the span head held out)
    dev_questions_per_story: int = 8
    folded_questions: int = 200
    calibration_questions: int = 80  # LoCoMo's held-out conversation: chooses the abstention margin
    no_answer_share: float = 0.15  # no-answer examples added, as a share of the answerable ones
    top_n: int = 5
    cut: int = 14
    deepest: int = 22
    rank: int = 8
    alpha: float = 16.0
    max_tokens: int = 1024
    batch: int = 4  # examples per optimizer step
    steps: int = 300
    lr: float = 5e-4  # the deltas'
    head_lr: float = 2e-3
    warmup: int = 20
    weight_decay: float = 0.0
    clip: float = 1.0
    dev_every: int = 100
    checkpoint_minutes: float = 3.0
    minutes: float | None = None
    min_precision: float = 0.7  # of the printed answers on the calibration questions
    chunk_tokens: int = 140
    threads: int | None = 1
    seed: int = 0
    precache_only: bool = False  # build the examples and the frozen layers' states, then stop
    init_from: str | None = None  # a trained LoRA reader whose deltas and head the run starts from


SMOKE = {"stories": 3, "questions_per_story": 2, "dev_stories": 1, "dev_questions_per_story": 2,
         "folded_questions": 3, "calibration_questions": 4, "steps": 3, "batch": 2, "dev_every": 2, "warmup": 1}
FULL: dict = {}
RESUMABLE = ("minutes", "threads", "steps", "precache_only", "dev_every")  # what --resume may change


def _atomic_json(path: Path, value) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value) + "\n")
    tmp.replace(path)


def build_examples(config: LoraTrainConfig, backbone, data_dir: Path | None, on_event) -> dict:
    """{"train", "dev", "calibration", "described"}; no-answer examples appended to train."""
    from .reader import TrainConfig, locate_answer, training_examples

    base = TrainConfig(out=config.out, sources=config.sources, fold=config.fold, stories=config.stories,
                       questions_per_story=config.questions_per_story, dev_stories=config.dev_stories,
                       dev_questions_per_story=config.dev_questions_per_story,
                       folded_questions=config.folded_questions, calibration_questions=config.calibration_questions,
                       top_n=config.top_n, chunk_tokens=config.chunk_tokens, seed=config.seed)
    train, dev, calibration, described = training_examples(base, backbone, data_dir, on_event)
    rng = random.Random(config.seed + 7)
    negatives = []
    for item in rng.sample(train, min(len(train), round(config.no_answer_share * len(train)))):
        holding = {p for p, _, _ in item["spans"]}
        kept = [t for i, t in enumerate(item["passages"]) if i not in holding]
        kept += [t for t in item.get("spare", []) if not locate_answer([t], item["answers"])]
        if len(kept) >= 2 and not locate_answer(kept[: config.top_n], item["answers"]):
            negatives.append({**item, "id": item["id"] + "/no-answer", "passages": kept[: config.top_n],
                              "spans": [], "unanswerable": True})
    described["no_answer_examples"] = len(negatives)
    strip = lambda items: [{k: v for k, v in e.items() if k != "spare"} for e in items]  # noqa: E731
    return {"train": strip(train + negatives), "dev": strip(dev), "calibration": strip(calibration),
            "described": described}


class StateCache:
    """The frozen layers' output of each example, once: OUT/states/<key>.safetensors (bf16)."""

    def __init__(self, folder: Path, backbone, reader):
        self.folder = folder
        self.backbone = backbone
        self.reader = reader
        folder.mkdir(parents=True, exist_ok=True)

    def sequence(self, item: dict):
        from evsel.models.reader.lora import encode

        return encode(self.backbone.tokenizer, self.backbone.bos_id(), item["question"], item["passages"],
                      self.reader.config)

    def path(self, seq) -> Path:
        blob = json.dumps([self.backbone.fingerprint, self.reader.config.cut, seq.ids])
        return self.folder / f"{hashlib.sha256(blob.encode()).hexdigest()[:24]}.safetensors"

    def get(self, item: dict):
        """(the cut layer's output (1, T, d) float32, the sequence)."""
        import torch
        from safetensors.torch import load_file, save_file

        seq = self.sequence(item)
        path = self.path(seq)
        if path.is_file():
            return load_file(str(path))["states"].float()[None], seq
        states = self.reader.lower_states(self.backbone.model, seq)
        tmp = path.with_suffix(f".tmp{os.getpid()}")  # a precache process may write beside the trainer
        save_file({"states": states[0].to(torch.bfloat16).contiguous()}, str(tmp))
        tmp.replace(path)
        return states.float(), seq


class LoraReaderTrainer:
    def __init__(self, config: LoraTrainConfig, backbone, data: dict, command: str, on_event, log):
        import copy

        import torch

        from evsel.models.reader.lora import LoraReader, LoraReaderConfig

        self.config, self.backbone, self.command, self.on_event, self.log = config, backbone, command, on_event, log
        self.out = Path(config.out)
        self.train, self.dev, self.calibration = data["train"], data["dev"], data["calibration"]
        self.described = data["described"]
        model = backbone.model
        reader_config = LoraReaderConfig(cut=config.cut, deepest=config.deepest, rank=config.rank, alpha=config.alpha,
                                         max_tokens=config.max_tokens)
        checkpoint = self.out / "checkpoint"
        if (checkpoint / "trainer.json").is_file():
            self.reader = LoraReader.load(checkpoint, model)
            state = json.loads((checkpoint / "trainer.json").read_text())
            self.step, self.best, self.seen = state["step"], state.get("best"), state.get("seen", 0)
        elif config.init_from:
            self.reader = LoraReader.load(config.init_from, model)
            self.reader.meta = {}  # what it was trained on describes the other run
            state, self.step, self.best, self.seen = None, 0, None, 0
        else:
            self.reader = LoraReader.for_model(model, reader_config, seed=config.seed)
            state, self.step, self.best, self.seen = None, 0, None, 0
        self.reader.trainable(True)
        # the adapted layers in float32 (the backbone's own copy is untouched; bf16 on a CPU without
        # bf16 instructions is slower than float32)
        self.layers = [copy.deepcopy(model.model.layers[n - 1]).float() for n in self.reader.config.adapted]
        for layer in self.layers:
            for p in layer.parameters():
                p.requires_grad_(False)
        self.rotary = model.model.rotary_emb
        lora = [v for k, v in self.reader.params.items() if k.startswith("layers.")]
        head = [v for k, v in self.reader.params.items() if k.startswith("head.")]
        self.optimizer = torch.optim.AdamW([{"params": lora, "lr": config.lr, "base": config.lr},
                                            {"params": head, "lr": config.head_lr, "base": config.head_lr}],
                                           weight_decay=config.weight_decay)
        if state is not None and (checkpoint / "optimizer.pt").is_file():
            self.optimizer.load_state_dict(torch.load(checkpoint / "optimizer.pt", map_location="cpu"))
        self.cache = StateCache(self.out / "states", backbone, self.reader)
        self.order = list(range(len(self.train)))
        random.Random(config.seed).shuffle(self.order)

    def scores(self, item: dict, grad: bool):
        import torch

        from evsel.models.reader.lora import span_mask

        lower, seq = self.cache.get(item)
        allowed = span_mask(seq, self.reader.config.max_span)
        with torch.set_grad_enabled(grad):
            spans, null = self.reader.upper_scores(self.layers, self.rotary, lower, allowed)
        return spans, null, seq, allowed

    def loss_of(self, item: dict):
        import torch

        from evsel.models.reader.lora import gold_mask

        spans, null, seq, allowed = self.scores(item, True)
        everything = torch.cat([spans.reshape(-1), null[None]])
        total = torch.logsumexp(everything, 0)
        if item["unanswerable"]:
            return total - null
        target = gold_mask(seq, item["spans"], self.reader.config.max_span) & allowed
        if not target.any():
            return None
        return total - torch.logsumexp(spans[target], 0)

    def train_step(self) -> dict:
        import torch

        cfg = self.config
        lr_scale = warmup_then_linear(self.step, 1.0, cfg.warmup, cfg.steps)
        for group in self.optimizer.param_groups:
            group["lr"] = group["base"] * lr_scale
        self.optimizer.zero_grad(set_to_none=True)
        losses = []
        for k in range(cfg.batch):
            item = self.train[self.order[self.seen % len(self.order)]]
            self.seen += 1
            loss = self.loss_of(item)
            if loss is not None:
                (loss / cfg.batch).backward()
                losses.append(loss.item())
        params = self.reader.parameters()
        norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.clip))
        self.optimizer.step()
        self.step += 1
        return {"loss": round(sum(losses) / max(1, len(losses)), 4), "grad_norm": round(norm, 3),
                "lr": round(cfg.lr * lr_scale, 7)}

    def predictions(self, items: list[dict]) -> list[dict]:
        """Per item: the best span's text, its log-probability, the null's (as `ask` reads it)."""
        from evsel.models.reader.lora import LoraReading

        out = []
        for i, item in enumerate(items):
            if i % 10 == 0:
                self.on_event({"type": "progress", "task": "dev", "label": "reading held-out questions", "done": i,
                               "total": len(items)})
            spans, null, seq, _ = self.scores(item, False)
            read = LoraReading(item["passages"], seq, spans.detach(), float(null), self.reader.config.max_span)
            best = read.top(1)
            out.append({"text": best[0].text if best else "", "logp": math.log(best[0].probability) if best else -1e9,
                        "null_logp": read.null_logp})
        return out

    def dev_metrics(self) -> dict:
        from .reader import span_f1

        got = self.predictions(self.dev)
        f1 = [span_f1(p["text"], item["answers"]) for p, item in zip(got, self.dev)]
        abstains = [p["null_logp"] > p["logp"] for p in got]
        return {"f1": round(sum(f1) / max(1, len(f1)), 4), "questions": len(f1),
                "null_wins": sum(abstains)}

    def calibrate(self) -> dict:
        """The margin: abstain when null_logp - best_logp > margin, on the calibration questions
        (LoCoMo's held-out conversation, adversarial included; right: the answer holds the
        reference's words, as eval's `contained`). The largest margin (answering most) whose printed
        answers are right at least min_precision of the time with at least half answered; when none
        reaches that, 0: the reader abstains when it finds no answer likelier than its best span."""
        from evsel.evaluation import metrics

        if not self.calibration:
            return {"margin": None, "why": "no calibration questions (train with --source locomo)"}
        got = self.predictions(self.calibration)
        rows = [(p["null_logp"] - p["logp"],
                 (not item["unanswerable"]) and metrics.contained(p["text"], item["answers"]) >= 1.0)
                for p, item in zip(got, self.calibration)]

        def at(margin: float) -> dict:
            printed = [right for gap, right in rows if gap <= margin]
            return {"margin": margin, "precision": round(sum(printed) / max(1, len(printed)), 4),
                    "answered": round(len(printed) / len(rows), 4)}

        points = [at(g) for g in sorted({g for g, _ in rows})]
        half = [r for r in points if r["answered"] >= 0.5]
        reached = [r for r in half if r["precision"] >= self.config.min_precision]
        # not reached: the most precise margin that still answers half (what the target asks for)
        best = dict(reached[-1]) if reached else {**max(half, key=lambda r: r["precision"]),
                                                  "why": f"no margin reaches precision {self.config.min_precision} "
                                                         "with half answered: the most precise that answers half"}
        best.update(questions=len(rows), unanswerable=sum(1 for i in self.calibration if i["unanswerable"]),
                    never_abstaining={**at(float("inf")), "margin": None}, gaps=[[round(g, 4), r] for g, r in rows])
        return best

    def save_best(self, dev: dict) -> None:
        self.reader.save(self.out, {"trained_on": self.described, "dev": dev, "command": self.command,
                                    "step": self.step})

    def save_checkpoint(self) -> None:
        import torch

        folder = self.out / "checkpoint"
        tmp = folder.with_name("checkpoint.tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        self.reader.save(tmp, {"step": self.step})
        torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
        (tmp / "trainer.json").write_text(json.dumps({"step": self.step, "best": self.best, "seen": self.seen}) + "\n")
        old = folder.with_name("checkpoint.old")
        if old.exists():
            shutil.rmtree(old)
        if folder.exists():
            folder.rename(old)
        tmp.rename(folder)
        shutil.rmtree(old, ignore_errors=True)

    def run(self) -> dict:
        cfg = self.config
        started = last_checkpoint = time.perf_counter()
        last: dict = {}
        with open(self.out / "log.jsonl", "a", encoding="utf-8") as log_file:
            while self.step < cfg.steps:
                if cfg.minutes is not None and time.perf_counter() - started > cfg.minutes * 60:
                    self.log(f"--minutes {cfg.minutes:g} reached at step {self.step}; continue with --resume")
                    break
                self.on_event({"type": "progress", "task": "train", "label": "reader (LoRA)", "done": self.step,
                               "total": cfg.steps})
                t = time.perf_counter()
                record = {"step": self.step + 1, **self.train_step(), "step_s": round(time.perf_counter() - t, 2),
                          "elapsed_s": round(time.perf_counter() - started, 1)}
                final = self.step >= cfg.steps
                if self.dev and (self.step % cfg.dev_every == 0 or final):
                    last = self.dev_metrics()
                    record.update({f"dev_{k}": v for k, v in last.items()})
                    if self.best is None or last["f1"] > self.best["f1"]:
                        self.best = last
                        self.save_best(last)
                write_record(log_file, record, self.log)
                if final or time.perf_counter() - last_checkpoint > cfg.checkpoint_minutes * 60:
                    self.save_checkpoint()
                    last_checkpoint = time.perf_counter()
            self.save_checkpoint()
        if self.best is None:  # no dev check yet: the current deltas are the best known
            self.save_best({})
        summary = {"steps": self.step, "total_steps": cfg.steps, "best_dev": self.best, "last_dev": last,
                   "out": str(self.out), "seconds": round(time.perf_counter() - started, 1)}
        if self.step >= cfg.steps:
            summary["abstention"] = self.calibrate_best()
        (self.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        return summary

    def calibrate_best(self) -> dict:
        from evsel.models.reader.lora import LoraReader

        current = self.reader
        best = LoraReader.load(self.out, self.backbone.model)
        self.reader = best
        try:
            calibration = self.calibrate()
        finally:
            self.reader = current
        best.meta["abstention"] = calibration
        best.save(self.out)
        return calibration


def _shaped_as(config: LoraTrainConfig, reader_folder: Path) -> LoraTrainConfig:
    """The run's reader shape (cut, deepest, rank, alpha, max_tokens) taken from the reader it starts from."""
    from dataclasses import replace

    from evsel.models.reader.lora import LoraReader

    if not (reader_folder / "reader.json").is_file():
        raise InputError(f"--init-from: {reader_folder} holds no LoRA reader (no reader.json)",
                         "give a folder written by: evsel train reader --lora")
    shape = LoraReader.load(reader_folder).config
    return replace(config, init_from=str(reader_folder.absolute()), cut=shape.cut, deepest=shape.deepest,
                   rank=shape.rank, alpha=shape.alpha, max_tokens=shape.max_tokens)


def run_training(engine, out: str, recipe_name: str, options: dict, command: str | None = None,
                 data_dir: str | None = None, on_event=ignore_event) -> dict:
    """`evsel train reader --lora [--resume]`."""
    resume = bool(options.pop("resume", False))
    options.pop("lora", None)
    folder = Path(out)
    saved = folder / "config.json"
    if resume:
        if not saved.is_file():
            raise InputError(f"--resume: {folder} holds no LoRA reader run (no config.json)",
                             "start one with: evsel train reader --lora --out DIR")
        settings = json.loads(saved.read_text())
        changed = {k: v for k, v in options.items() if v is not None and k in RESUMABLE}
        changed["precache_only"] = bool(options.get("precache_only"))  # a resumed run trains unless told again
        config = config_of(LoraTrainConfig, out, {k: v for k, v in settings.items() if k != "out"}, changed)
    else:
        if (folder / "checkpoint").exists() or (folder / "examples.json").exists():
            raise InputError(f"{folder} already holds a LoRA reader run",
                             f"continue it with: evsel train reader --lora --resume --out {folder}, or choose another --out")
        config = config_of(LoraTrainConfig, out, pick_recipe(recipe_name, SMOKE, FULL),
                           {k: v for k, v in options.items() if k in LoraTrainConfig.__dataclass_fields__})
        if config.init_from:
            config = _shaped_as(config, Path(config.init_from))
    import torch

    if config.threads:
        torch.set_num_threads(config.threads)

    def log(line: str) -> None:
        on_event({"type": "log", "message": line})

    folder.mkdir(parents=True, exist_ok=True)
    _atomic_json(saved, asdict(config))
    backbone = engine.backbone
    examples_file = folder / "examples.json"
    if examples_file.is_file():
        data = json.loads(examples_file.read_text())
    else:
        data = build_examples(config, backbone, Path(data_dir) if data_dir else None, on_event)
        _atomic_json(examples_file, data)
    log(f"examples: {len(data['train'])} train ({data['described'].get('no_answer_examples', 0)} no-answer), "
        f"{len(data['dev'])} dev, {len(data['calibration'])} calibration")
    trainer = LoraReaderTrainer(config, backbone, data, command or "", on_event, log)
    if config.precache_only:
        items = [trainer.train[i] for i in trainer.order] + trainer.dev + trainer.calibration
        for i, item in enumerate(items):
            if i % 10 == 0:
                on_event({"type": "progress", "task": "states", "label": "frozen layers", "done": i,
                          "total": len(items)})
            trainer.cache.get(item)
        return {"cached": len(items), "out": str(folder), "steps": trainer.step, "total_steps": config.steps,
                "best_dev": trainer.best}
    return trainer.run()
