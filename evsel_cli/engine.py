"""The engine every entry point shares: the CLI in-process, the daemon, tests and scripts.

Functions here take plain arguments, report progress through an `on_event` callback and return
plain dicts, so the same call works locally and over the daemon's socket.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import chunker
from .errors import EmptyStoreError, EvselError, InputError, NotFoundError
from .parsers import collect_files, parse_file
from .store import DEFAULT_COLLECTION, ChunkRecord, Store

Event = dict
EventSink = Callable[[Event], None]


def _ignore(_event: Event) -> None:
    pass


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class FileResult:
    path: str
    status: str  # ingested | unchanged | failed
    doc_ids: list[int] = field(default_factory=list)
    chunks: int = 0
    seconds: float = 0.0
    error: dict | None = None
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return self.__dict__.copy()


class Engine:
    """Holds the store and the (lazily loaded) backbone for one EVSEL_HOME."""

    def __init__(self, model: str | None = None, device: str = "auto", store: Store | None = None):
        self.model_arg = model
        self.device = device
        self._store = store
        self._backbone = None

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = Store()
        return self._store

    @property
    def backbone(self):
        if self._backbone is None:
            from evsel.models.backbone import Backbone

            self._backbone = Backbone(self.model_arg, self.device)
        return self._backbone

    # ingest
    def ingest(
        self,
        targets: list[str],
        collection: str = DEFAULT_COLLECTION,
        kind: str = "auto",
        chunk_tokens: int = chunker.DEFAULT_CHUNK_TOKENS,
        on_event: EventSink = _ignore,
        encode: bool | None = None,
    ) -> list[dict]:
        """Ingest files and directories. A failing file is reported and skipped; others go on.

        With `encode` (default: $EVSEL_ENCODE, else on) the chunks' UNREAL states are computed
        right after each file is stored, so the first `ask --select unreal` needs no encoding."""
        if encode is None:
            encode = os.environ.get("EVSEL_ENCODE", "1").strip().lower() not in ("0", "false", "no", "off")
        if chunk_tokens < 16:
            raise EvselError(f"--chunk-tokens {chunk_tokens} is too small", "use 16 or more (default 140)")
        results: list[FileResult] = []
        files: list[Path] = []
        for target in targets:
            try:
                files.extend(collect_files(Path(target).expanduser()))
            except EvselError as exc:
                results.append(FileResult(str(target), "failed", error=exc.to_dict()))
                on_event({"type": "file", **results[-1].to_dict()})
        seen = set()
        unique = [f for f in files if not (f.resolve() in seen or seen.add(f.resolve()))]
        for index, path in enumerate(unique):
            on_event({"type": "progress", "task": "files", "label": path.name, "done": index, "total": len(unique)})
            result = self._ingest_file(path.resolve(), collection, kind, chunk_tokens, on_event)
            if encode and result.status == "ingested":
                self._encode_states(result, on_event)
            results.append(result)
            on_event({"type": "file", **result.to_dict()})
        on_event({"type": "progress", "task": "files", "label": "", "done": len(unique), "total": len(unique)})
        return [r.to_dict() for r in results]

    def _encode_states(self, result: FileResult, on_event: EventSink) -> None:
        """Per-chunk model states for a stored file. A failure here leaves the file ingested:
        the states are computed later, when a selector first needs them."""
        from evsel.models import unreal

        started = time.perf_counter()
        try:
            unreal.encode_at_ingest(self, self.store.chunks(doc_ids=result.doc_ids), on_event)
        except EvselError as exc:
            result.warnings.append(f"chunk states not computed now ({exc.message}); they will be at the first ask")
            on_event({"type": "warning", "message": f"{result.path}: {result.warnings[-1]}"})
        result.seconds += time.perf_counter() - started

    def _chunker_config(self, chunk_tokens: int) -> dict:
        return {"tokens": chunk_tokens, "tokenizer": self.backbone.fingerprint[:16]}

    def _ingest_file(
        self, path: Path, collection: str, kind: str, chunk_tokens: int, on_event: EventSink
    ) -> FileResult:
        started = time.perf_counter()
        warnings: list[str] = []
        try:
            sha = file_sha256(path)
            config = self._chunker_config(chunk_tokens)
            collection_id = self.store.collection_id(collection, create=True)
            existing = self.store.documents_for_path(collection_id, str(path))
            if existing and all(
                d["sha256"] == sha and _metadata(d).get("chunker") == config and _metadata(d).get("kind_arg") == kind
                for d in existing
            ):
                return FileResult(str(path), "unchanged", [d["id"] for d in existing],
                                  sum(d["n_chunks"] for d in existing), time.perf_counter() - started)
            on_event({"type": "progress", "task": "parse", "label": f"reading {path.name}", "done": 0, "total": 1})
            parsed = parse_file(path, kind, warnings)
            on_event({"type": "progress", "task": "parse", "label": f"read {path.name}", "done": 1, "total": 1})
            for message in warnings:
                on_event({"type": "warning", "message": message})
            docs = []
            for doc in parsed:
                label = f"chunking {doc.title[:40]}"

                def progress(done: int, total: int, label: str = label) -> None:
                    on_event({"type": "progress", "task": "chunk", "label": label, "done": done, "total": total})

                chunks = chunker.chunk_document(doc, self.backbone, chunk_tokens, progress)
                if not chunks or not any(c.text.strip() for c in chunks):
                    raise InputError("no text to index", "check the file's contents", path=str(path))
                metadata = dict(doc.metadata, chunker=config, kind_arg=kind)
                docs.append(
                    {
                        "part": doc.part,
                        "kind": doc.kind,
                        "title": doc.title,
                        "metadata": metadata,
                        "n_chars": len(doc.text),
                        "chunks": [c.record() for c in chunks],
                    }
                )
            ids = self.store.replace_file(collection_id, str(path), sha, docs)
            n_chunks = sum(len(d["chunks"]) for d in docs)
            return FileResult(str(path), "ingested", ids, n_chunks, time.perf_counter() - started, warnings=warnings)
        except EvselError as exc:
            if exc.path is None:
                exc.path = str(path)
            return FileResult(str(path), "failed", error=exc.to_dict(), warnings=warnings,
                              seconds=time.perf_counter() - started)
        except OSError as exc:
            error = InputError(f"cannot read the file: {exc.strerror or exc}", "check the path and permissions",
                               path=str(path))
            return FileResult(str(path), "failed", error=error.to_dict(), seconds=time.perf_counter() - started)
        except Exception as exc:  # a library or parser failure on one file must not stop the others
            if os.environ.get("EVSEL_DEBUG"):
                raise
            error = EvselError(f"unexpected {type(exc).__name__} while ingesting: {exc}",
                               "rerun with EVSEL_DEBUG=1 for a traceback and report it", path=str(path))
            return FileResult(str(path), "failed", error=error.to_dict(), warnings=warnings,
                              seconds=time.perf_counter() - started)

    # scope
    def cached(self, kind: str, chunks: list[ChunkRecord], build: Callable[[], object], *config) -> object:
        """Data derived from a scope's chunks (a BM25 index, stacked chunk states), built by `build`.

        In-process it is built on every call; the daemon's engine keeps it in memory, keyed by
        `kind`, `config` and the chunks' ids and content hashes, so a changed scope never hits.
        """
        return build()

    # scope
    def scope_chunks(self, doc_ids: list[int] | None = None, collection: str | None = None) -> list[ChunkRecord]:
        docs = self.store.documents()
        if not docs:
            raise EmptyStoreError("nothing is ingested yet", "add documents with: evsel ingest PATH")
        if doc_ids:
            known = {d["id"] for d in docs}
            missing = [i for i in doc_ids if i not in known]
            if missing:
                raise NotFoundError(
                    f"no document with id {', '.join(map(str, missing))}", "list documents with: evsel docs list"
                )
        if collection is not None and self.store.collection_id(collection) is None:
            raise NotFoundError(f"no collection named {collection!r}", "list them with: evsel docs list")
        chunks = self.store.chunks(doc_ids=doc_ids, collection=collection)
        if not chunks:
            raise EmptyStoreError("no documents in that scope", "ingest some, or widen --doc/--collection")
        return chunks

    # ask
    def ask(
        self,
        question: str,
        doc_ids: list[int] | None = None,
        collection: str | None = None,
        top_n: int = 5,
        select: str = "bm25",
        evidence_only: bool = False,
        max_new_tokens: int = 96,
        on_event: EventSink = _ignore,
    ) -> dict:
        from evsel.models.selectors import get_selector

        from .answer import build_messages

        question = question.strip()
        if not question:
            raise EvselError("the question is empty", 'ask something, e.g. evsel ask "who killed the count?"')
        if top_n < 1:
            raise EvselError(f"--top-n {top_n} must be at least 1")
        timings: dict[str, float] = {}
        started = time.perf_counter()
        chunks = self.scope_chunks(doc_ids, collection)
        timings["scope_s"] = time.perf_counter() - started

        selector = get_selector(select, engine=self)
        if hasattr(selector, "on_event"):  # selectors that may encode chunks show a progress bar
            selector.on_event = on_event
        if selector.needs_model or not evidence_only:
            on_event({"type": "progress", "task": "load", "label": "loading the model", "done": 0, "total": 1})
            t = time.perf_counter()
            _ = self.backbone.model
            timings["load_s"] = time.perf_counter() - t
        on_event({"type": "progress", "task": "select", "label": f"selecting evidence ({select})", "done": 0, "total": 1})
        t = time.perf_counter()
        ranked = selector.rank(question, chunks, top_n)
        timings["select_s"] = time.perf_counter() - t

        answer = None
        usage = {}
        if not evidence_only:
            in_document_order = sorted(ranked, key=lambda s: (s.chunk.doc_id, s.chunk.seq))
            on_event({"type": "progress", "task": "generate", "label": "writing the answer", "done": 0, "total": 1})
            t = time.perf_counter()
            generated = self.backbone.generate(build_messages(question, in_document_order), max_new_tokens)
            timings["generate_s"] = time.perf_counter() - t
            answer = generated["text"]
            usage = {"prompt_tokens": generated["prompt_tokens"], "generated_tokens": generated["generated_tokens"]}
        timings["total_s"] = time.perf_counter() - started
        evidence = [
            {"rank": s.rank, "score": round(s.score, 4), **s.chunk.provenance(), "text": s.chunk.text}
            for s in sorted(ranked, key=lambda s: (s.chunk.doc_id, s.chunk.seq))
        ]
        result = {
            "question": question,
            "answer": answer,
            "evidence": evidence,
            "method": {"select": select, "top_n": top_n, "candidates": len(chunks)},
            "timings": {k: round(v, 4) for k, v in timings.items()},
            "usage": usage,
        }
        if not evidence_only or selector.needs_model:
            result["method"]["backbone"] = self.backbone.name
            result["method"]["fingerprint"] = self.backbone.fingerprint
            result["method"]["device"] = self.backbone.plan.device
        return result

    # documents
    def docs_list(self, collection: str | None = None) -> list[dict]:
        if collection is not None and self.store.collection_id(collection) is None:
            raise NotFoundError(f"no collection named {collection!r}", "list them with: evsel docs list")
        return self.store.documents(collection)

    def docs_show(self, doc_id: int, with_chunks: bool = False) -> dict:
        doc = self.store.document(doc_id)
        if with_chunks:
            doc["chunks"] = [
                {**c.provenance(), "text": c.text, "n_tokens": c.n_tokens} for c in self.store.chunks([doc_id])
            ]
        return doc

    def docs_rm(self, doc_ids: list[int]) -> list[dict]:
        docs = [self.store.document(i) for i in doc_ids]  # raises for an unknown id before deleting any
        self.store.remove_documents(doc_ids)
        return [{"id": d["id"], "title": d["title"], "path": d["path"]} for d in docs]

    def models_info(self, load: bool = True) -> dict:
        if load:
            _ = self.backbone.model
        info = self.backbone.info()
        info["load_s"] = round(self.backbone.load_seconds, 3)
        return info


def _metadata(doc: dict) -> dict:
    import json

    value = doc.get("metadata")
    return json.loads(value) if isinstance(value, str) else (value or {})
