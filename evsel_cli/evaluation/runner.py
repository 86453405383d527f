"""Run every method over the same documents, chunks and questions, and score them.

Documents are parsed and chunked in memory exactly as `evsel ingest` would (same parsers, same
chunker, the backbone's tokenizer), never written to the user's store. A method is any registered
selector by name, a first stage followed by a reranker of its top `rerank_top` (FIRST>RERANKER;
see evsel.models.selectors), `full`: the whole document read by the generator when it fits the
context window (answers only, no ranking), or `oracle`: the gold evidence itself.

Every method runs through `evsel.pipeline`, the path `evsel ask` takes, on a selector context whose
state cache is eval's own (EVSEL_HOME/cache/eval.db), so the user's store is never written. A
selector's `prepare(chunks)` (index, chunk states) is reported as index time, not per-question
latency.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from evsel.ingest import chunker
from evsel.errors import EvselError, ModelError
from evsel.models.selectors import DEFAULT_METHODS, MethodSpec, methods_with_memory
from evsel.pipeline import RERANK_TOP, Pipeline, PipelineSpec, answer, in_document_order
from evsel.answer.windows import neighbours_of
from evsel.store.store import ChunkRecord

from . import metrics
from .datasets import EvalDataset, EvalQuestion
from .gold import resolve

CLAIM_PROMPT = "Is this claim about the book true or false? Claim: {claim}\nAnswer with one word: True or False."


@dataclass
class EvalConfig:
    methods: list[str]
    ks: list[int] = field(default_factory=lambda: [1, 3, 5, 10])
    generate: bool = False
    limit: int | None = None  # at most this many questions, evenly spaced over the dataset
    top_n: int = 5  # passages given to the generator
    chunk_tokens: int = chunker.DEFAULT_CHUNK_TOKENS
    max_new_tokens: int = 32
    per_question: bool = False  # keep each question's record in the result
    rerank_top: int = RERANK_TOP  # first-stage candidates a FIRST>RERANKER method re-scores
    answer_style: str = "short"  # the answer step (evsel ask --style); several, comma-separated
    reader: str | None = None  # the reader folder of style short (None: the model's shipped one)
    memory: bool = False  # every reranker with a memory variant reads its candidates' summaries


def _ignore(_event: dict) -> None:
    pass


def select_questions(questions: list[EvalQuestion], limit: int | None) -> list[EvalQuestion]:
    """All questions, or `limit` of them evenly spaced (deterministic, covers every document)."""
    if limit is None or limit >= len(questions):
        return list(questions)
    if limit < 1:
        raise EvselError(f"--limit {limit} must be at least 1")
    pairs: dict[str, list[EvalQuestion]] = {}
    for q in questions:
        if "pair" in q.meta:
            pairs.setdefault(q.meta["pair"], []).append(q)
    if pairs and len(pairs) * 2 == len(questions):  # claims are scored in pairs: keep pairs whole
        groups = list(pairs.values())
        n = max(1, limit // 2)
        return [q for i in range(n) for q in groups[(i * len(groups)) // n]]
    return [questions[(i * len(questions)) // limit] for i in range(limit)]


EVAL_ROWS = ("full", "oracle")  # eval's own rows: the answer step without a selector


def method_specs(names: list[str], memory: bool) -> list[tuple[str, MethodSpec | None]]:
    """Each method's name (how results call it) and its parsed spec (None for full and oracle);
    with `memory`, the methods whose reranker has the memory variant get it, and their names say so."""
    specs = {name: MethodSpec.parse(name) for name in names if name not in EVAL_ROWS}
    if memory:
        specs = dict(zip(specs, methods_with_memory(list(specs.values()))))
    return [(specs[name].name, specs[name]) if name in specs else (name, None) for name in names]


class Method:
    """One method: `full`, `oracle`, or a pipeline spec (`FIRST` or `FIRST>RERANKER`) run through
    the very pipeline `evsel ask` uses."""

    def __init__(self, name: str, spec: MethodSpec | None, context, config: "EvalConfig"):
        self.spec = name
        self.full = name == "full"
        self.oracle = name == "oracle"
        self.pipeline = None
        if spec is not None:
            self.pipeline = Pipeline(PipelineSpec(spec, rerank_top=config.rerank_top, top_n=config.top_n), context)

    @property
    def needs_model(self) -> bool:
        return self.pipeline is not None and self.pipeline.needs_model

    def load(self) -> None:
        if self.pipeline is not None:
            self.pipeline.load()

    def prepare(self, chunks: list[ChunkRecord]) -> None:
        if self.pipeline is not None:
            self.pipeline.prepare(chunks)

    def rank(self, question: str, chunks: list[ChunkRecord]) -> tuple[list, dict[str, float]]:
        found = self.pipeline.ranking(question, chunks)
        return found.scored, found.timings


@dataclass
class Corpus:
    """The parsed documents and their chunks, shared by every method."""

    parsed: dict = field(default_factory=dict)  # key -> ParsedDocument
    chunks: dict = field(default_factory=dict)  # key -> list[ChunkRecord]
    seconds: float = 0.0

    def scope(self, keys: list[str]) -> list[ChunkRecord]:
        return [c for k in keys for c in self.chunks[k]]


def build_corpus(dataset: EvalDataset, keys: list[str], counter, chunk_tokens: int,
                 on_event: Callable[[dict], None] = _ignore) -> Corpus:
    corpus = Corpus()
    started = time.perf_counter()
    next_id = 1
    for index, key in enumerate(keys):
        on_event({"type": "progress", "task": "docs", "label": f"chunking {key[-40:]}", "done": index,
                  "total": len(keys)})
        parsed = dataset.loaders[key]()
        records = []
        for chunk in chunker.chunk_document(parsed, counter, chunk_tokens):
            records.append(ChunkRecord(id=next_id, doc_id=index + 1, title=parsed.title, kind=parsed.kind,
                                       path=key, **chunk.record()))
            next_id += 1
        corpus.parsed[key] = parsed
        corpus.chunks[key] = records
    on_event({"type": "progress", "task": "docs", "label": "chunked", "done": len(keys), "total": len(keys)})
    corpus.seconds = time.perf_counter() - started
    return corpus


def gold_units(question: EvalQuestion, corpus: Corpus, tally: dict[str, int]) -> list[set[int]]:
    """Gold as sets of chunk ids; `tally` counts how each item was resolved."""
    units = []
    for gold in question.gold:
        found: set[int] = set()
        hows = []
        for key in ([gold.doc] if gold.doc else question.docs):
            chunks = corpus.chunks[key]
            indexes, how = resolve(gold, corpus.parsed[key], chunks)
            found.update(chunks[i].id for i in indexes)
            hows.append(how)
        how = next((h for h in hows if h != "unresolved"), "unresolved")
        tally[how] = tally.get(how, 0) + 1
        if found:
            units.append(found)
    return metrics.dedupe_units(units)


def _generate(engine, question: EvalQuestion, evidence: list, config: "EvalConfig", claims: bool,
              full: bool = False, style: str = "short", beside: dict | None = None) -> dict:
    """The answer step of the ask pipeline, on the evidence (Scored) the pipeline chose, read with
    the chunks `beside` it as `ask` reads them. Claims are judged true/false by free generation:
    they have no span to find."""
    if claims:
        return answer(engine.backbone, CLAIM_PROMPT.format(claim=question.question), in_document_order(evidence),
                      config.max_new_tokens, "sentence")
    style = "sentence" if full else style  # full is the whole-context generation baseline
    style, _, reader = style.partition("@")  # short@DIR: another reader, compared in the same run
    return answer(engine.backbone, question.question, in_document_order(evidence), config.max_new_tokens, style,
                  reader or config.reader, None if full else beside)


def _oracle_evidence(question: EvalQuestion, units: list[set[int]], chunks: list[ChunkRecord], top_n: int) -> list:
    """The gold chunks as evidence (the first chunk of each gold unit first, then the rest), ranked
    in that order, at most top_n: what the answer step gets from a perfect selector."""
    from evsel.models.selectors import Scored

    by_id = {c.id: c for c in chunks}
    order: list[int] = []
    for unit in units:
        first = min(unit)
        if first not in order:
            order.append(first)
    for unit in units:
        order += [i for i in sorted(unit) if i not in order]
    return [Scored(by_id[i], 1.0, rank) for rank, i in enumerate(order[:top_n], 1) if i in by_id]


def _fits(engine, question: EvalQuestion, chunks: list[ChunkRecord], max_new_tokens: int) -> bool:
    """Does the whole scope, as one prompt, fit the backbone's window? (tokens counted, not guessed)"""
    from evsel.answer.step import build_messages
    from evsel.models.selectors import Scored

    window = engine.backbone.config.max_position_embeddings
    # cheap bound first: a scope far over the window is not worth templating
    if sum(c.n_tokens for c in chunks) > window:
        return False
    messages = build_messages(question.question, [Scored(c, 0.0, i) for i, c in enumerate(chunks, 1)])
    return engine.backbone.chat_ids(messages).shape[1] + max_new_tokens <= window


