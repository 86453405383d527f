"""`evsel train reader`: the answer-span head (models/reader/span_head.py) on the frozen backbone's states.

Each training example is what `evsel ask` shows the reader: a question and BM25's top passages
over evsel's own chunks of its document (the other passages are the negatives: the span
softmax runs across all of them). The answer is located in those passages as whole words: the
reference itself (case and spacing aside), else, for the long free-form references of FairytaleQA
and LoCoMo, the stretch of at most 24 words with token F1 >= LOCATE_F1 to it. When BM25 misses
every passage that holds it, the best passage of the question's gold evidence that does replaces
the last one, so the head also learns from questions the retriever gets wrong. Questions whose
answer is in no passage are left out.

Sources: FairytaleQA train (dev: held-out train stories, never val), and LoCoMo, MuSiQue, HotpotQA
on one --fold (the other fold is what `evsel eval --fold` scores). LoCoMo's adversarial questions
are never trained on: with one held-out conversation's answerable questions they choose the
abstention threshold (the best-span probability below which dialogue answers abstain).

The backbone's states of every example are computed once and cached under OUT/states (fp16, one
file per example, keyed by the question, passages and layers), so a rerun, or a run stopped by
--minutes, resumes without recomputing them.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .common import AdapterTrainer, check_sources, config_of, folded_dataset, ignore_event, pick_recipe

LOCATE_F1 = 0.75
LORA_ONLY = ("lora", "resume", "precache_only", "cut", "deepest", "rank", "no_answer_share", "dev_every",
             "init_from")  # options of --lora


@dataclass
class TrainConfig:
    out: str = ""
    sources: list[str] = field(default_factory=lambda: ["fairytaleqa-train"])
    fold: int | None = None
    stories: int = 150  # FairytaleQA train stories trained on
    questions_per_story: int = 8
    dev_stories: int = 12  # held-out FairytaleQA train stories
    dev_questions_per_story: int = 8
    folded_questions: int = 400  # per folded source (LoCoMo, MuSiQue, HotpotQA)
    calibration_questions: int = 200  # LoCoMo: of the held-out conversation, for the threshold
    top_n: int = 5
    layers: list[int] = field(default_factory=lambda: [14, 22])
    width: int = 256
    heads: int = 4
    dropout: float = 0.1
    batch: int = 8  # questions per step
    steps: int = 1500
    minutes: float | None = None
    lr: float = 1e-3
    warmup: int = 100
    weight_decay: float = 0.01
    clip: float = 1.0
    dev_every: int = 250
    checkpoint_every: int = 250
    min_precision: float = 0.7  # of the abstentions on the calibration questions
    chunk_tokens: int = 140
    threads: int | None = None
    seed: int = 0
    rescore_questions: int = 120  # per source: held-out questions the answer step's weights are chosen on
    rescore_only: bool = False  # keep the head in OUT, choose only those weights


SMOKE = {"stories": 3, "questions_per_story": 3, "dev_stories": 1, "dev_questions_per_story": 3,
         "folded_questions": 4, "calibration_questions": 6, "steps": 4, "batch": 2, "dev_every": 2,
         "checkpoint_every": 2, "warmup": 1, "rescore_questions": 3}
FULL = {}


def locate_answer(passages: list[str], answers: list[str]) -> list[tuple[int, int, int]]:
    """(passage, start, end) of every place the passages hold a reference as whole words; else
    the best near-copy (token F1 >= LOCATE_F1) of the first reference that has one."""
    import re

    from evsel.answer import grounding

    found = []
    for answer in answers:
        words = answer.strip().strip(".").split()
        if not words or len(words) > 24:
            continue
        pattern = re.compile(r"(?<!\w)" + r"\s+".join(re.escape(w) for w in words) + r"(?!\w)", re.I)
        for p, text in enumerate(passages):
            found += [(p, m.start(), m.end()) for m in pattern.finditer(text)]
    if found:
        return sorted(set(found))
    for answer in answers:
        best = max(((grounding.snap(answer, text), p) for p, text in enumerate(passages)), default=None,
                   key=lambda pair: pair[0][0])
        if best is not None and best[0][0] >= LOCATE_F1:
            (_, a, b), p = best
            return [(p, a, b)]
    return []


def training_examples(config: TrainConfig, backbone, data_dir: Path | None, on_event) -> tuple[list, list, list, dict]:
    """(train, dev, calibration, description): examples {"id", "question", "passages", "spans",
    "answers", "dialogue", "unanswerable"}."""
    check_sources(config.sources, config.fold)
    rng = random.Random(config.seed)  # drawn in this order: each source's documents, then each part's questions
    maker = ExampleMaker(config, backbone)
    train: list[dict] = []
    dev: list[dict] = []
    calibration: list[dict] = []
    described: dict = {"fold": config.fold}
    for source in config.sources:
        made, described[source] = _source_examples(maker, source, rng, data_dir, on_event)
        train += made["train"]
        (calibration if source == "locomo" else dev).extend(made["dev"])
        described[source]["question_ids"] = [e["id"] for e in train if e["id"].startswith(source + "/")]
    if not dev and len(train) > 1:  # no FairytaleQA: a tenth of the training questions checks the head
        rng.shuffle(train)
        dev, train = train[: max(1, len(train) // 10)], train[max(1, len(train) // 10):]
        for source in config.sources:
            described[source]["question_ids"] = [e["id"] for e in train if e["id"].startswith(source + "/")]
    described["dev_question_ids"] = [e["id"] for e in dev]
    described["calibration_question_ids"] = [e["id"] for e in calibration]
    return train, dev, calibration, described


def _held_out_split(source: str, keys: list[str], config: TrainConfig) -> tuple[list[str], list[str], dict]:
    """(held-out documents, training documents, questions per document of each part: none = no quota).
    FairytaleQA holds out dev stories; LoCoMo one conversation, whose questions calibrate abstention."""
    if source == "fairytaleqa-train":
        return (keys[: config.dev_stories], keys[config.dev_stories:][: config.stories],
                {"dev": config.dev_questions_per_story, "train": config.questions_per_story})
    if source == "locomo":
        return keys[:1], keys[1:], {}
    return [], keys, {}


def _source_examples(maker: "ExampleMaker", source: str, rng: random.Random, data_dir: Path | None,
                     on_event) -> tuple[dict[str, list[dict]], dict]:
    """({"dev": examples, "train": examples} of one source, its description; the caller fills in
    its question ids)."""
    from evsel.evaluation.runner import build_corpus

    config = maker.config
    dataset = folded_dataset(source, Path(data_dir) if data_dir else None,
                             config.fold if source != "fairytaleqa-train" else None)
    keys = sorted(dataset.loaders)
    rng.shuffle(keys)
    stats = {"located": 0, "not_located": 0}
    dev_keys, train_keys, quotas = _held_out_split(source, keys, config)
    corpus = build_corpus(dataset, dev_keys + train_keys, maker.backbone, config.chunk_tokens, on_event)
    by_doc: dict[str, list] = {}
    for q in dataset.questions:
        if q.docs:
            by_doc.setdefault(q.docs[0], []).append(q)
    made = {}
    for part, part_keys in (("dev", dev_keys), ("train", train_keys)):
        pool = [q for k in part_keys for q in by_doc.get(k, [])]
        rng.shuffle(pool)
        limit = (config.calibration_questions if part == "dev" else config.folded_questions) \
            if source != "fairytaleqa-train" else None
        made[part] = maker.part(source, part, pool, corpus, quotas.get(part), limit, stats, on_event)
    return made, {"train_documents": len(train_keys), "held_out_documents": dev_keys, "question_ids": [], **stats}


class ExampleMaker:
    """A question's training example: BM25's top passages of its document with the answer located
    in them."""

    def __init__(self, config: TrainConfig, backbone):
        from evsel.models.selectors import SelectorContext, get_selector

        self.config, self.backbone = config, backbone
        self.bm25 = get_selector("bm25", SelectorContext(load_backbone=lambda: backbone, states=None))

    def part(self, source: str, part: str, pool: list, corpus, quota: int | None, limit: int | None, stats: dict,
             on_event) -> list[dict]:
        """Examples of `pool`'s questions in order: at most `limit`, at most `quota` a document;
        adversarial questions only held out, as unanswerable examples."""
        made: list[dict] = []
        per_doc: dict[str, int] = {}
        for i, q in enumerate(pool):
            if limit is not None and len(made) >= limit:
                break
            if quota is not None and per_doc.get(q.docs[0], 0) >= quota:
                continue
            on_event({"type": "progress", "task": "examples", "label": f"{source} {part}", "done": i,
                      "total": len(pool)})
            adversarial = q.group == "adversarial"
            if adversarial and part == "train":
                continue
            chunks = corpus.chunks[q.docs[0]]
            got = self.example(source, q, chunks, corpus, keep_unanswerable=adversarial) \
                if q.answers or adversarial else None
            if got is None:
                stats["not_located"] += 1
                continue
            stats["located"] += 1
            per_doc[q.docs[0]] = per_doc.get(q.docs[0], 0) + 1
            made.append(got)
        return made

    def example(self, source: str, q, chunks: list, corpus, keep_unanswerable: bool = False) -> dict | None:
        """The example, or None when the answer is in no shown passage nor in a gold one."""
        top_n = self.config.top_n
        ranked = self.bm25.rank(q.question, chunks, top_n * 3)
        shown = [s.chunk for s in ranked[:top_n]]
        spare = [s.chunk.text for s in ranked[top_n:]]  # near misses: the LoRA reader's no-answer examples
        dialogue = any(c.speakers for c in shown)
        spans = [] if keep_unanswerable else locate_answer([c.text for c in shown], q.answers)
        if not spans and not keep_unanswerable:  # the retriever missed it: a gold passage that holds it takes the last place
            shown, spans = _with_gold_passage(q, chunks, corpus, shown, top_n)
            if not spans:
                return None
        return {"id": f"{source}/{q.qid}", "question": q.question, "passages": [c.text for c in shown],
                "spans": spans, "answers": list(q.answers), "dialogue": dialogue, "unanswerable": keep_unanswerable,
                "spare": spare}


def _with_gold_passage(q, chunks: list, corpus, shown: list, top_n: int) -> tuple[list, list]:
    """(passages, spans) with the first gold chunk that holds an answer in the last place; no
    spans when none does."""
    from evsel.evaluation.runner import gold_units

    by_id = {c.id: c for c in chunks}
    for unit in gold_units(q, corpus, {}):
        for cid in sorted(unit):
            chunk = by_id.get(cid)
            if chunk is None or chunk in shown:
                continue
            got = locate_answer([chunk.text], q.answers)
            if got:
                shown = shown[:-1] + [chunk] if len(shown) >= top_n else shown + [chunk]
                return shown, [(len(shown) - 1, a, b) for _, a, b in got]
    return shown, []


class StateCache:
    """The frozen backbone's states of each example, once: OUT/states/<key>.safetensors (fp16)."""

    def __init__(self, folder: Path, backbone, layers: list[int]):
        self.folder = folder
        self.backbone = backbone
        self.layers = layers
        folder.mkdir(parents=True, exist_ok=True)

    def key(self, item: dict) -> str:
        blob = json.dumps([self.backbone.fingerprint, self.layers, item["question"], item["passages"]])
        return hashlib.sha256(blob.encode()).hexdigest()[:24]

    def get(self, item: dict):
        """(states (P, T, D) float, mask (P, T), encoded)."""
        import torch
        from safetensors.torch import load_file, save_file

        from evsel.models.reader.span_head import backbone_states, encode

        encoded = encode(self.backbone.tokenizer, self.backbone.bos_id(), item["question"], item["passages"])
        path = self.folder / f"{self.key(item)}.safetensors"
        if path.is_file():
            got = load_file(str(path))
            return got["states"].float(), got["mask"].bool(), encoded
        states, mask = backbone_states(self.backbone.model, encoded, self.layers)
        tmp = path.with_suffix(".tmp")
        save_file({"states": states.half().contiguous(), "mask": mask.to(torch.uint8)}, str(tmp))
        tmp.rename(path)
        return states, mask, encoded


