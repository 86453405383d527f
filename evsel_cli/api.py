"""The engine's requests as a client sees them, defined once: their names, signatures and how the
daemon treats them, without the engine.

`REQUEST` is the table: per request, its parameters (the signature of its method in `Requests`),
the parameters that are paths and its fast/light flags. The daemon's client checks a request
against it before it contacts a daemon, the daemon checks every request it gets
(daemon/checks.py), and the protocol's fast requests come from it (daemon/protocol.py).
Importing `evsel.engine` would cost the client the store, numpy and the model code, so the
signatures are declared here once more; tests/test_startup_imports.py fails when they differ
from `Engine`'s.
"""

from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass
from functools import cached_property
from typing import Callable

from .defaults import DEFAULT_CHUNK_TOKENS, DEFAULT_COLLECTION, DEFAULT_SELECT, RERANK_TOP

__all__ = ["REQUEST", "REQUESTS", "Request", "Requests", "methods", "select_help"]

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


@dataclass(frozen=True)
class Request:
    """One engine request: its name (the `Engine` method, its signature in `Requests`), the
    parameters that are paths (the client makes them absolute where the user typed them; the
    daemon runs in / and never guesses), whether the daemon answers it at once on the connection's
    own thread (`fast`: it never waits behind model work), and whether it may run beside model work
    when its method needs no model (`light`: an evidence-only ask with a light selector)."""

    name: str
    paths: tuple[str, ...] = ()
    fast: bool = False
    light: bool = False

    @property
    def method(self) -> Callable:
        return getattr(Requests, self.name)

    @property
    def signature(self) -> inspect.Signature:
        return inspect.signature(self.method)

    @cached_property
    def types(self) -> dict:
        """{parameter: type} from the signature's annotations."""
        return typing.get_type_hints(self.method)


# The engine methods a client may call (the daemon's requests; `DaemonClient` proxies these).
REQUEST: dict[str, Request] = {r.name: r for r in (
    Request("ingest", paths=("targets",)),
    Request("encode_states"),
    Request("ask", paths=("corpus",), light=True),
    Request("docs_list", fast=True),
    Request("docs_show", fast=True),
    Request("docs_rm", fast=True),
    Request("models_info"),
    Request("eval", paths=("data_dir", "reader")),
    Request("train_convert", paths=("out", "data_dir")),
    Request("train_unreal", paths=("out", "data")),
    Request("train_qrranker", paths=("out",)),
    Request("train_blocksearch", paths=("out",)),
    Request("train_hybrid", paths=("out",)),
    Request("train_reader", paths=("out",)),
    Request("watch_add", paths=("path",), fast=True),
    Request("watch_remove", paths=("path",), fast=True),
    Request("watch_list", fast=True),
    Request("corpus_add", paths=("corpus", "targets")),
    Request("corpus_rm", paths=("corpus",)),
)}
REQUESTS = tuple(REQUEST)


def methods() -> list[tuple[str, str]]:
    """What `select`/`rerank` accept: every method with what it does (the selector registry's)."""
    from evsel.models.selectors import listing

    return listing()


def select_help() -> str:
    """`--select`'s help text, from the selector registry."""
    from evsel.models.selectors import select_help as help_text

    return help_text()
