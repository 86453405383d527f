"""Defaults and names the commands parse their options with, defined here and imported by the
modules they belong to. This module imports nothing, so the CLI can build its options without the
engine, the store, numpy or the model code (`evsel --version` and a command sent to the daemon
import none of them; tests/test_startup_imports.py)."""

from __future__ import annotations

DATASETS = ("locomo", "fairytaleqa", "musique", "hotpotqa", "mmlongbench", "financebench", "nocha")  # evsel eval
DEFAULT_CHUNK_TOKENS = 140  # the chunker's budget (evsel.chunker)
DEFAULT_COLLECTION = "default"  # the store's collection when none is named (evsel.store)
KINDS = ("auto", "book", "pdf", "dialogue")  # ingest --kind (evsel.parsers)
RERANK_TOP = 50  # first-stage candidates a reranker re-scores, as in QRRanker (evsel.pipeline)
STYLES = ("short", "rules", "span", "sentence")  # ask --style (evsel.answer)
DEFAULT_SELECT = "default"  # the first stage when none is named: the measured best method (models/selectors/default.py)
DEFAULT_METHODS = "bm25,dense,random"  # eval --methods' default: words, a dense baseline, the floor