def span_f1(prediction: str, answers: list[str]) -> float:
    from evsel.evaluation import metrics

    return metrics.token_f1(prediction, answers) if answers else 0.0


class ReaderTrainer(AdapterTrainer):
    selection_key = "f1"
    progress_label = "reader"

    def setup(self, train: list, dev: list, calibration: list, described: dict) -> None:
        import torch

        from evsel.models.reader.span_head import Reader, ReaderConfig

        cfg = self.config
        if not train:
            from evsel.errors import InputError

            raise InputError("no training question has its answer in the passages shown",
                             "add --source or more --stories")
        self.train_items, self.dev, self.calibration, self.described = train, dev, calibration, described
        self.cache = StateCache(self.out / "states", self.backbone, list(cfg.layers))
        d_model = self.backbone.model.config.hidden_size
        reader_config = ReaderConfig(layers=list(cfg.layers), width=cfg.width, heads=cfg.heads, dropout=cfg.dropout)
        self.start_or_resume(lambda folder: Reader.load(folder, d_model), lambda: Reader(reader_config, d_model))
        self.adapter.head.train()
        self.order = list(range(len(train)))
        random.Random(cfg.seed).shuffle(self.order)
        self.started = time.perf_counter()
        items = train + dev + calibration
        for i, item in enumerate(items):  # every state once, up front: the cache a rerun resumes from
            if i % 10 == 0:
                self.on_event({"type": "progress", "task": "states", "label": "backbone states", "done": i,
                               "total": len(items)})
            self.cache.get(item)
        torch.manual_seed(cfg.seed)

    def loss_of(self, item: dict):
        import torch

        from evsel.models.reader.span_head import gold_targets, span_mask

        states, mask, encoded = self.cache.get(item)
        allowed = span_mask(encoded, states.shape[1], self.adapter.config.max_span)
        target = gold_targets(encoded, item["spans"], states.shape[1], self.adapter.config.max_span) & allowed
        if not target.any():
            return None
        raw = self.adapter.head(states, mask).masked_fill(~allowed, float("-inf"))
        return torch.logsumexp(raw.reshape(-1), 0) - torch.logsumexp(raw[target], 0)

    def train_step(self) -> dict:
        cfg = self.config
        self.adapter.head.train()
        self.begin_step()
        losses = []
        for k in range(cfg.batch):
            item = self.train_items[self.order[(self.step * cfg.batch + k) % len(self.order)]]
            loss = self.loss_of(item)
            if loss is not None:
                (loss / cfg.batch).backward()
                losses.append(loss.item())
        norm = self.end_step()
        return {"loss": sum(losses) / max(1, len(losses)), "grad_norm": round(norm, 3), "lr": self.lr_at(self.step)}

    def best_spans(self, items: list[dict]) -> list:
        """(text, probability) of the head's best span of each item, as `evsel ask` reads it."""
        import torch

        from evsel.models.reader.span_head import Reading, span_mask

        self.adapter.head.eval()
        out = []
        with torch.inference_mode():
            for item in items:
                states, mask, encoded = self.cache.get(item)
                allowed = span_mask(encoded, states.shape[1], self.adapter.config.max_span)
                [best] = Reading(item["passages"], encoded, self.adapter.scores(states, mask, allowed), allowed).top(1)
                out.append((best.text, best.probability))
        self.adapter.head.train()
        return out

    def dev_metrics(self) -> dict:
        got = self.best_spans(self.dev)
        f1 = [span_f1(text, item["answers"]) for (text, _), item in zip(got, self.dev)]
        return {"f1": sum(f1) / max(1, len(f1)), "questions": len(f1)}

    def is_better(self, dev: dict) -> bool:
        return self.best is None or (bool(dev) and dev["f1"] > self.best.get("f1", -1))

    def calibrate(self) -> dict:
        """The abstention threshold on the calibration questions: the highest share of adversarial
        questions abstained on with at least `min_precision` of the abstentions adversarial; 0 (never
        abstain) when no threshold reaches it or there are no calibration questions."""
        if not self.calibration:
            return {"abstain_below": 0.0, "why": "no calibration questions (train with --source locomo)"}
        got = self.best_spans(self.calibration)
        rows = [(prob, item["unanswerable"]) for (_, prob), item in zip(got, self.calibration)]
        targets = sum(1 for _, bad in rows if bad)
        best = {"abstain_below": 0.0, "precision": None, "recall": 0.0}
        for threshold in sorted({p for p, _ in rows}):
            below = [bad for p, bad in rows if p < threshold]
            if not below:
                continue
            precision = sum(below) / len(below)
            recall = sum(below) / max(1, targets)
            if precision >= self.config.min_precision and recall > best["recall"]:
                best = {"abstain_below": threshold, "precision": precision, "recall": recall}
        best.update(questions=len(rows), unanswerable=targets)
        return best

    def save_best(self, dev: dict) -> None:
        self.adapter.save(self.out, {"trained_on": self.described, "dev": dev, "command": self.command})

    def summary(self, last: dict) -> dict:
        calibration = self.calibrate_best()
        return {"steps": self.step, "total_steps": self.total_steps, "best_dev": self.best, "last_dev": last,
                "abstention": calibration, "out": str(self.out)}

    def calibrate_best(self) -> dict:
        """Calibrate the best head (the one written to OUT) and record its threshold there."""
        from evsel.models.reader.span_head import Reader

        current = self.adapter
        best = Reader.load(self.out, current.d_model)
        self.adapter = best
        try:
            calibration = self.calibrate()
        finally:
            self.adapter = current
        best.meta.update(abstain_below=calibration["abstain_below"], abstention=calibration)
        best.save(self.out)
        return calibration


