"""The one path from a question to evidence and an answer, shared by `ask`, `eval`, the daemon and
the training recipes, so eval measures exactly what a user runs:

    scope -> first stage (--select) -> optional rerank of its top candidates (--rerank,
    --rerank-top) -> top-n evidence in document order -> answer
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from evsel.models.selectors import DEFAULT, MethodSpec, Ranking, Scored, build

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
    def parse(cls, spec: str, **kwargs) -> "PipelineSpec":
        """`FIRST` or `FIRST>RERANKER` (eval's method names)."""
        return cls(MethodSpec.parse(spec), **kwargs)

    @property
    def name(self) -> str:
        return self.method.name


class Pipeline:
    """Selectors for one spec, built once per request (or once per eval method) on a context;
    building is cheap: `load()` loads what they need from the model (else their first use does)."""

    def __init__(self, spec: PipelineSpec, context, first=None):
        """`first`: a first stage given ready-made (a corpus' indexes, evsel/corpus/query.py) in the
        place of the spec's selector over a chunk list."""
        self.spec = spec
        self.context = context
        self.first = first if first is not None else build(spec.method.first, context)
        self.reranker = build(spec.method.rerank, context) if spec.method.rerank else None

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


def needs_model(select: str, settings, rerank: str | None = None, memory: bool = False,
                evidence_only: bool = False, kinds: set[str] | None = None) -> bool:
    """Whether an ask with these options reads a model; `select` None is the default, resolved for
    the scope's `kinds` of document (None: any kind). Raises EvselError when the default cannot be
    resolved (the settings' model is missing)."""
    if not evidence_only or rerank or memory:
        return True
    from evsel.models.selectors import needs_model as method_needs_model
    from evsel.models.selectors.default import resolve_selects

    return any(method_needs_model(method) for method in resolve_selects(select or DEFAULT, settings, kinds))


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
