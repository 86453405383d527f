"""The one path from a question to evidence and an answer, shared by `ask`, `eval`, the daemon and
the training recipes, so eval measures exactly what a user runs:

    scope -> first stage (--select) -> optional rerank of its top candidates (--rerank,
    --rerank-top) -> top-n evidence in document order -> answer
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from evsel.models.selectors import DEFAULT, MethodSpec, Ranking, Scored, build
from evsel.models.selectors.default import resolve

from .defaults import RERANK_TOP  # defined there for the CLI's options
from .errors import EvselError
from .store.store import ChunkRecord


@dataclass(frozen=True)
class PipelineSpec:
    method: MethodSpec = field(default_factory=lambda: MethodSpec.of(DEFAULT))
    rerank_top: int = RERANK_TOP
    top_n: int = 5

    def __post_init__(self) -> None:
        if self.top_n < 1:
            raise EvselError(f"--top-n {self.top_n} must be at least 1")
        if self.method.rerank is not None and self.rerank_top < 1:
            raise EvselError(f"--rerank-top {self.rerank_top} must be at least 1")

    @classmethod
    def of(cls, select: str = DEFAULT, rerank: str | None = None, memory: bool = False, **kwargs) -> "PipelineSpec":
        """ask's --select and --rerank as given; `memory` (--memory) adds the reranker's memory variant."""
        method = MethodSpec.of(select, rerank)
        return cls(method.with_memory() if memory else method, **kwargs)

    @classmethod
    def parse(cls, spec: str, **kwargs) -> "PipelineSpec":
        """`FIRST` or `FIRST>RERANKER` (eval's method names)."""
        return cls(MethodSpec.parse(spec), **kwargs)

    @property
    def name(self) -> str:
        return self.method.name


class Pipeline:
    """Selectors for one spec, built once per request (or once per eval method) on a context;
    building is cheap: `load()` loads what they need from the model (else their first use does)."""

    def __init__(self, spec: PipelineSpec, context, first=None, kinds: set[str] | None = None):
        """`first`: a first stage given ready-made (a corpus' indexes, evsel/corpus/query.py) in the
        place of the spec's selector over a chunk list. `kinds`: the kinds of document the scope
        holds (None: any), what `default` is resolved for before its selector is built."""
        self.spec = spec
        self.context = context
        self.default = False
        self.given_first = first is not None
        if first is None:
            resolution = resolve(spec.method.first.text, context.settings, lambda: context.backbone, kinds)
            self.default = resolution.is_default
            first = build(spec.method.first, context, **({"resolution": resolution} if self.default else {}))
        self.first = first
        self.reranker = build(spec.method.rerank, context) if spec.method.rerank else None

    def plan(self, chunks: list[ChunkRecord]) -> str:
        """The method as it runs on `chunks`: `default` named by what it runs for them
        (default>qrranker: bm25>qrranker)."""
        if not self.default:
            return self.spec.name
        return self.first.plan(chunks) + self.spec.name[len(self.spec.method.first.text):]

    @property
    def ran(self) -> str:
        """The first stage as results name it: for `default`, the method it ran last (by kind in a
        mixed scope); a given first stage by its name; any other as asked."""
        if self.default:
            return self.first.resolved
        return self.first.name if self.given_first else self.spec.method.first.text

    @property
    def needs_model(self) -> bool:
        return self.first.needs_model or (self.reranker is not None and self.reranker.needs_model)

    def load(self) -> None:
        """Load the model and adapters the selectors need (ask times this as loading the model)."""
        self.first.load()
        if self.reranker is not None:
            self.reranker.load()

    def prepare(self, chunks: list[ChunkRecord]) -> None:
        """Index time: what the selectors build for a scope before its questions."""
        self.first.prepare(chunks)
        if self.reranker is not None:
            self.reranker.prepare(chunks)

    @property
    def depth(self) -> int:
        """How much of the ranking the evidence needs: the top-n, or the reranker's candidates."""
        return max(self.spec.top_n, self.spec.rerank_top if self.reranker is not None else 0)

    def ranking(self, question: str, chunks: list[ChunkRecord], depth: int | None = None) -> Ranking:
        """The scope ranked (Scored, rank 1 = best), its top `depth` (None: all of it, as eval
        scores recall): the reranker's order over the first stage's top `rerank_top`, then the rest
        of the first stage's order; with the extras and warnings of the stage whose order the
        evidence follows, and stage timings."""
        timings: dict[str, float] = {}
        started = time.perf_counter()
        result = self.first.ranking(question, chunks, depth)
        timings["select_s"] = time.perf_counter() - started
        if self.reranker is not None:
            ranked = result.scored
            result = Ranking(ranked)  # the first stage's extras describe an order the reranker replaces
            if ranked:
                started = time.perf_counter()
                head = self.reranker.ranking(question, [s.chunk for s in ranked[: self.spec.rerank_top]])
                rest = ranked[self.spec.rerank_top:]
                result = Ranking([Scored(s.chunk, s.score, rank) for rank, s in enumerate(head.scored + rest, 1)],
                                 head.extras, head.warnings)
                timings["rerank_s"] = time.perf_counter() - started
        result.timings = timings
        return result

    def rank(self, question: str, chunks: list[ChunkRecord], depth: int | None = None) -> tuple[list, dict[str, float]]:
        """`ranking`'s order and stage timings alone."""
        found = self.ranking(question, chunks, depth)
        return found.scored, found.timings

    def evidence(self, ranked: list) -> list:
        """The top-n, in document order (the order the generator reads them)."""
        return in_document_order(ranked[: self.spec.top_n])

    def load_timed(self, on_event, timings: dict[str, float]) -> None:
        """`load`, timed and shown as loading the model when it reads one (a prose answer needs
        none; a dialogue one loads it when it generates)."""
        if not self.needs_model:
            self.load()  # what a selector loads apart from the backbone (MiniLM)
            return
        on_event({"type": "progress", "task": "load", "label": "loading the model", "done": 0, "total": 1})
        started = time.perf_counter()
        self.load()  # the backbone and the selectors' adapters
        timings["load_s"] = time.perf_counter() - started

    def select(self, question: str, chunks: list[ChunkRecord], on_event, timings: dict[str, float], *,
               candidates: int, corpus: str | None = None, memory: bool = False) -> "AskResult":
        """An ask's evidence: the scope ranked as deep as the evidence needs, its top-n in document
        order, the stages' warnings said, and how it ran (`AskResult.method`: over `candidates`
        chunks, of `corpus` if one; with `memory`, the reranker's summaries kept)."""
        on_event({"type": "progress", "task": "select", "label": f"selecting evidence ({self.plan(chunks)})",
                  "done": 0, "total": 1})
        ranking = self.ranking(question, chunks, self.depth)
        timings.update(ranking.timings)
        for message in ranking.warnings:
            on_event({"type": "warning", "message": message})
        method = {"select": self.ran, "top_n": self.spec.top_n, "candidates": candidates}
        if corpus is not None:
            method["corpus"] = corpus
        if self.spec.method.rerank is not None:
            method.update(rerank=self.spec.method.rerank.text, rerank_top=self.spec.rerank_top)
        if ranking.extras.get("no_match"):
            method["no_match"] = True
        if ranking.extras.get("signals"):  # the fusion's signals that ranked, and those still encoding
            method["signals"] = ranking.extras["signals"]
        return AskResult(question, self.evidence(ranking.scored), method, timings,
                         memory=ranking.extras.get("memory", []) if memory else None)


@dataclass
class AskResult:
    """What an ask found: the evidence shown (Scored, in document order; with the passage the
    answer was read in beside them, `beside`), the answer step's answer and grounding, how it ran
    (`method`: the first stage as it ran, the reranker, the fusion's signals, the backbone) and the
    stages' seconds. `to_dict` is `ask --json`'s result."""

    question: str
    evidence: list
    method: dict
    timings: dict[str, float]
    memory: list | None = None  # the reranker's summaries (--memory)
    text: str | None = None
    grounding: dict | None = None
    usage: dict = field(default_factory=dict)
    beside: Scored | None = None

    def read_answer(self, backbone, question: str, max_new_tokens: int, style: str, neighbours: dict | None,
                    on_event) -> None:
        """The answer step on the evidence. An answer read in a chunk beside a shown passage
        (`neighbours`: (doc_id, seq) -> chunk) has that chunk shown too, in document order."""
        on_event({"type": "progress", "task": "generate", "label": "writing the answer", "done": 0, "total": 1})
        generated = answer(backbone, question, self.evidence, max_new_tokens, style, beside=neighbours)
        self.timings["generate_s"] = generated["generate_s"]
        self.text = generated["text"]
        self.usage = {"prompt_tokens": generated["prompt_tokens"], "generated_tokens": generated["generated_tokens"]}
        span = generated["span"]
        self.grounding = {"style": style, "kind": generated["kind"], "reason": generated["reason"], "span": span,
                          "generated": generated.get("generated"), "answer_type": generated.get("answer_type")}
        if span is None:
            return
        cited = span.pop("beside", None)
        if cited is not None:  # read beside a shown passage: shown too, in document order
            self.beside = Scored(cited, 0.0, 1)
            self.evidence = in_document_order(self.evidence + [self.beside])
            span["passage"] = self.evidence.index(self.beside) + 1
        cited = self.evidence[span["passage"] - 1].chunk
        span.update({k: v for k, v in cited.provenance().items()
                     if k in ("doc_id", "title", "path", "chunk_id", "page_start", "page_end", "session", "time_start")})
        span["speaker"] = generated.get("speaker")

    def to_dict(self) -> dict:
        result = {
            "question": self.question,
            "answer": self.text,
            "grounding": self.grounding,
            "evidence": [{"rank": s.rank, "score": round(s.score, 4), **s.chunk.provenance(), "text": s.chunk.text}
                         if s is not self.beside else {"rank": None, "score": None, "beside": True,
                                                       **s.chunk.provenance(), "text": s.chunk.text}
                         for s in self.evidence],
            "method": self.method,
            "timings": {k: round(v, 4) for k, v in self.timings.items()},
            "usage": self.usage,
        }
        if self.memory is not None:
            result["memory"] = self.memory
        return result


# the models (selectors' LLM passes, the reader) read at most this much of a question
MAX_QUESTION_CHARS = 2000


def readable_question(question: str, on_event) -> tuple[str, str]:
    """The question as asked (stripped) and as the models read it: a byte that is not UTF-8
    arrives as a lone surrogate (os.fsdecode), which the reply echoes as given and the tokenizers
    read as U+FFFD (they cannot encode a surrogate); at most MAX_QUESTION_CHARS of it."""
    question = question.strip()
    if not question:
        raise EvselError("the question is empty", 'ask something, e.g. evsel ask "who killed the count?"')
    readable = "".join("\ufffd" if "\ud800" <= ch <= "\udfff" else ch for ch in question)
    if len(readable) > MAX_QUESTION_CHARS:  # 100,000 characters held the daemon 104 s in the LLM's passes
        on_event({"type": "warning", "message": f"the question is {len(readable):,} characters long; the "
                  f"models read its first {MAX_QUESTION_CHARS:,} (ask a shorter question)"})
        readable = readable[:MAX_QUESTION_CHARS]
    return question, readable


def needs_model(select: str | None, settings, rerank: str | None = None, memory: bool = False,
                evidence_only: bool = False, scope_kinds: Callable[[], set[str] | None] = lambda: None) -> bool:
    """Whether an ask with these options reads a model; `select` None is the default, resolved for
    the kinds of document `scope_kinds()` names (None: any kind; called only for the default).
    Raises EvselError when the default cannot be resolved (the settings' model is missing)."""
    if not evidence_only or rerank or memory:
        return True
    from evsel.models.runtime.backbone import Backbone
    from evsel.models.selectors import needs_model as method_needs_model

    select = select or DEFAULT
    kinds = scope_kinds() if select == DEFAULT else None
    resolution = resolve(select, settings, lambda: Backbone(settings.model, settings.device), kinds)
    return any(method_needs_model(method) for method in resolution.methods())


def in_document_order(scored: list) -> list:
    return sorted(scored, key=lambda s: (s.chunk.doc_id, s.chunk.seq))


def _tokens_read(backbone, question: str, read: list) -> int:
    try:
        count = backbone.tokenizer([question, *(s.chunk.text for s in read)], add_special_tokens=False)
    except Exception:  # noqa: BLE001  (a count for the usage line, never a failed answer)
        return 0
    return sum(len(ids) for ids in count["input_ids"])


def answer(backbone, question: str, evidence: list, max_new_tokens: int, style: str = "short",
           reader_dir: str | None = None, beside: dict | None = None) -> dict:
    """The answer step on the evidence (Scored, in the order shown): text (None when it abstains),
    how it was found, the supporting span (`passage`: 1-based index into `evidence`, offsets into
    that passage and into its document), token counts and seconds. `beside` ((doc_id, seq) ->
    chunk, evsel/answer/windows.py): the reader reads each prose passage with the chunks beside it; an
    answer found in one that is not shown has `passage` None and the chunk as `span["beside"]`."""
    from .answer.step import STYLES, build_messages, grounded_answer
    from .answer.windows import reading_windows

    if style not in STYLES:
        raise EvselError(f"unknown answer style {style!r}", f"choose one of: {', '.join(STYLES)}")
    started = time.perf_counter()
    if style == "sentence":
        out = backbone.generate(build_messages(question, evidence), max_new_tokens)
        out.update(kind="generated", reason=None, span=None, metric_text=out["text"])
        out["generate_s"] = time.perf_counter() - started
        return out
    best_first = sorted(evidence, key=lambda s: s.rank)
    windows = None
    if beside and style == "short" and not any(s.chunk.speakers for s in best_first):
        windows = reading_windows(best_first, beside)
        read = [Scored(w.as_chunk(), w.score, w.rank) for w in windows]
    else:
        read = best_first
    found = grounded_answer(backbone, question, read, style, min(max_new_tokens, 16), reader_dir)
    if not found.prompt_tokens and not (found.reason or "").startswith("no passage shares"):
        # the reader and the LLM's scoring passes read the question and passages without generating:
        # their tokens count (usage said 0 for answers that took seconds of model time)
        found.prompt_tokens = _tokens_read(backbone, question, read)
    span = None
    if found.passage is not None:
        if windows is not None:
            chunk, start, end = windows[found.passage].locate(found.start, found.end)
            if end - start < found.end - found.start:  # it ran across a chunk boundary: the cited part
                found.text = chunk.text[start:end]
        else:
            chunk, start, end = best_first[found.passage].chunk, found.start, found.end
        shown = next((i for i, s in enumerate(evidence, 1) if s.chunk.id == chunk.id), None)
        span = {"passage": shown, "start": start, "end": end, "text": chunk.text[start:end],
                "doc_start": chunk.char_start + start, "doc_end": chunk.char_start + end}
        if shown is None:
            span["beside"] = chunk
        if len(chunk.text) != chunk.char_end - chunk.char_start:  # a PDF table's rows, rewritten: no offset maps
            span.update(doc_start=None, doc_end=None)
    return {"text": found.text, "kind": found.kind, "reason": found.reason, "span": span,
            "generated": found.generated, "speaker": found.speaker, "metric_text": found.as_metric_text(),
            "answer_type": found.answer_type, "confidence": found.confidence,
            "prompt_tokens": found.prompt_tokens, "generated_tokens": found.generated_tokens,
            "generate_s": time.perf_counter() - started}