# the grid the answer step's weights are chosen on (models/reader.Reader.rescore_weights)
# (a whole sentence is too long for the head: it competes from the unread floor, -25, hence its range)
RESCORE_GRID = {"typed": (0.0, 1.0, 2.0, 3.0, 4.0), "support": (0.0, 2.0, 4.0, 6.0, 8.0),
                "repeats": (0.0, -1.0, -2.0, -4.0), "long": (0.0, -0.1, -0.3), "sentence": (0.0, 18.0, 21.0, 24.0)}
PHRASE_TYPES = ("person", "place", "number", "date", "organisation")  # may get their own weight set
MIN_GROUP_QUESTIONS = 10  # dev questions a group needs to get its own weights


def rescore_examples(config: TrainConfig, backbone, trained_on: dict, data_dir: Path | None, on_event) -> list[dict]:
    """Held-out questions of every source the head was trained on, each with BM25's top passages
    as `evsel ask` reads them (prose widened by the chunks beside them, evsel/answer/windows.py): FairytaleQA's held-out train stories, LoCoMo's held-out conversation
    (answerable questions), and the fold's MuSiQue / HotpotQA questions the head never trained on.
    {"id", "source", "question", "answers", "chunks"}."""
    from evsel.evaluation.runner import build_corpus
    from evsel.models.selectors import SelectorContext, get_selector
    from evsel.answer.windows import neighbours_of, reading_windows

    bm25 = get_selector("bm25", SelectorContext(load_backbone=lambda: backbone, states=None))
    rng = random.Random(config.seed + 1)
    out = []
    for source in config.sources:
        seen = trained_on.get(source, {})
        dataset = folded_dataset(source, Path(data_dir) if data_dir else None,
                                 config.fold if source != "fairytaleqa-train" else None)
        trained = set(seen.get("question_ids", [])) | set(trained_on.get("dev_question_ids", []))
        held_out = set(seen.get("held_out_documents", []))  # FairytaleQA's dev stories, LoCoMo's conversation
        pool = [q for q in dataset.questions if q.answers and q.docs and q.group != "adversarial"
                and (q.docs[0] in held_out if held_out else f"{source}/{q.qid}" not in trained)]
        rng.shuffle(pool)
        pool = pool[: config.rescore_questions]
        keys = sorted({q.docs[0] for q in pool})
        corpus = build_corpus(dataset, keys, backbone, config.chunk_tokens, on_event)
        for q in pool:
            chunks = corpus.chunks[q.docs[0]]
            shown = bm25.rank(q.question, chunks, config.top_n)[: config.top_n]
            read = [s.chunk for s in shown]
            if not any(c.speakers for c in read):  # prose is read with the chunks beside it, as ask reads it
                read = [w.as_chunk() for w in reading_windows(shown, neighbours_of(chunks))]
            out.append({"id": f"{source}/{q.qid}", "source": source, "question": q.question,
                        "answers": list(q.answers), "chunks": read})
    return out


