"""The engine's requests as a client sees them: their names and signatures, without the engine.

The daemon's client checks a request against these before it contacts a daemon, and the daemon
checks every request it gets (daemon/checks.py). Importing `evsel.engine` would cost the client
the store, numpy and the model code, so the signatures are declared here once more;
tests/test_startup_imports.py fails when they differ from `Engine`'s.
"""

from __future__ import annotations

from typing import Callable

from .defaults import DEFAULT_CHUNK_TOKENS, DEFAULT_COLLECTION, DEFAULT_SELECT, RERANK_TOP

__all__ = ["REQUESTS", "Requests"]

# The engine methods a client may call (the daemon's requests; `DaemonClient` proxies these).
REQUESTS = ("ingest", "encode_states", "ask", "docs_list", "docs_show", "docs_rm", "models_info", "eval",
            "train_convert", "train_unreal", "train_qrranker", "train_blocksearch", "train_hybrid", "train_reader", "watch_add", "watch_remove",
            "watch_list", "corpus_add", "corpus_rm")

EventSink = Callable[[dict], None]


def _ignore(_event: dict) -> None:
    pass


class Requests:
    """`Engine`'s request methods, signatures only (the docs are the engine's)."""

    def ingest(self, targets: list[str], collection: str = DEFAULT_COLLECTION, kind: str = "auto",
               chunk_tokens: int = DEFAULT_CHUNK_TOKENS, on_event: EventSink = _ignore, encode: bool | None = None,
               resolve_links: bool = True, summaries: bool = False) -> list[dict]: ...

    def encode_states(self, doc_ids: list[int] | None = None, on_event: EventSink = _ignore, batch: int = 64,
                      states: bool = True, summaries: bool = False, slice_s: float | None = None) -> dict: ...

    def ask(self, question: str, doc_ids: list[int] | None = None, collection: str | None = None, top_n: int = 5,
            select: str = DEFAULT_SELECT, evidence_only: bool = False, max_new_tokens: int = 96,
            rerank: str | None = None, rerank_top: int = RERANK_TOP, style: str = "short", memory: bool = False,
            corpus: str | None = None, on_event: EventSink = _ignore) -> dict: ...

    def eval(self, dataset: str, methods: list[str], ks: list[int] | None = None, generate: bool = False,
             limit: int | None = None, split: str | None = None, concat: int = 0, fold: int | None = None,
             data_dir: str | None = None, top_n: int = 5, chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
             max_new_tokens: int = 32, per_question: bool = False, rerank_top: int = RERANK_TOP,
             answer_style: str = "short", memory: bool = False, reader: str | None = None,
             on_event: EventSink = _ignore) -> dict: ...

    def train_convert(self, out: str, options: dict, data_dir: str | None = None,
                      on_event: EventSink = _ignore) -> dict: ...

    def train_unreal(self, out: str, recipe_name: str = "full", data: str | None = None,
                     sources: list[str] | None = None, options: dict | None = None, command: str | None = None,
                     on_event: EventSink = _ignore) -> dict: ...

    def train_qrranker(self, out: str, detect_heads: bool = False, options: dict | None = None,
                       command: str | None = None, on_event: EventSink = _ignore,
                       recipe_name: str = "full") -> dict: ...

    def train_blocksearch(self, out: str, options: dict | None = None, command: str | None = None,
                          on_event: EventSink = _ignore, recipe_name: str = "full") -> dict: ...

    def train_hybrid(self, out: str, options: dict | None = None, command: str | None = None,
                     on_event: EventSink = _ignore, recipe_name: str = "full") -> dict: ...

    def train_reader(self, out: str, options: dict | None = None, command: str | None = None,
                     on_event: EventSink = _ignore, recipe_name: str = "full") -> dict: ...

    def docs_list(self, collection: str | None = None) -> list[dict]: ...

    def docs_show(self, doc_id: int, with_chunks: bool = False) -> dict: ...

    def docs_rm(self, doc_ids: list[int]) -> list[dict]: ...

    def watch_add(self, path: str, collection: str = DEFAULT_COLLECTION) -> dict: ...

    def watch_remove(self, path: str) -> dict: ...

    def watch_list(self) -> list[dict]: ...

    def models_info(self, load: bool = True) -> dict: ...

    def corpus_add(self, corpus: str, targets: list[str], on_event: EventSink = _ignore) -> dict: ...

    def corpus_rm(self, corpus: str, docs: list[str]) -> dict: ...
