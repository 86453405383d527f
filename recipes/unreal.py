"""Training recipe for UNREAL's adapter (soft prompt, retrieval tokens rho, layer weights alpha).

Data: one common format, a folder with
  chunks.jsonl   {"id": int, "doc": str, "seq": int, "text": str, "hash": str, "n_tokens": int}
  train.jsonl    {"id", "source", "doc", "question", "units": [[chunk ids], ...], "answers",
                  "c0": [chunk ids, BM25 best first], "negatives": [chunk ids]}
  dev.jsonl      same fields (held-out documents of the training sources, for the recall log)
  meta.json      sources, counts, mining settings
Converters build it from FairytaleQA train and the HippoRAG MuSiQue / HotpotQA train samples with
evsel's own parsers, chunker and gold mapping (those of `evsel eval`), so training gold means
exactly what evaluation gold means. LoCoMo and FairytaleQA val are refused: they report results.

Loss and optimiser as in the paper (B.3): multi-positive InfoNCE over the oracle chunks and the
candidates of the whole microbatch (oracle and hard negatives of every query, deduplicated by
text), where a query's own oracle chunks are never its negatives; AdamW (0.9, 0.95), weight decay
0.1, gradient clipping 1.0, warmup then linear decay to zero. Only the adapter trains; chunk
states come from the state cache, without gradients.
"""

from __future__ import annotations

import json
import random
import shlex
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from evsel.errors import EvselError, InputError

from .common import (FOLDED_SOURCES, FORBIDDEN, SOURCES, AdapterTrainer, check_sources, fold_dev_split, folded_dataset,
                     ignore_event, pick_recipe)


# ---------------------------------------------------------------------------------------------
# BM25 for mining (an inverted index: ~10k chunks x thousands of seed queries in seconds)


class InvertedBM25:
    """Okapi BM25 over a fixed corpus with evsel's BM25 tokenizer and scoring (evsel.bm25_index),
    in float32 and with Lucene's idf (never negative: a seed passage shares many common words);
    scores all documents per query with one numpy scatter per query term."""

    def __init__(self, texts: list[str], k1: float = 1.5, b: float = 0.75):
        from evsel.store.bm25_index import lucene_idf, term_scores, tokenize

        self.tokenize = tokenize
        postings: dict[str, dict[int, int]] = defaultdict(dict)
        lengths = np.zeros(len(texts), dtype=np.float32)
        for i, text in enumerate(texts):
            words = tokenize(text)
            lengths[i] = len(words)
            for w in words:
                postings[w][i] = postings[w].get(i, 0) + 1
        n = len(texts)
        avg = max(float(lengths.mean()) if n else 1.0, 1e-9)
        self.n = n
        self.index = {}
        for w, docs in postings.items():
            ids = np.fromiter(docs.keys(), dtype=np.int64)
            tf = np.fromiter(docs.values(), dtype=np.float32)
            self.index[w] = (ids, term_scores(tf, lengths[ids], avg, lucene_idf(n, len(ids)), k1, b, weight_first=True))

    def scores(self, text: str) -> np.ndarray:
        out = np.zeros(self.n, dtype=np.float32)
        for w in self.tokenize(text):  # repeated query words count again, as in rank-bm25
            hit = self.index.get(w)
            if hit is not None:
                out[hit[0]] += hit[1]
        return out


# ---------------------------------------------------------------------------------------------
# conversion into the common format


@dataclass
class DataConfig:
    sources: list[str] = field(default_factory=lambda: ["fairytaleqa-train"])
    fold: int | None = None  # LoCoMo / MuSiQue / HotpotQA: the fold trained on (required for them)
    stories: int | None = None  # FairytaleQA train stories used for training (None: all but dev)
    dev_stories: int = 10  # FairytaleQA train stories held out for the dev recall log
    dev_questions: int = 10  # the first folded source's held-out questions when it is one corpus (MuSiQue)
    c0: int = 5  # BM25 chunks stored per query as its initial context
    negatives: int = 500  # hard negatives per query (BM25 seeded with the oracle texts)
    skip: int = 10  # top BM25 ranks skipped per seed: near-duplicates of the oracle
    chunk_tokens: int = 140
    seed: int = 0


def _check_sources(sources: list[str], fold: int | None = None) -> None:
    """common.check_sources over the named sources (a folder in the common format passes)."""
    named = [s for s in sources if s in SOURCES or s in FORBIDDEN or not Path(s).is_dir()]
    check_sources(named, fold)