def candidate_table(reader, backbone, examples: list[dict], cache_dir: Path, on_event) -> list[dict]:
    """Per example: its answer type and every candidate span's reader log-probability, features and
    token F1 to the references, as the answer step sees them. Each example's reading (the span
    log-probabilities, one backbone pass) is cached under cache_dir, so the candidates and the
    weights can be chosen again at no backbone cost."""
    from evsel.answer import grounding
    from evsel.answer.step import candidate_spans, reader_answers

    cache_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for i, item in enumerate(examples):
        if i % 10 == 0:
            on_event({"type": "progress", "task": "rescore", "label": "reading held-out questions", "done": i,
                      "total": len(examples)})
        asked = grounding.answer_type(item["question"])
        if not reader_answers(item["question"], asked, any(c.speakers for c in item["chunks"])):
            continue  # the answer step answers it without the reader
        found = grounding.sentences(item["chunks"])
        ranked = grounding.rank_sentences(item["question"], found)
        candidates = []
        if ranked and grounding.support(item["question"], ranked[0][1]) > 0:
            reading = _cached_reading(reader, backbone, item["question"], [c.text for c in item["chunks"]], cache_dir)
            candidates = [{"logp": c.reader_logp, "features": c.features(), "f1": span_f1(c.text, item["answers"])}
                          for c in candidate_spans(reading, item["question"], asked, found, ranked)]
        rows.append({"id": item["id"], "source": item["source"], "type": asked, "candidates": candidates})
    return rows


