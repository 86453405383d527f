"""What the training recipes share: the training sources and the refusal of evaluation sets, the
recipe picker, the config-from-options builder, the warmup-then-linear schedule, the question
groups the QRRanker and BlockSearch trainers draw, and `AdapterTrainer`, their one training loop
(a --minutes budget, dev checks, the best adapter and checkpoints written, a rerun resumes)."""

from __future__ import annotations

import json
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from evsel.errors import InputError
from evsel.models.shared.lora import ADAPTER_FILE

SOURCES = ("fairytaleqa-train", "musique", "hotpotqa", "locomo")
# Their questions are the ones `evsel eval` scores: they train only on one fixed fold
# (evaluation/folds.py), and that adapter is evaluated on the other fold.
FOLDED_SOURCES = ("locomo", "musique", "hotpotqa")
FORBIDDEN = {
    "fairytaleqa-val": "FairytaleQA val reports results and chooses l_c: never train on it",
    "fairytaleqa": "say fairytaleqa-train (FairytaleQA val reports results and is never trained on)",
}


def ignore_event(_event: dict) -> None:
    pass


def check_sources(sources: list[str], fold: int | None = None, doing: str = "train") -> None:
    """Refuse evaluation sets, and a LoCoMo / MuSiQue / HotpotQA source without a fold (its
    questions are the evaluation questions); a fold with no folded source is refused too."""
    from evsel.evaluation.folds import FOLDS

    if fold is not None and fold not in FOLDS:
        raise InputError(f"--fold {fold} does not exist", "use --fold 1 or --fold 2")
    for source in sources:
        if source in FORBIDDEN:
            raise InputError(f"refusing to {doing} on {source!r}: {FORBIDDEN[source]}",
                             f"use one of: {', '.join(SOURCES)}")
        if source in FOLDED_SOURCES and fold is None:
            raise InputError(f"refusing to {doing} on {source!r} without --fold: its questions are the ones "
                             f"`evsel eval {source}` scores",
                             f"add --fold 1 (then evaluate with: evsel eval {source} --fold 2)")
        if source not in SOURCES:
            raise InputError(f"unknown training source {source!r}", f"use one of: {', '.join(SOURCES)}")
    if fold is not None and not any(s in FOLDED_SOURCES for s in sources):
        raise InputError(f"--fold applies to the sources {', '.join(FOLDED_SOURCES)}",
                         "add --source locomo (or musique, hotpotqa), or leave --fold out")


def folded_dataset(source: str, data_dir: Path | None, fold: int | None):
    """A training source's dataset: FairytaleQA train, or one fold of a folded source."""
    from evsel.evaluation.datasets import load_dataset

    if source == "fairytaleqa-train":
        return load_dataset("fairytaleqa", data_dir=data_dir, split="train")
    return load_dataset(source, data_dir=data_dir, fold=fold)