def convert(out: Path, config: DataConfig, backbone, data_dir: Path | None = None,
            on_event: Callable[[dict], None] = ignore_event) -> dict:
    """Write the common-format folder `out` from the built-in sources. Returns meta.json's dict.

    C0 is what `evsel ask --select unreal` reads before the question: the first stage of the ask
    pipeline (BM25) over the question's document, so training sees the context asking will."""
    from evsel.evaluation.runner import build_corpus, gold_units
    from evsel.models.selectors import SelectorContext
    from evsel.pipeline import Pipeline, PipelineSpec

    first_stage = Pipeline(PipelineSpec.parse("bm25", top_n=config.c0),
                           SelectorContext(load_backbone=lambda: backbone, states=None))

    _check_sources(config.sources, config.fold)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(config.seed)
    chunks: list[dict] = []
    queries: dict[str, list[dict]] = {"train": [], "dev": []}
    counts: dict[str, dict] = {}
    # dev: held-out FairytaleQA train stories, and held-out data of the first folded source's fold
    # (never the other fold: that one is evaluated)
    dev_source = next((s for s in config.sources if s in FOLDED_SOURCES), None)
    for source in config.sources:
        if Path(source).is_dir():
            raise InputError(f"{source} is already in the common format", "pass it to --data instead")
        dataset = folded_dataset(source, data_dir, config.fold)
        keys = sorted(dataset.loaders)
        split_of = {k: "train" for k in keys}
        dev_qids: set[str] = set()
        if source == dev_source:
            dev_keys, dev_qids = fold_dev_split(dataset, keys, rng, config.dev_questions)
            split_of.update({k: "dev" for k in dev_keys})
        if source == "fairytaleqa-train":
            rng.shuffle(keys)
            dev, rest = keys[: config.dev_stories], keys[config.dev_stories:]
            if config.stories is not None:
                rest = rest[: config.stories]
            split_of = {**{k: "dev" for k in dev}, **{k: "train" for k in rest}}
            keys = dev + rest
        corpus = build_corpus(dataset, keys, backbone, config.chunk_tokens, on_event)
        offset = len(chunks)
        local: dict[int, int] = {}  # corpus chunk id -> our id
        for key in keys:
            for record in corpus.chunks[key]:
                local[record.id] = len(chunks)
                chunks.append({"id": len(chunks), "doc": f"{source}/{key}", "seq": record.seq, "text": record.text,
                               "hash": record.content_hash, "n_tokens": record.n_tokens})
        tally: dict[str, int] = {}
        kept = defaultdict(int)
        for q in dataset.questions:
            if not q.docs or q.docs[0] not in split_of:
                continue
            units = gold_units(q, corpus, tally)
            if not units:
                continue
            split = "dev" if q.qid in dev_qids else split_of[q.docs[0]]
            ranked, _ = first_stage.rank(q.question, corpus.chunks[q.docs[0]])
            queries[split].append({
                "id": f"{source}/{q.qid}", "source": source, "doc": f"{source}/{q.docs[0]}",
                "question": q.question, "units": [sorted(local[c] for c in u) for u in units],
                "answers": q.answers, "c0": [local[s.chunk.id] for s in ranked[: config.c0]],
            })
            kept[split] += 1
        counts[source] = {"documents": len(keys), "chunks": len(chunks) - offset, **kept, "gold": tally}
    _mine(chunks, [q for split in queries.values() for q in split], config, on_event)
    for split, items in queries.items():
        with open(out / f"{split}.jsonl", "w", encoding="utf-8") as handle:
            for item in items:
                handle.write(json.dumps(item, ensure_ascii=False) + "\n")
    with open(out / "chunks.jsonl", "w", encoding="utf-8") as handle:
        for chunk in chunks:
            handle.write(json.dumps(chunk, ensure_ascii=False) + "\n")
    meta = {"format": "evsel-unreal-train/1", "config": asdict(config), "counts": counts,
            "chunks": len(chunks), "train": len(queries["train"]), "dev": len(queries["dev"]),
            "backbone": backbone.fingerprint}
    (out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def _mine(chunks: list[dict], queries: list[dict], config: DataConfig, on_event) -> None:
    """Hard negatives (BM25 over all training chunks seeded with each oracle text, top `skip`
    dropped, pooled across seeds, never a chunk with an oracle's text), written into each query.
    An inverted index, not the ask pipeline's BM25: thousands of passage-long seed queries over
    ~10k chunks take seconds this way."""
    texts = [c["text"] for c in chunks]
    everything = InvertedBM25(texts)
    for n, q in enumerate(queries):
        if n % 200 == 0:
            on_event({"type": "progress", "task": "mine", "label": "mining hard negatives", "done": n,
                      "total": len(queries)})
        oracle = sorted({c for unit in q["units"] for c in unit})
        oracle_hashes = {chunks[c]["hash"] for c in oracle}
        pools = []
        for seed in oracle:
            order = np.argsort(-everything.scores(texts[seed]), kind="stable")
            pools.append([int(i) for i in order[config.skip: config.skip + config.negatives + len(oracle)]])
        negatives: list[int] = []
        seen = set(oracle_hashes)
        for rank in range(max((len(p) for p in pools), default=0)):  # round-robin over seeds
            for pool in pools:
                if rank < len(pool) and chunks[pool[rank]]["hash"] not in seen:
                    seen.add(chunks[pool[rank]]["hash"])
                    negatives.append(pool[rank])
            if len(negatives) >= config.negatives:
                break
        q["negatives"] = negatives[: config.negatives]


# ---------------------------------------------------------------------------------------------
# training


@dataclass
class TrainConfig:
    data: str = ""  # folder in the common format
    out: str = ""  # run folder: checkpoint/, best/, log.jsonl, config.json
    layer: int = 20  # l_c
    pool: int = 7  # L_p
    retrieval_tokens: int = 64  # R
    groups: int = 4  # G
    c0: int = 5  # BM25 chunks in the query context
    readout: list[int] = field(default_factory=lambda: list(range(13, 21)))  # layers mixed by alpha
    tau: float = 0.0  # InfoNCE temperature; 0: half the spread of the untrained scores (measured at the start)
    train_soft_prompt: bool = False  # backprop through the whole x_ret (~3x slower on CPU)
    doc_negatives: int = 300  # also contrast every other chunk of the query's document when it has at most this many
    batch: int = 8  # queries per optimizer step (their candidates pooled)
    steps: int = 200  # optimizer steps (--minutes may lower it after measuring)
    minutes: float | None = None  # wall-clock budget for the whole run, dev checks included
    lr: float = 1e-2
    warmup: int = 100  # steps; capped at a tenth of the run
    weight_decay: float = 0.1
    clip: float = 1.0
    max_train: int | None = None  # use at most this many training queries
    dev_every: int = 50  # steps between dev recall checks (0: only at the end)
    dev_queries: int = 60  # dev questions per check
    k: int = 5  # recall@k logged and used to pick best/
    calibrate_chunks: int = 128  # chunks whose token states give the standardization statistics
    checkpoint_every: int = 20  # steps
    device: str = "auto"
    threads: int | None = None
    seed: int = 0
    init: str | None = None  # start from this adapter folder (fine-tuning) instead of a fresh one

    def unreal_config(self):
        from evsel.models.unreal.selection import UnrealConfig

        return UnrealConfig(layer=self.layer, pool=self.pool, retrieval_tokens=self.retrieval_tokens,
                            groups=self.groups, c0=self.c0, readout=self.readout, tau=self.tau)


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def load_data(folder: Path) -> tuple[list[dict], list[dict], list[dict]]:
    folder = Path(folder)
    if not (folder / "chunks.jsonl").is_file() or not (folder / "train.jsonl").is_file():
        raise InputError(f"{folder} is not a training folder (chunks.jsonl + train.jsonl)",
                         "make one with: evsel train convert --out DIR")
    chunks = read_jsonl(folder / "chunks.jsonl")
    for i, c in enumerate(chunks):
        if c["id"] != i:
            raise InputError(f"chunks.jsonl: line {i + 1} has id {c['id']}, expected {i}", "ids must be 0..N-1 in order")
    return chunks, read_jsonl(folder / "train.jsonl"), read_jsonl(folder / "dev.jsonl")


class _Chunk:
    """What the state cache needs of a chunk."""

    def __init__(self, c: dict):
        self.content_hash = c["hash"]
        self.text = c["text"]


@dataclass(frozen=True)
class RunParts:
    """What a training run is handed: the backbone (loaded on first use), the per-chunk state
    cache (opened on first use) and the device asked for."""

    load_backbone: Callable[[], object]
    load_states: Callable[[], object]
    device: str


class Trainer(AdapterTrainer):
    """One training run on recipes/common.py's loop: `run()` trains, checks dev recall, checkpoints
    and logs. Resumes from out/checkpoint. `parts`: the backbone and the state cache."""

    log_nested = True
    betas = (0.9, 0.95)  # the paper's (B.3)
    json_indent = 2
    stops_at_minutes = False  # --minutes lowers the step count after 3 measured steps instead
    first_check_without_dev = False

    def __init__(self, config: TrainConfig, parts: RunParts, command: str = "",
                 on_event: Callable[[dict], None] = ignore_event, log: Callable[[str], None] = lambda line: None):
        super().__init__(config, None, command, on_event, log)
        self.parts = parts
        self.trained_on: dict = {}  # the data folder's sources and fold, recorded with the adapter

    @property
    def selection_key(self) -> str:
        return f"recall@{self.config.k}"

    # setup
    def setup(self, chunks: list[dict], train: list[dict], dev: list[dict]) -> None:
        import torch

        from evsel.models.unreal import selection as unreal

        cfg = self.config
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        self.chunks, self.dev = chunks, dev[: cfg.dev_queries]
        self.train = train[: cfg.max_train] if cfg.max_train else train
        if not self.train:
            raise InputError("no training queries", "check the data folder")
        backbone = self.parts.load_backbone()
        self.backbone = backbone
        device = backbone.plan.device  # the adapter, its statistics and the chunk keys live there
        state = self.start_or_resume(lambda folder: unreal.load_adapter(folder, device),
                                     lambda: self._new_adapter(chunks, device))
        if state is not None:
            # the same command resumes its (possibly budget-fitted) plan; a new --steps replaces it
            if state.get("asked_steps") == cfg.steps:
                self.total_steps = state["total_steps"]
            self.best = {self.selection_key: state.get("best", -1.0)}
            self.log(f"resuming at step {self.step} of {self.total_steps}")
        self.query = unreal.UnrealQuery(backbone, self.adapter)
        self.doc_chunks: dict[str, list[int]] = defaultdict(list)
        for c in chunks:
            self.doc_chunks[c["doc"]].append(c["id"])
        # every chunk the run touches: training candidates and dev documents
        needed = sorted({c for q in self.train for c in self._candidates_of(q)} |
                        {c for q in self.dev for c in self.doc_chunks[q["doc"]]})
        states = unreal.chunk_states(backbone, self.parts.load_states(), [_Chunk(chunks[i]) for i in needed], cfg.layer,
                                     cfg.pool, self.on_event)
        self.row = {c: i for i, c in enumerate(needed)}
        self.keys = self.query.chunk_keys(states)  # (M, P, d) standardized, fixed
        if cfg.tau <= 0 and self.step > 0:  # resumed: the temperature measured at the start
            cfg.tau = self.adapter.config.tau
        elif cfg.tau <= 0:
            self.adapter.config.tau = cfg.tau = self._auto_tau()
            self.log(f"temperature set from the untrained scores: tau = {cfg.tau:.3g}")
        self.adapter.config.tau = cfg.tau
        self.order = self._batch_order()
        self.step_times: list[float] = []
        self.dev_seconds = 0.0  # what the dev check at step 0 took (the budget fit counts it)
        self.last_dev: dict = {}

    def _new_adapter(self, chunks: list[dict], device):
        """The adapter a run starts from: --init's (its shape and temperature kept), else a fresh
        one initialised from the backbone and calibrated on a sample of the chunks."""
        from evsel.models.unreal import selection as unreal

        cfg = self.config
        if cfg.init:
            adapter = unreal.load_adapter(Path(cfg.init), device)
            self._adopt_shape(adapter.config)
            self.log(f"starting from the adapter in {cfg.init}")
            return adapter
        adapter = unreal.new_adapter(cfg.unreal_config(), self.backbone.model.config.hidden_size, device)
        adapter.init_from_backbone(self.backbone, cfg.seed)
        sample = random.Random(cfg.seed).sample(range(len(chunks)), min(cfg.calibrate_chunks, len(chunks)))
        unreal.calibrate(adapter, self.backbone, [chunks[i]["text"] for i in sample])
        return adapter

    def _batch_order(self) -> list[int]:
        """Training queries in seeded shuffled epochs, enough for every step's batch (the same on a
        resumed run)."""
        cfg = self.config
        order_rng = random.Random(cfg.seed)
        order: list[int] = []
        for _ in range(cfg.steps * cfg.batch // max(1, len(self.train)) + 2):
            epoch = list(range(len(self.train)))
            order_rng.shuffle(epoch)
            order += epoch
        return order

    def trainable(self) -> list:
        return self.adapter.trainable()

    def _adopt_shape(self, adapter_config) -> None:
        """A warm start keeps the adapter's shape and its temperature; a clashing option is an error."""
        cfg = self.config
        for name in ("layer", "pool", "retrieval_tokens", "groups"):
            want, have = getattr(cfg, name), getattr(adapter_config, name)
            if want != have:
                raise InputError(f"--init adapter has {name} {have}, the run asks for {want}",
                                 f"drop that option or set it to {have}")
        if list(cfg.readout) != list(adapter_config.readout):
            raise InputError(f"--init adapter reads out layers {adapter_config.readout}, the run asks for {cfg.readout}",
                             "drop --readout or match the adapter")
        adapter_config.c0 = cfg.c0
        if cfg.tau <= 0:
            cfg.tau = adapter_config.tau

    def _candidates_of(self, q: dict) -> list[int]:
        oracle = [c for unit in q["units"] for c in unit]
        extra = []
        doc = self.doc_chunks.get(q["doc"], [])
        if len(doc) <= self.config.doc_negatives:
            extra = doc
        return list(dict.fromkeys(oracle + q.get("negatives", []) + extra))

    def _auto_tau(self, n: int = 4) -> float:
        """Half the standard deviation of the untrained scores over a query's candidates, so the
        first softmax is neither flat nor a hard max (the scale of residual states is arbitrary)."""
        import torch

        from evsel.models.unreal.selection import maxsim_torch

        spreads = []
        items = self.train[:n]
        vectors = self.query.encode_questions(
            [(q["question"], [self.chunks[c]["text"] for c in q["c0"][: self.config.c0]]) for q in items])
        for q, Q in zip(items, vectors):
            keys = self.keys[[self.row[c] for c in self._candidates_of(q)]]
            scores = maxsim_torch(torch.as_tensor(Q, device=keys.device)[None], keys)[0]
            spreads.append(float(scores.std()))
        return max(float(np.mean(spreads)) / 2, 1e-3)

    # one step
    def train_step(self) -> dict:
        cfg = self.config
        t = time.perf_counter()
        at = self.step * cfg.batch
        batch = [self.train[i] for i in self.order[at:at + cfg.batch]]
        self.begin_step()
        loss = self.batch_loss(batch)
        norm = self.end_step()
        self.step_times.append(time.perf_counter() - t)
        if cfg.minutes and len(self.step_times) == 3 and self.step == 3:
            self._fit_budget(self.step_times, self.started)
        return {"loss": round(loss, 5), "lr": self.lr_at(self.step - 1), "grad_norm": round(norm, 4),
                "alpha_norm": float(self.adapter.alpha.detach().norm())}

    def batch_loss(self, batch: list[dict], backward: bool = True) -> float:
        """Mean InfoNCE over `batch`, every query against the batch's pooled candidates; the
        queries run as one padded batch (one graph, one backward)."""
        import torch

        from evsel.models.unreal.selection import maxsim_torch

        cfg = self.config
        pool = list(dict.fromkeys(c for q in batch for c in self._candidates_of(q)))
        hashes = [self.chunks[c]["hash"] for c in pool]
        first = {}  # one candidate per distinct text
        for c, h in zip(pool, hashes):
            first.setdefault(h, c)
        cand = list(first.values())
        keys = self.keys[[self.row[c] for c in cand]]  # (M, P, d)
        oracles = [{self.chunks[o]["hash"] for unit in q["units"] for o in unit} for q in batch]
        positive = torch.tensor([[self.chunks[c]["hash"] in own for c in cand] for own in oracles],
                                device=keys.device)  # (B, M)
        ids = [self.query.prefix_ids(q["question"], [self.chunks[c]["text"] for c in q["c0"][: cfg.c0]])
               for q in batch]
        states = self.query.readout_batch(ids, grad=True, split=not cfg.train_soft_prompt)  # (B, |l|, R, d)
        queries = self.query.query_vectors(states)  # (B, G, d)
        logits = maxsim_torch(queries, keys) / cfg.tau  # (B, M)
        logp = torch.log_softmax(logits, dim=1)
        # multi-positive InfoNCE: mean over a query's oracle chunks, then over the batch
        losses = -(logp * positive).sum(dim=1) / positive.sum(dim=1).clamp(min=1)
        loss = losses.mean()
        if backward:
            loss.backward()
        return float(loss.detach())

    def dev_metrics(self) -> dict:
        t = time.perf_counter()
        self.last_dev = self.dev_recall(self.dev)
        if self.step == 0:
            self.dev_seconds = time.perf_counter() - t
        return self.last_dev

    def dev_recall(self, queries: list[dict]) -> dict:
        """recall@k and MRR of the adapter on dev queries, ranking each query's document."""
        from evsel.evaluation.metrics import ranking_metrics

        cfg = self.config
        results = []
        vectors = self.query.encode_questions(
            [(q["question"], [self.chunks[c]["text"] for c in q["c0"][: cfg.c0]]) for q in queries])
        for q, Q in zip(queries, vectors):
            doc = self.doc_chunks[q["doc"]]
            scores = self.query.score_keys(Q, self.keys[[self.row[c] for c in doc]])
            ranked = [doc[i] for i in np.argsort(-scores, kind="stable")]
            results.append(ranking_metrics(ranked, [set(u) for u in q["units"]], [1, cfg.k]))
        return {key: float(np.mean([r[key] for r in results])) for key in results[0]} if results else {}

    def best_recall(self) -> float:
        """The best dev recall@k so far (-1 before any check)."""
        return (self.best or {}).get(self.selection_key, -1.0)

    def is_better(self, dev: dict) -> bool:
        return bool(dev) and dev[self.selection_key] > self.best_recall()

    def first_record(self, dev: dict) -> dict:
        return {"step": 0, **{f"dev_{k}": v for k, v in dev.items()}, "elapsed_s": time.perf_counter() - self.started}

    def summary(self, last: dict) -> dict:
        return {"steps": self.step, "best_dev": self.best_recall(), "last_dev": last}

    # checkpoints
    def trainer_state(self) -> dict:
        return {"step": self.step, "total_steps": self.total_steps, "asked_steps": self.config.steps,
                "best": self.best_recall()}

    def _extra(self) -> dict:
        return {"backbone": self.backbone.name, "fingerprint": self.backbone.fingerprint,
                "train_config": asdict(self.config), "trained_on": self.trained_on, "step": self.step}

    def save_adapter(self, folder: Path) -> None:
        self.adapter.save(folder, metrics={"trained_on": self.trained_on, "step": self.step, "dev": self.last_dev},
                          command=self.command, extra=self._extra())

    def save_best(self, dev: dict) -> None:
        import shutil

        folder = self.out / "best"
        tmp = folder.with_name(folder.name + ".tmp")
        self.adapter.save(tmp, metrics={"trained_on": self.trained_on, "step": self.step, "dev": dev},
                          command=self.command, extra=self._extra())
        if folder.exists():
            shutil.rmtree(folder)
        tmp.rename(folder)

    def _fit_budget(self, step_times: list[float], started: float) -> None:
        """After 3 measured steps, lower the step count so that the loop, dev checks included,
        ends within --minutes (a dev check costs what the one at step 0 cost)."""
        cfg = self.config
        per_step = float(np.median(step_times))
        left = cfg.minutes * 60 - (time.perf_counter() - started)
        planned = 4
        for steps in range(self.total_steps, 3, -1):
            checks = (steps // cfg.dev_every if cfg.dev_every else 0) + 1
            if (steps - 3) * per_step + checks * self.dev_seconds <= left:
                planned = steps
                break
        if planned != self.total_steps:
            self.log(f"measured {per_step:.1f} s per step and {self.dev_seconds:.0f} s per dev check: "
                     f"{planned} steps fit in {cfg.minutes:g} min (asked for {self.total_steps})")
            self.total_steps = planned


def train(config: TrainConfig, parts: RunParts, on_event: Callable[[dict], None] = ignore_event,
          log: Callable[[str], None] = lambda line: None, command: str | None = None) -> dict:
    """Train (or resume) a run with `parts`' backbone and state cache; returns its summary."""
    if not config.data or not config.out:
        raise EvselError("training needs --data and --out")
    chunks, train_queries, dev = load_data(Path(config.data))
    trainer = Trainer(config, parts, command or current_command(), on_event, log)
    trainer.trained_on = trained_on(Path(config.data))
    trainer.setup(chunks, train_queries, dev)
    return trainer.run()


def trained_on(data: Path) -> dict:
    """What a data folder was converted from (meta.json): its sources, fold and dev counts."""
    meta_file = Path(data) / "meta.json"
    if not meta_file.is_file():
        return {"data": str(data)}
    meta = json.loads(meta_file.read_text())
    config = meta.get("config") or {}
    return {"sources": config.get("sources"), "fold": config.get("fold"), "data": str(data),
            "train_questions": meta.get("train"), "dev_questions": meta.get("dev")}


def run_recipe(parts: RunParts, out: str, recipe_name: str, data: str | None, sources: list[str], options: dict,
               command: str | None = None, data_dir: str | None = None,
               on_event: Callable[[dict], None] = ignore_event) -> dict:
    """`evsel train unreal`: the recipe's settings with the given options over them; OUT/data is
    converted first when no --data is given and it is not there yet; then train (or resume).
    Log lines go to `on_event` as {"type": "log"} events."""
    from dataclasses import fields

    settings = recipe(recipe_name)
    data_keys = {"sources", "stories", "dev_stories"}
    data_settings = {k: settings.pop(k) for k in list(settings) if k in data_keys}
    options = dict(options)
    fold = options.pop("fold", None)
    readout = options.pop("readout", None)
    if readout is not None:
        options["readout"] = list(readout)
    if options.get("layer") is not None and readout is None:  # read out the 8 layers up to l_c
        options["readout"] = list(range(max(1, options["layer"] - 7), options["layer"] + 1))
    settings.update({k: v for k, v in options.items() if v is not None})
    out_path = Path(out)
    if data is None:
        data = str(out_path / "data")
        if not (Path(data) / "train.jsonl").is_file():
            data_settings["sources"] = list(sources) or data_settings.get("sources") or ["fairytaleqa-train"]
            _check_sources(data_settings["sources"], fold)  # before the backbone loads
            convert(Path(data), DataConfig(**data_settings, fold=fold), parts.load_backbone(),
                    Path(data_dir) if data_dir else None, on_event)
        elif sources or fold is not None:
            made = trained_on(Path(data))
            if (sources and made.get("sources") != list(sources)) or made.get("fold") != fold:
                raise InputError(f"{data} was converted from {made.get('sources')} fold {made.get('fold')}, "
                                 f"not {list(sources) or made.get('sources')} fold {fold}",
                                 "use another --out, or the same --source and --fold")
    known = {f.name for f in fields(TrainConfig)}
    config = TrainConfig(data=str(data), out=str(out_path), device=parts.device,
                         **{k: v for k, v in settings.items() if k in known})

    def log(line: str) -> None:
        on_event({"type": "log", "message": line})

    summary = train(config, parts, on_event=on_event, log=log, command=command)
    summary.setdefault("k", config.k)
    summary.setdefault("out", str(out_path))
    return summary


def current_command() -> str:
    return " ".join(shlex.quote(a) for a in [Path(sys.argv[0]).name, *sys.argv[1:]])


# ---------------------------------------------------------------------------------------------
# recipes: a CPU smoke run (minutes) and the full run that produced the shipped adapter

SMOKE = dict(stories=3, dev_stories=2, steps=6, batch=2, c0=2, readout=[4, 5, 6], layer=6, dev_every=3,
             dev_queries=8, calibrate_chunks=16, checkpoint_every=3, warmup=2)
# The shipped adapter's run (models/adapters/*/unreal/command.txt), trained on 2 shared CPU cores:
# l_c from bench/unreal_layers.py; C0 cut to 3 chunks and readout to the 8 layers up to l_c so that a
# CPU step costs ~3 s (docs/UNREAL.md). With a GPU, raise stories (None: all), c0 to 5, the steps
# and --train-soft-prompt.
FULL = dict(sources=["fairytaleqa-train"], stories=100, dev_stories=10, layer=24, readout=list(range(17, 25)), c0=3,
            batch=16, steps=399, lr=1e-2, dev_every=50, dev_queries=200)


def recipe(name: str) -> dict:
    return pick_recipe(name, SMOKE, FULL)