def _cached_reading(reader, backbone, question: str, passages: list[str], cache_dir: Path):
    import torch

    from evsel.models.reader.span_head import Encoded, Reading

    blob = json.dumps([backbone.fingerprint, reader.meta.get("dev"), question, passages])
    path = cache_dir / f"{hashlib.sha256(blob.encode()).hexdigest()[:24]}.pt"
    if path.is_file():
        got = torch.load(path, weights_only=True)
        return Reading(passages, Encoded(**got["encoded"]), got["logp"], got["allowed"])
    reading = reader.reading(backbone, question, passages)
    tmp = path.with_suffix(".tmp")
    torch.save({"encoded": asdict(reading.encoded), "logp": reading.logp, "allowed": reading.allowed}, tmp)
    tmp.rename(path)
    return reading


def _f1_per_weights(rows: list[dict], grid: list[dict]):
    """(len(grid),) the F1 of the best-scored candidate under each weight set, averaged per source,
    then over sources (so a source with many questions does not choose for the others)."""
    import numpy as np

    from evsel.answer.step import UNREAD_LOGP

    names = list(RESCORE_GRID)
    weights = np.array([[w[n] for n in names] for w in grid])  # (G, F)
    per_source: dict[str, list] = {}
    for row in rows:
        if not row["candidates"]:
            got = np.zeros(len(grid))
        else:
            base = np.array([max(c["logp"], UNREAD_LOGP) for c in row["candidates"]])  # (N,)
            features = np.array([[c["features"].get(n, 0.0) for n in names] for c in row["candidates"]])  # (N, F)
            f1 = np.array([c["f1"] for c in row["candidates"]])
            got = f1[(base[:, None] + features @ weights.T).argmax(0)]  # (G,)
        per_source.setdefault(row["source"], []).append(got)
    return np.mean([np.mean(v, axis=0) for v in per_source.values()], axis=0)