def fold_dev_split(dataset, keys: list[str], rng: random.Random, dev_questions: int) -> tuple[list[str], set[str]]:
    """Dev data from a folded source's own fold: (dev document keys, dev question ids). Several
    documents (LoCoMo's conversations): one held-out document, all its questions; one shared
    corpus (MuSiQue, HotpotQA): `dev_questions` held-out questions, at most a fifth of the fold's
    (its 50 questions are most of the training data). Training takes neither."""
    if len(keys) > 1:
        key = rng.choice(sorted(keys))
        return [key], {q.qid for q in dataset.questions if q.docs and q.docs[0] == key}
    qids = sorted(q.qid for q in dataset.questions if q.docs and q.gold)
    rng.shuffle(qids)
    return [], set(qids[:min(dev_questions, max(1, len(qids) // 5))])


def pick_recipe(name: str, smoke: dict, full: dict) -> dict:
    """A copy of the smoke or the full recipe's settings."""
    if name not in ("smoke", "full"):
        raise InputError(f"unknown recipe {name!r}", "use smoke or full")
    return dict(smoke if name == "smoke" else full)


def config_of(config_class, out: str, settings: dict, options: dict):
    """`config_class` (a training config dataclass) from a recipe's settings with the options that
    were given (not None) over them; an option the config lacks is an error."""
    unknown = sorted(set(options) - set(config_class.__dataclass_fields__))
    if unknown:
        raise InputError(f"unknown training options {', '.join(unknown)}")
    settings = {**settings, **{k: v for k, v in options.items() if v is not None}}
    return config_class(out=str(Path(out)), **{k: v for k, v in settings.items() if k != "out"})


def warmup_then_linear(step: int, lr: float, warmup: int, total: int) -> float:
    """The learning rate at `step`: linear warmup over min(warmup, total / 10) steps, then linear
    decay to 0 at `total`."""
    warmup = min(warmup, max(1, total // 10))
    if step < warmup:
        return lr * (step + 1) / warmup
    return lr * max(0.0, (total - step) / max(1, total - warmup))


def question_groups(config, backbone, data_dir: Path | None, avoid_qids: set[str] = frozenset(),
                    on_event=ignore_event, candidates: int | None = None) -> tuple[list[dict], list[dict], dict]:
    """(train groups, dev groups, description). A group is one document's questions over its
    chunks: {"id", "texts": the document's chunk texts, "questions": [{"id", "question",
    "candidates": BM25 top-K (indices into texts, BM25 order), "rest": the BM25 rest, "units":
    gold units (sets of indices), "gold": positions in candidates}]}. Dev: held-out FairytaleQA
    train stories (never val), none holding a question of `avoid_qids`; with a folded source
    (LoCoMo, MuSiQue, HotpotQA and `config.fold`), held-out data of that same fold instead
    (`fold_dev_split`), so no question of the other fold is ever read. Training questions need a
    gold chunk among their candidates; dev questions are kept either way (recall as eval counts
    it: reranked top-K, then BM25's rest). `config` gives sources, fold (optional), stories,
    dev_stories, questions_per_story, dev_questions_per_story, chunk_tokens, seed and (unless
    `candidates` does) candidates, K. A source other than FairytaleQA takes about stories x
    questions_per_story training questions over all its documents."""
    fold = getattr(config, "fold", None)
    check_sources(config.sources, fold)
    rng = random.Random(config.seed)  # drawn in this order: stories, the fold's dev split, each document's pool
    grouper = QuestionGrouper(config, backbone, config.candidates if candidates is None else candidates, rng,
                              on_event)
    ftqa = folded_dataset("fairytaleqa-train", data_dir, None)
    stories = sorted(ftqa.loaders)
    rng.shuffle(stories)
    described: dict = {"fold": fold}
    folded = [s for s in config.sources if s in FOLDED_SOURCES]
    datasets = {s: folded_dataset(s, data_dir, fold) for s in folded}
    held_keys: dict[str, list[str]] = {}  # a folded source's documents kept for dev
    held_qids: dict[str, set[str]] = {}  # and its dev questions
    if folded:
        source = folded[0]
        dev, described["dev"], held_keys[source], held_qids[source] = _fold_dev(grouper, source, datasets[source],
                                                                                fold)
        train_keys = stories
    else:
        dev, described["dev"] = _story_dev(grouper, ftqa, stories, avoid_qids)
        train_keys = [k for k in stories if k not in described["dev"]["stories"]]
    described["dev"]["questions"] = sum(len(g["questions"]) for g in dev)
    train: list[dict] = []
    for source in config.sources:
        stats: dict = {}
        if source == "fairytaleqa-train":
            dataset, keys = ftqa, train_keys[: config.stories]
            per_doc = config.questions_per_story
        else:
            dataset = datasets[source]
            keys = [k for k in sorted(dataset.loaders) if k not in held_keys.get(source, ())]
            per_doc = -(-config.stories * config.questions_per_story // max(1, len(keys)))
        got = grouper.groups(dataset, keys, per_doc, True, source, stats, skip=held_qids.get(source, set()))
        train += got
        described[source] = {"documents": len(keys), "questions": sum(len(g["questions"]) for g in got),
                             "question_ids": _question_ids(got), **stats}
    return train, dev, described


def _question_ids(groups: list[dict]) -> list[str]:
    return [q["id"] for g in groups for q in g["questions"]]


def _fold_dev(grouper: "QuestionGrouper", source: str, dataset,
              fold: int | None) -> tuple[list[dict], dict, list[str], set[str]]:
    """Dev groups of a folded source, from data of the same fold held out (`fold_dev_split`): (the
    groups, their description, the documents held out, the questions held out)."""
    config = grouper.config
    dev_per_doc = config.dev_stories * config.dev_questions_per_story
    keys = sorted(dataset.loaders)
    held_keys, held_qids = fold_dev_split(dataset, keys, grouper.rng, dev_per_doc)
    dev_keys = held_keys or keys
    stats: dict = {}
    dev = grouper.groups(dataset, dev_keys, dev_per_doc, False, source, stats, only=held_qids or None)
    described = {"source": f"{source} fold {fold} (held out: "
                 + (f"documents {', '.join(held_keys)})" if held_keys else "questions)"),
                 "documents": dev_keys, "question_ids": _question_ids(dev), **stats}
    return dev, described, held_keys, held_qids


def _story_dev(grouper: "QuestionGrouper", ftqa, stories: list[str], avoid_qids: set[str]) -> tuple[list[dict], dict]:
    """Dev groups from held-out FairytaleQA train stories, none holding a question of `avoid_qids`."""
    config = grouper.config
    avoid = {q.docs[0] for q in ftqa.questions if q.qid in avoid_qids and q.docs}
    dev_keys = [k for k in stories if k not in avoid][: config.dev_stories]
    stats: dict = {}
    dev = grouper.groups(ftqa, dev_keys, config.dev_questions_per_story, False, "fairytaleqa-train", stats)
    return dev, {"source": "fairytaleqa-train (held-out stories)", "stories": dev_keys,
                 "question_ids": _question_ids(dev), **stats}


class QuestionGrouper:
    """Builds question groups (see `question_groups`): a document's questions with BM25's top-K
    candidates among its chunks and the gold chunks' positions in them."""

    def __init__(self, config, backbone, top_k: int, rng: random.Random, on_event=ignore_event):
        from evsel.models.selectors import SelectorContext, get_selector

        self.config, self.backbone, self.top_k, self.rng, self.on_event = config, backbone, top_k, rng, on_event
        self.bm25 = get_selector("bm25", SelectorContext(load_backbone=lambda: backbone, states=None))

    def groups(self, dataset, keys: list[str], per_doc: int, need_gold: bool, source: str, stats: dict,
               only: set[str] | None = None, skip: set[str] = frozenset()) -> list[dict]:
        """At most `per_doc` questions of each document in `keys` (drawn at random), grouped;
        `stats` counts the questions left out and why."""
        from evsel.evaluation.runner import build_corpus

        by_doc: dict[str, list] = {}
        for q in dataset.questions:
            if q.docs and q.gold and (only is None or q.qid in only) and q.qid not in skip:
                by_doc.setdefault(q.docs[0], []).append(q)
        corpus = build_corpus(dataset, keys, self.backbone, self.config.chunk_tokens, self.on_event)
        out = []
        single = len(dataset.loaders) == 1  # MuSiQue / HotpotQA: one corpus document, a group per question
        for key in keys:
            chunks = corpus.chunks[key]
            pool = list(by_doc.get(key, []))
            self.rng.shuffle(pool)
            questions = self.document_questions(pool, corpus, chunks, per_doc, need_gold, source, stats)
            if single:
                out += [_own_group(item, chunks) for item in questions]
            elif questions:
                out.append({"id": f"{source}/{key}", "texts": [c.text for c in chunks], "questions": questions})
        return out

    def document_questions(self, pool: list, corpus, chunks: list, per_doc: int, need_gold: bool, source: str,
                           stats: dict) -> list[dict]:
        """The first `per_doc` questions of `pool` whose gold resolves onto `chunks` (and, with
        `need_gold`, lies among the candidates without filling them)."""
        from evsel.evaluation.runner import gold_units

        index = {c.id: i for i, c in enumerate(chunks)}
        questions = []
        for q in pool:
            if len(questions) >= per_doc:
                break
            units = gold_units(q, corpus, {})
            if not units:
                stats["gold_unresolved"] = stats.get("gold_unresolved", 0) + 1
                continue
            ranked = [index[s.chunk.id] for s in self.bm25.rank(q.question, chunks, len(chunks))]
            cands = ranked[:self.top_k]
            units = [sorted(index[c] for c in u) for u in units]
            gold = [i for i, c in enumerate(cands) if any(c in u for u in units)]
            if need_gold and (not gold or len(gold) == len(cands)):
                stats["gold_not_in_candidates"] = stats.get("gold_not_in_candidates", 0) + 1
                continue
            questions.append({"id": f"{source}/{q.qid}", "question": q.question, "candidates": cands,
                              "rest": ranked[self.top_k:], "units": units, "gold": gold})
        return questions


def _own_group(item: dict, chunks: list) -> dict:
    """One question as its own group over just its candidates' chunks (a corpus of one huge
    document: its other chunks are never read)."""
    used = sorted(set(item["candidates"]))
    remap = {c: i for i, c in enumerate(used)}
    return {"id": item["id"], "texts": [chunks[c].text for c in used], "questions": [{
        **item, "candidates": [remap[c] for c in item["candidates"]], "rest": [],
        "units": [[remap[c] for c in u if c in remap] for u in item["units"]]}]}


def write_record(handle, record: dict, log: Callable[[str], None], nested: bool = True) -> None:
    """One line of log.jsonl, and the record as `key=value` words to `log` (without the values
    that are dicts unless `nested`)."""
    handle.write(json.dumps(record) + "\n")
    handle.flush()
    shown = record if nested else {k: v for k, v in record.items() if not isinstance(v, dict)}
    log(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items()))


class AdapterTrainer:
    """One training run of a LoRA adapter into OUT. A subclass's `setup` draws its data and calls
    `start_or_resume`; it gives `train_step` (one optimizer step between `begin_step` and
    `end_step`, returning its log record, `lr` included), `dev_metrics` and `save_best`. `run` is
    the loop: the --minutes budget, a dev check every `dev_every` steps and at the end, the best
    adapter by `selection_key` (then MRR) written to OUT, a checkpoint every `checkpoint_every`
    steps and when stopped early (a rerun resumes from it), log.jsonl and summary.json."""

    selection_key = "recall@1"
    progress_label: str | None = None  # a progress event before each step, with this label
    log_nested = False  # the console line of a record shows its dict values too
    betas = (0.9, 0.999)  # AdamW's
    json_indent = 1  # of config.json and summary.json
    stops_at_minutes = True  # --minutes stops the loop (False: the subclass fits its steps to it instead)
    first_check_without_dev = True  # a step-0 record and best/ even without dev data

    def __init__(self, config, backbone, command: str = "", on_event=ignore_event,
                 log: Callable[[str], None] = lambda line: None):
        self.config = config
        self.backbone = backbone
        self.command = command
        self.on_event = on_event
        self.log = log
        self.out = Path(config.out)
        self.dev: list = []

    def start_or_resume(self, load: Callable, new: Callable) -> dict | None:
        """The adapter, step and best dev metrics from OUT/checkpoint (`load(folder)`, trainable
        again; returns its trainer.json) or fresh (`new()`; returns None), and the AdamW optimizer
        over the adapter (its state from the checkpoint when there)."""
        import torch

        cfg = self.config
        resume = self.out / "checkpoint"
        state = None
        if (resume / ADAPTER_FILE).is_file():
            self.adapter = load(resume)
            for p in self.trainable():
                p.requires_grad_(True)
            state = json.loads((resume / "trainer.json").read_text())
            self.step, self.best = state["step"], state.get("best")
        else:
            self.adapter = new()
            self.step, self.best = 0, None
        self.total_steps = cfg.steps
        self.optimizer = torch.optim.AdamW(self.trainable(), lr=cfg.lr, betas=self.betas,
                                           weight_decay=cfg.weight_decay)
        if (resume / "optimizer.pt").is_file():
            # read onto the CPU (a run may resume on another device); load_state_dict moves the
            # state to the parameters' device
            self.optimizer.load_state_dict(torch.load(resume / "optimizer.pt", map_location="cpu"))
        return state

    def trainable(self) -> list:
        """The parameters the optimizer steps and the gradient clip reads, in a fixed order."""
        return list(self.adapter.parameters())

    def lr_at(self, step: int) -> float:
        return warmup_then_linear(step, self.config.lr, self.config.warmup, self.total_steps)

    def begin_step(self) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr_at(self.step)
        self.optimizer.zero_grad(set_to_none=True)

    def end_step(self) -> float:
        """Clip, step the optimizer, count the step; returns the gradient norm before clipping."""
        import torch

        norm = float(torch.nn.utils.clip_grad_norm_(self.trainable(), self.config.clip))
        self.optimizer.step()
        self.step += 1
        return norm

    def train_step(self) -> dict:
        raise NotImplementedError

    def dev_metrics(self) -> dict:
        raise NotImplementedError

    def save_best(self, dev: dict) -> None:
        raise NotImplementedError

    def is_better(self, dev: dict) -> bool:
        if self.best is None:
            return True
        if not dev:
            return False
        key = self.selection_key
        return (dev[key], dev["mrr"]) > (self.best.get(key, -1), self.best.get("mrr", -1))

    def trainer_state(self) -> dict:
        """What OUT/checkpoint/trainer.json holds besides the adapter and the optimizer."""
        return {"step": self.step, "best": self.best}

    def save_checkpoint(self) -> None:
        import torch

        folder = self.out / "checkpoint"
        tmp = folder.with_name("checkpoint.tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        self.save_adapter(tmp)
        torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
        (tmp / "trainer.json").write_text(json.dumps(self.trainer_state()) + "\n")
        old = folder.with_name("checkpoint.old")
        if old.exists():
            shutil.rmtree(old)
        if folder.exists():
            folder.rename(old)
        tmp.rename(folder)
        if old.exists():
            shutil.rmtree(old)

    def save_adapter(self, folder: Path) -> None:
        """Write the adapter into a checkpoint folder."""
        self.adapter.save(folder, {"step": self.step})

    def first_record(self, dev: dict) -> dict:
        """The log record of step 0 (before any training)."""
        return {"step": 0, **{f"dev_{k}": v for k, v in dev.items()}}

    def summary(self, last: dict) -> dict:
        """What `run` returns and writes to summary.json (the seconds added)."""
        return {"steps": self.step, "total_steps": self.total_steps, "best_dev": self.best, "last_dev": last,
                "out": str(self.out)}

    def run(self) -> dict:
        cfg = self.config
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "config.json").write_text(json.dumps(asdict(cfg), indent=self.json_indent) + "\n")
        started = self.started = time.perf_counter()
        last: dict = {}
        with open(self.out / "log.jsonl", "a", encoding="utf-8") as log_file:
            if self.step == 0 and (self.dev or self.first_check_without_dev):
                last = self.dev_metrics() if self.dev else {}
                write_record(log_file, self.first_record(last), self.log, self.log_nested)
                self.best = last or None
                self.save_best(last)
            while self.step < self.total_steps:
                out_of_time = cfg.minutes is not None and time.perf_counter() - started > cfg.minutes * 60
                if self.stops_at_minutes and out_of_time:
                    self.log(f"--minutes {cfg.minutes:g} reached at step {self.step}; rerun to continue")
                    break
                t = time.perf_counter()
                if self.progress_label:
                    self.on_event({"type": "progress", "task": "train", "label": self.progress_label,
                                   "done": self.step, "total": self.total_steps})
                record = {"step": self.step + 1, **self.train_step(), "step_s": round(time.perf_counter() - t, 2),
                          "elapsed_s": round(time.perf_counter() - started, 1)}
                final = self.step >= self.total_steps
                if self.dev and ((cfg.dev_every and self.step % cfg.dev_every == 0) or final):
                    last = self.dev_metrics()
                    record.update({f"dev_{k}": v for k, v in last.items()})
                    if self.is_better(last):
                        self.best = last
                        self.save_best(last)
                write_record(log_file, record, self.log, self.log_nested)
                if self.step % cfg.checkpoint_every == 0 or final:
                    self.save_checkpoint()
            if self.step < self.total_steps:  # stopped by --minutes
                if self.dev and self.step and not (cfg.dev_every and self.step % cfg.dev_every == 0):
                    # the steps since the last dev check count too: a short budget may hold no check
                    last = self.dev_metrics()
                    write_record(log_file, {"step": self.step, **{f"dev_{k}": v for k, v in last.items()}},
                                 self.log, self.log_nested)
                    if self.is_better(last):
                        self.best = last
                        self.save_best(last)
                self.save_checkpoint()
        summary = {**self.summary(last), "seconds": round(time.perf_counter() - started, 1)}
        (self.out / "summary.json").write_text(json.dumps(summary, indent=self.json_indent) + "\n")
        return summary