def _score_answer(dataset: EvalDataset, question: EvalQuestion, answer: str) -> dict:
    scores = {}
    if question.answers:
        scores["em"] = metrics.exact_match(answer, question.answers)
        scores["f1"] = metrics.token_f1(answer, question.answers)
        scores["contained"] = metrics.contained(answer, question.answers)
        if any(metrics.is_figure(a) for a in question.answers):  # a figure printed in the document
            scores["numeric"] = metrics.numeric_match(answer, question.answers)
    if dataset.answer_metric == "locomo":
        reference = question.answers[0] if question.answers else ""
        scores["locomo_f1"] = metrics.locomo_f1(answer, reference, question.meta.get("category", 0))
    if dataset.answer_metric == "claims":
        verdict = metrics.claim_verdict(answer)
        scores["verdict"] = verdict
        scores["correct"] = float(verdict is not None and verdict == question.meta["label"])
    return scores


def _summary(records: list[dict], ks: list[int], claims: bool) -> dict:
    """Means over the records of one method (one group or the headline)."""
    ranked = [r for r in records if "ranking" in r]
    out: dict = {"questions": len(records), "with_gold": len(ranked)}
    if ranked:
        for key in [f"recall@{k}" for k in ks] + [f"complete@{k}" for k in ks] + \
                   [f"chunk_recall@{k}" for k in ks] + ["mrr"]:
            out[key] = metrics.mean([r["ranking"][key] for r in ranked])
    answered = [r for r in records if "answer" in r]
    if answered:
        for key in ("em", "f1", "contained", "numeric", "locomo_f1", "correct"):
            values = [r["scores"][key] for r in answered if key in r["scores"]]
            if values:
                out[key] = metrics.mean(values)
        out["prompt_tokens"] = metrics.mean([r["prompt_tokens"] for r in answered])
        out["answered"] = len(answered)
        readable = [r for r in answered if r.get("answer_shown") and "contained" in r["scores"]]
        if readable:  # the reader alone: of the questions whose evidence holds the reference
            out["answer_shown"] = len(readable)
            out["reader_recall"] = metrics.mean([r["scores"]["contained"] for r in readable])
            out["reader_f1"] = metrics.mean([r["scores"]["f1"] for r in readable])
        if claims:
            pairs: dict[str, list[bool]] = {}
            for r in answered:
                pairs.setdefault(r["pair"], []).append(bool(r["scores"]["correct"]))
            complete = {p: v for p, v in pairs.items() if len(v) == 2}
            out["pair_accuracy"] = metrics.pair_accuracy(complete)
            out["pairs"] = len(complete)
    evidence = [r["evidence_tokens"] for r in records if "evidence_tokens" in r]
    if evidence:
        out["evidence_tokens"] = metrics.mean(evidence)
    return out