def choose_rescoring(rows: list[dict], min_group: int = MIN_GROUP_QUESTIONS) -> dict:
    """One weight set by dev F1 over the grid on every question ("*"), and one for the phrase
    questions (PHRASE_TYPES) when at least `min_group` of them say what suits them (fewer: they
    share "*"); the reader alone (all weights 0, grid[0]) beside each; ties go to smaller weights."""
    import itertools

    names = list(RESCORE_GRID)
    grid = [dict(zip(names, values)) for values in itertools.product(*(RESCORE_GRID[n] for n in names))]
    report = {}

    def fit(group: str, part: list[dict]) -> dict:
        f1 = _f1_per_weights(part, grid)
        best = int(f1.argmax())
        report[group] = {"questions": len(part), "f1_reader_alone": round(float(f1[0]), 4),
                         "f1": round(float(f1[best]), 4), "weights": grid[best]}
        return grid[best]

    chosen = {"*": fit("*", rows)} if rows else {}
    phrase = [r for r in rows if r["type"] in PHRASE_TYPES]
    if len(phrase) >= min_group:
        weights = fit("phrase", phrase)
        chosen.update({kind: weights for kind in PHRASE_TYPES})
    elif phrase:  # too few to choose on: what the shared weights give them
        f1 = _f1_per_weights(phrase, [grid[0], chosen["*"]])
        report["phrase"] = {"questions": len(phrase), "f1_reader_alone": round(float(f1[0]), 4),
                            "f1": round(float(f1[1]), 4), "weights": "*",
                            "why": f"fewer than {min_group} questions: the weights of every question"}
    return {"weights": chosen, "dev": report,
            "sources": sorted({r["source"] for r in rows}), "question_ids": [r["id"] for r in rows]}


