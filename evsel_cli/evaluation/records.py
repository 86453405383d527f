"""What an evaluation reads: a dataset's questions, with their scope and gold evidence, and its
documents, loaded lazily. The adapters (datasets.py) build them; the folds (folds.py) and the
runner read them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from evsel.ingest.parsers.base import ParsedDocument

from .gold import Gold


@dataclass
class EvalQuestion:
    qid: str
    question: str
    docs: list[str]  # keys of the documents searched for this question (the scope)
    answers: list[str] = field(default_factory=list)  # references; empty when unanswerable
    gold: list[Gold] = field(default_factory=list)
    group: str = "all"  # breakdown label (LoCoMo category, local/summary, ...)
    meta: dict = field(default_factory=dict)  # label (claims), category (LoCoMo), pair id, ...


@dataclass
class EvalDataset:
    name: str
    loaders: dict[str, Callable[[], ParsedDocument]]  # document key -> parse it
    questions: list[EvalQuestion]
    notes: list[str] = field(default_factory=list)  # what was skipped and why
    task: str = "qa"  # qa | claims (true/false claims, no gold evidence)
    answer_metric: str = "squad"  # squad | locomo | claims
    separate_groups: tuple[str, ...] = ()  # groups reported apart from the headline numbers
    source: str = ""  # path read