def _abstention(records: list[dict], dataset: EvalDataset) -> dict:
    """How often the answer step abstained; where the dataset marks unanswerable questions (LoCoMo's
    adversarial category), precision and recall of abstaining on them."""
    answered = [r for r in records if "answer_kind" in r]
    out: dict = {"rate": metrics.mean([float(r["answer_kind"] == "abstained") for r in answered]),
                 "n": len(answered)}
    unanswerable = set(dataset.separate_groups) & {"adversarial"}
    if unanswerable and answered:
        abstained = [r for r in answered if r["answer_kind"] == "abstained"]
        targets = [r for r in answered if r["group"] in unanswerable]
        hits = sum(1 for r in abstained if r["group"] in unanswerable)
        out["precision"] = hits / len(abstained) if abstained else None
        out["recall"] = hits / len(targets) if targets else None
        out["unanswerable"] = len(targets)
    return out


def _latency(records: list[dict]) -> dict:
    out = {}
    for stage in ("select_s", "rerank_s", "generate_s"):
        values = [r["timings"][stage] for r in records if stage in r.get("timings", {})]
        if values:
            out[stage] = {"median": metrics.median(values), "p95": metrics.percentile(values, 95), "n": len(values)}
    return out


def _check(dataset: EvalDataset, config: EvalConfig) -> None:
    """Refuse a configuration that cannot give numbers, before any model loads."""
    if not config.methods:
        raise EvselError("no methods to evaluate", f"give --methods, e.g. {DEFAULT_METHODS}")
    if any(k < 1 for k in config.ks) or not config.ks:
        raise EvselError("--k needs positive integers, e.g. 1,3,5,10")
    if dataset.task == "claims" and not config.generate:
        raise EvselError(f"{dataset.name} has no gold evidence; its metric is answer accuracy",
                         "add --generate")
    if "full" in config.methods and not config.generate:
        raise EvselError("the full-context baseline only reads, it does not rank", "add --generate or drop full")
    if "oracle" in config.methods and not config.generate:
        raise EvselError("the oracle row gives the answer step the gold evidence; it ranks nothing",
                         "add --generate or drop oracle")