def fit_rescoring(config: TrainConfig, backbone, data_dir: Path | None, on_event) -> dict:
    """Choose the answer step's weights for the reader in OUT on held-out questions; recorded in
    OUT/reader.json as "rescore"."""
    from evsel.models.reader.span_head import Reader

    out = Path(config.out)
    reader = Reader.load(out, backbone.model.config.hidden_size)
    examples = rescore_examples(config, backbone, reader.meta.get("trained_on", {}), data_dir, on_event)
    rows = candidate_table(reader, backbone, examples, out / "rescore", on_event)
    chosen = choose_rescoring(rows)
    reader.meta["rescore"] = chosen
    reader.save(out)
    return {"questions": len(rows), **{k: v for k, v in chosen.items() if k != "question_ids"}}


def run_training(engine, out: str, recipe_name: str, options: dict, command: str | None = None,
                 data_dir: str | None = None, on_event: Callable[[dict], None] = ignore_event) -> dict:
    """`evsel train reader` (the span head): the recipe's settings with the given options over them."""
    options = {k: v for k, v in options.items() if k not in LORA_ONLY}
    config = config_of(TrainConfig, out, pick_recipe(recipe_name, SMOKE, FULL), options)
    if config.threads:
        import torch

        torch.set_num_threads(config.threads)

    def log(line: str) -> None:
        on_event({"type": "log", "message": line})

    backbone = engine.backbone
    data = Path(data_dir) if data_dir else None
    if config.rescore_only:
        return {"rescore": fit_rescoring(config, backbone, data, on_event), "out": str(config.out)}
    train, dev, calibration, described = training_examples(config, backbone, data, on_event)
    log(f"examples: {len(train)} train, {len(dev)} dev, {len(calibration)} calibration")
    trainer = ReaderTrainer(config, backbone, command or "", on_event, log)
    trainer.setup(train, dev, calibration, described)
    summary = trainer.run()
    summary["rescore"] = fit_rescoring(config, backbone, data, on_event)
    return summary