class _Trial:
    """One eval run's fixed inputs (dataset, configuration, engine, the questions' gold units) and
    the steps each method goes through: per scope, prepare; per question, evidence, ranking
    metrics and, with --generate, one answer per style."""

    def __init__(self, dataset: EvalDataset, config: EvalConfig, engine, units: dict[str, list[set[int]]],
                 on_event: Callable[[dict], None], total: int):
        self.dataset, self.config, self.engine, self.units = dataset, config, engine, units
        self.ks = sorted(set(config.ks))
        self.claims = dataset.task == "claims"
        self.styles = [s for s in config.answer_style.split(",") if s] or ["short"]
        self.on_event = on_event
        self.total = total
        self.done = 0

    def method_rows(self, method: Method, scopes: dict[tuple, list[EvalQuestion]],
                    corpus: Corpus) -> dict[str, tuple[dict, list[dict]]]:
        """{row name: (that row's results, its questions' records)} for one method: one row, or one
        per answer style."""
        records: list[dict] = []
        by_style: dict[str, list[dict]] = {s: [] for s in self.styles}
        index_s = 0.0
        not_fitting = 0
        for scope_keys, scope_questions in scopes.items():
            chunks = corpus.scope(list(scope_keys))
            beside = neighbours_of(chunks) if self.config.generate else None  # what the reader reads beside a passage
            if not method.full:
                t = time.perf_counter()
                method.prepare(chunks)
                index_s += time.perf_counter() - t
            for q in scope_questions:
                self.on_event({"type": "progress", "task": "questions", "label": f"{method.spec}: {q.qid[-30:]}",
                               "done": self.done, "total": self.total})
                self.done += 1
                record, evidence = self.ranked(method, q, chunks)
                if evidence is None:  # the whole scope does not fit the window: no answer to score
                    not_fitting += 1
                    for style in self.styles:
                        by_style[style].append(dict(record))
                elif not self.config.generate:
                    records.append(record)
                else:
                    for style, styled in self.answered(method, q, record, evidence, beside).items():
                        by_style[style].append(styled)
        rows = {}
        for style, records in (by_style.items() if self.config.generate else [(None, records)]):
            name = method.spec if style is None or len(self.styles) == 1 else f"{method.spec} [{style}]"
            rows[name] = self.row(method, records, not_fitting, index_s), records
        return rows

    def ranked(self, method: Method, q: EvalQuestion, chunks: list[ChunkRecord]) -> tuple[dict, list | None]:
        """The question's record with its ranking metrics, and the evidence the answer step reads
        (None: `full` over a scope that does not fit the window)."""
        from evsel.models.selectors import Scored

        units = self.units[q.qid]
        record: dict = {"qid": q.qid, "group": q.group, "timings": {}}
        if self.claims:
            record["pair"] = q.meta["pair"]
        if method.oracle:
            return record, _oracle_evidence(q, units, chunks, self.config.top_n)
        if method.full:
            if not _fits(self.engine, q, chunks, self.config.max_new_tokens):
                return record, None
            return record, [Scored(c, 0.0, i) for i, c in enumerate(chunks, 1)]
        ranked, timings = method.rank(q.question, chunks)
        record["timings"].update(timings)
        evidence = method.pipeline.evidence(ranked)
        record["evidence_tokens"] = sum(s.chunk.n_tokens for s in evidence)
        if units:
            ids = [s.chunk.id for s in ranked]
            record["ranking"] = metrics.ranking_metrics(ids, units, self.ks)
            if self.config.per_question:
                record["top"] = ids[: max(self.ks)]
                record["gold"] = [sorted(u) for u in units]
        return record, evidence

    def answered(self, method: Method, q: EvalQuestion, record: dict, evidence: list,
                 beside: dict | None) -> dict[str, dict]:
        """{style: the record with that style's answer and its scores (or the error that stopped it)}."""
        held = metrics.shown([s.chunk.text for s in evidence], q.answers) if q.answers else False
        out_by_style = {}
        for style in self.styles:
            styled = {**record, "timings": dict(record["timings"])}
            try:
                out = _generate(self.engine, q, evidence, self.config, self.claims, method.full, style, beside)
            except ModelError as exc:  # prompt over the window: say so, do not guess
                styled["error"] = exc.message
            else:
                styled["answer"] = out["text"]
                styled["answer_kind"] = out["kind"]
                styled["answer_shown"] = held
                if out.get("answer_type"):
                    styled["answer_type"] = out["answer_type"]
                if out.get("confidence") is not None:  # the reader's probability of its answer
                    styled["confidence"] = round(out["confidence"], 5)
                styled["prompt_tokens"] = out["prompt_tokens"]
                styled["timings"]["generate_s"] = out["generate_s"]
                styled["scores"] = _score_answer(self.dataset, q, out["metric_text"])
            out_by_style[style] = styled
        return out_by_style

    def row(self, method: Method, records: list[dict], not_fitting: int, index_s: float) -> dict:
        """One row of the results (a method, with one answer style when several are compared)."""
        ks, claims = self.ks, self.claims
        headline = [r for r in records if r["group"] not in self.dataset.separate_groups]
        groups = sorted({r["group"] for r in records})
        row = {
            **_summary(headline, ks, claims),
            "latency": _latency(records),
            "index_s": index_s,
            "groups": {g: _summary([r for r in records if r["group"] == g], ks, claims) for g in groups},
        }
        typed = sorted({r["answer_type"] for r in headline if "answer_type" in r})
        if typed:  # answer scores by what the question asks for (person, place, ...)
            row["answer_types"] = {
                t: _summary([r for r in headline if r.get("answer_type") == t], ks, claims) for t in typed}
        if method.full:
            row["not_fitting"] = not_fitting
        if self.config.generate and not claims:
            row["abstention"] = _abstention(records, self.dataset)
        return row


def _dataset_record(dataset: EvalDataset, keys: list[str], questions: list[EvalQuestion], corpus: Corpus,
                    units: dict[str, list[set[int]]], tally: dict[str, int]) -> dict:
    n_chunks = sum(len(v) for v in corpus.chunks.values())
    return {
        "name": dataset.name,
        "source": dataset.source,
        "documents": len(keys),
        "questions": len(questions),
        "questions_in_dataset": len(dataset.questions),
        "questions_with_gold": sum(1 for q in questions if units[q.qid]),
        "chunks": n_chunks,
        "chunk_tokens_mean": (sum(c.n_tokens for v in corpus.chunks.values() for c in v) / n_chunks)
        if n_chunks else 0,
        "gold_resolution": tally,
        "separate_groups": list(dataset.separate_groups),
        "notes": dataset.notes,
    }


def _config_record(config: EvalConfig, methods: list[Method], ks: list[int]) -> dict:
    return {
        "methods": [m.spec for m in methods],
        "k": ks,
        "generate": config.generate,
        "limit": config.limit,
        "top_n": config.top_n,
        "chunk_tokens": config.chunk_tokens,
        "max_new_tokens": config.max_new_tokens,
        "rerank_top": config.rerank_top,
        "answer_style": config.answer_style,
        "reader": config.reader,
    }


def run(dataset: EvalDataset, config: EvalConfig, engine, on_event: Callable[[dict], None] = _ignore) -> dict:
    """Evaluate `config.methods` on `dataset`. Returns a plain dict (see the --json output)."""
    _check(dataset, config)
    started = time.perf_counter()
    context = engine.selector_context(on_event, for_eval=True)
    methods = [Method(name, spec, context, config) for name, spec in method_specs(config.methods, config.memory)]
    for method in methods:  # the model and adapters now: a missing one fails before any work
        method.load()
    questions = select_questions(dataset.questions, config.limit)
    keys = list(dict.fromkeys(k for q in questions for k in q.docs))
    corpus = build_corpus(dataset, keys, engine.backbone, config.chunk_tokens, on_event)

    tally: dict[str, int] = {}
    units = {q.qid: gold_units(q, corpus, tally) for q in questions}
    scopes: dict[tuple, list[EvalQuestion]] = {}
    for q in questions:
        scopes.setdefault(tuple(q.docs), []).append(q)

    trial = _Trial(dataset, config, engine, units, on_event, len(questions) * len(methods))
    results: dict[str, dict] = {}
    per_question: dict[str, list[dict]] = {}
    for method in methods:
        for name, (row, records) in trial.method_rows(method, scopes, corpus).items():
            results[name] = row
            if config.per_question:
                per_question[name] = records
    total = trial.total
    on_event({"type": "progress", "task": "questions", "label": "done", "done": total, "total": total})

    result = {
        "dataset": _dataset_record(dataset, keys, questions, corpus, units, tally),
        "config": _config_record(config, methods, trial.ks),
        "methods": results,
        "seconds": {"chunking": corpus.seconds, "total": time.perf_counter() - started},
    }
    if config.generate or any(m.needs_model for m in methods):
        result["config"]["backbone"] = engine.backbone.name
        result["config"]["fingerprint"] = engine.backbone.fingerprint
    if config.per_question:
        result["per_question"] = per_question
    return result
