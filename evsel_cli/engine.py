"""The engine every entry point shares: the CLI in-process, the daemon, tests and scripts.

Functions here take plain arguments, report progress through an `on_event` callback and return
plain dicts, so the same call works locally and over the daemon's socket.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

# the selectors package is light to import (no numpy, no model); importing it also registers the
# cleanups of what selectors keep beside a store, so every process with an engine runs them
from evsel.models.selectors import DEFAULT as DEFAULT_SELECT
from evsel.models.selectors import DEFAULT_METHODS, MethodSpec
from evsel.models.selectors import HELP as SELECTORS_HELP

from . import chunker
from .answer import STYLES
from .api import REQUESTS
from .chunker import DEFAULT_CHUNK_TOKENS
from .defaults import DATASETS
from .errors import EmptyStoreError, EvselError, InputError, NotFoundError, known_error
from .parsers import KINDS, collect_files, parse_file, read_file
from .pipeline import RERANK_TOP, Pipeline, PipelineSpec, answer
from .provenance import evidence_label
from .settings import Settings
from .store import DEFAULT_COLLECTION, ChunkRecord, PendingEncode, PendingIngest, Store

# What the commands need to know to parse their options (they import the engine, not its parts).
__all__ = ["DATASETS", "DEFAULT_CHUNK_TOKENS", "DEFAULT_COLLECTION", "DEFAULT_METHODS", "DEFAULT_SELECT", "KINDS",
           "REQUESTS", "RERANK_TOP", "SELECTORS_HELP", "STYLES", "Engine", "IngestOptions", "IngestOutcome",
           "evidence_label", "resume_arguments"]

Event = dict
EventSink = Callable[[Event], None]


def _ignore(_event: Event) -> None:
    pass


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


@dataclass(frozen=True)
class IngestOptions:
    """How an ingest reads and stores its files: `Engine.ingest`'s options."""

    collection: str = DEFAULT_COLLECTION
    kind: str = "auto"  # auto picks by extension and content
    chunk_tokens: int = chunker.DEFAULT_CHUNK_TOKENS
    encode: bool | None = None  # chunk states after storing; None: the settings decide (EVSEL_ENCODE)
    resolve_links: bool = True  # store a file under its resolved path (off: as found, for watched links)
    summaries: bool = False  # QRRanker's memory summaries after the states

    @classmethod
    def from_params(cls, params: dict) -> "IngestOptions":
        """From an ingest request's params (`Engine.ingest`'s keyword arguments)."""
        return cls(**{k: v for k, v in params.items() if k not in ("targets", "on_event")})

    def stored(self) -> dict:
        """What a pending-ingest record keeps (encode and summaries it keeps resolved, on their own)."""
        return {k: v for k, v in asdict(self).items() if k not in ("encode", "summaries")}


@dataclass
class IngestOutcome:
    """What an ingest did and what it left to do."""

    files: list[dict]  # one result per file (FileResult.to_dict()): what the `ingest` request returns
    # the stored documents' chunk states and summaries, when the caller runs them later (`defer`):
    # recorded in the store until `Engine.run_deferred` has done them
    followups: list[PendingEncode] = field(default_factory=list)


def _name_failure(path: Path) -> FileResult | None:
    """The failed result of a file whose name the store (UTF-8 text) cannot record as it is
    (caf\udce9.txt, from a name that is not UTF-8); None for any other name."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        error = InputError("the file name is not valid UTF-8, so the store cannot record it",
                           "rename the file (e.g. convmv -f latin1 -t utf8), then ingest it again", path=str(path))
        return FileResult(str(path), "failed", error=error.to_dict())
    return None


class Engine:
    """Holds the store, the (lazily loaded) backbone and the settings of one request.

    In-process an engine serves one command; the daemon makes one per request with `for_request`,
    sharing its resident backbone, store connection and in-memory caches.
    """

    def __init__(self, settings: Settings | None = None, store: Store | None = None, *,
                 model: str | None = None, device: str | None = None):
        settings = settings or Settings()
        if model is not None or device is not None:  # a shortcut for scripts, tests and benchmarks
            settings = settings.with_(model=model if model is not None else settings.model,
                                      device=device or settings.device)
        self.settings = settings
        self._store = store
        self._backbone = None
        self._eval_states = None
        self.resources: dict = {}  # selector-owned objects (the MiniLM encoder), kept with the engine
        import threading

        self.resources_lock = threading.Lock()

    @property
    def model_arg(self) -> str | None:
        return self.settings.model

    @property
    def device(self) -> str:
        return self.settings.device

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = Store()
        return self._store

    @property
    def backbone(self):
        if self._backbone is None:
            from evsel.models.backbone import Backbone

            self._backbone = Backbone(self.settings.model, self.settings.device, threads=self.settings.threads,
                                      model_as_given=self.settings.model_as_given)
        return self._backbone

    @property
    def states(self):
        """Per-chunk states in the user's store (filled at ingest, read by ask)."""
        from evsel.models.statecache import StateCache

        return StateCache(self.store)

    @property
    def eval_states(self):
        """Eval's own state cache (EVSEL_HOME/cache/eval.db): eval never writes into the user's store."""
        if self._eval_states is None:
            from evsel import paths
            from evsel.models.statecache import StateCache
            from evsel.store import connect

            self._eval_states = StateCache(Store(connect(paths.eval_cache_path())))
        return self._eval_states

    def selector_context(self, on_event: EventSink = _ignore, for_eval: bool = False):
        """The context handed to selectors: the user's store and states for ask, eval's own cache
        (and no store: its chunks live in memory) for eval."""
        from evsel.models.selectors import SelectorContext

        return SelectorContext(
            load_backbone=lambda: self.backbone,
            states=self.eval_states if for_eval else self.states,
            store=None if for_eval else self.store,
            scope_data=self.scope_data,
            on_event=on_event,
            settings=self.settings,
            resources=self.resources,
            resources_lock=self.resources_lock,
        )

    # ingest
    def ingest(
        self,
        targets: list[str],
        collection: str = DEFAULT_COLLECTION,
        kind: str = "auto",
        chunk_tokens: int = chunker.DEFAULT_CHUNK_TOKENS,
        on_event: EventSink = _ignore,
        encode: bool | None = None,
        resolve_links: bool = True,
        summaries: bool = False,
    ) -> list[dict]:
        """Ingest files and directories. A failing file is reported and skipped; others go on.

        With `encode` (default: the settings' EVSEL_ENCODE, on) the chunks' UNREAL states are
        computed right after each file is stored, so the first `ask --select unreal` needs no
        encoding. (The daemon stores first and encodes in the background: `ingest_files` with
        `defer`.) Each file is stored under its resolved path (symlinks followed); with
        `resolve_links` off, under its absolute path as found (a watched folder tracks a link by
        its own name, so deleting the link removes the document). With `summaries`, QRRanker's
        memory summaries (models/memory.py) are written after the states."""
        options = IngestOptions(collection, kind, chunk_tokens, encode, resolve_links, summaries)
        return self.ingest_files(targets, options, on_event).files

    def ingest_files(self, targets: list[str], options: IngestOptions = IngestOptions(),
                     on_event: EventSink = _ignore, *, defer: bool = False, journal: bool = False,
                     resume: PendingIngest | None = None, journaled: dict[str, int] | None = None) -> IngestOutcome:
        """`ingest`, with what it leaves to do.

        `defer`: the chunk states and summaries are not computed here; they are recorded in the
        store and returned as `followups` (each ingested file's result says `"states"` and/or
        `"summaries": "background"`), for the caller to run with `run_deferred`. Otherwise they
        run inline, right after each file is stored. `journal`: each file is recorded in the
        store (`PendingIngest`, with this request's options and settings) before it is read and
        the record deleted once the file is done or the ingest ends, so only a crash leaves
        records behind; `resume`: the record of the one file this call finishes after a crash.
        `journaled`: kept up to date with the records still open (path -> row id), so a caller that
        abandons a call that does not stop (a daemon exiting) can delete them itself."""
        collection, kind, chunk_tokens = options.collection, options.kind, options.chunk_tokens
        encode, summaries = self.settings.encode_at_ingest(options.encode), options.summaries
        if chunk_tokens < 16:
            raise EvselError(f"--chunk-tokens {chunk_tokens} is too small", "use 16 or more (default 140)")
        _ = self.store  # opened (and its home checked) first: a store it cannot use fails the command, not each file
        results: list[FileResult] = []
        files: list[Path] = []
        for target in targets:
            try:
                files.extend(collect_files(Path(target).expanduser()))
            except EvselError as exc:
                results.append(FileResult(str(target), "failed", error=exc.to_dict()))
                on_event({"type": "file", **results[-1].to_dict()})

        def where(f: Path) -> Path:
            return f.resolve() if options.resolve_links else Path(os.path.abspath(f))

        found: dict[Path, Path] = {}  # where each file is stored -> the file as found (its name labels progress)
        for f in files:
            found.setdefault(where(f), f)
        paths = list(found)
        misnamed = {path: failure for path in paths if (failure := _name_failure(path)) is not None}
        open_records = journaled if journaled is not None else {}
        if resume is not None:
            open_records[resume.path] = resume.id
        elif journal:
            recorded = self.store.add_pending_ingests([
                PendingIngest(str(path), collection, kind, chunk_tokens, options.stored(), encode=encode,
                              summaries=summaries, settings=self.settings)
                for path in paths if path not in misnamed])
            open_records.update((item.path, item.id) for item in recorded)
        deferred: list[int] = []
        try:
            for index, path in enumerate(paths):
                on_event({"type": "progress", "task": "files", "label": found[path].name, "done": index,
                          "total": len(paths)})
                result = misnamed.get(path) or self._ingest_file(path, collection, kind, chunk_tokens, on_event)
                if result.status == "ingested" and defer:
                    deferred.extend(result.doc_ids)
                elif result.status == "ingested":
                    if encode:
                        self._encode_states(result, on_event)
                    if summaries:
                        self._encode_states(result, on_event, states=False, summaries=True)
                results.append(result)
                if str(path) in open_records:
                    self.store.finish_pending_ingest(open_records.pop(str(path)))
                on_event({"type": "file", **result.to_dict()})
            on_event({"type": "progress", "task": "files", "label": "", "done": len(paths), "total": len(paths)})
        except BaseException as exc:
            # cancelled after some files were stored (each all or nothing): the caller can say which
            exc.stored_files = [r.path for r in results if r.status == "ingested"]
            raise
        finally:
            # finished, failed or cancelled: nothing to resume. Only a crash skips this.
            while open_records:
                self.store.finish_pending_ingest(open_records.popitem()[1])
        outcome = IngestOutcome([r.to_dict() for r in results])
        if deferred and (encode or summaries):
            work = PendingEncode(deferred, self.settings, states=encode, summaries=summaries)
            outcome.followups.append(self.store.add_pending_encode(work))
            for r in outcome.files:
                if r["status"] == "ingested":
                    r.update({key: "background" for key, on in (("states", encode), ("summaries", summaries)) if on})
        return outcome

    def run_deferred(self, work: PendingEncode, on_event: EventSink = _ignore, batch: int = 64,
                     slice_s: float | None = None) -> dict:
        """Compute what an ingest deferred (`IngestOutcome.followups`, or the store's pending
        encodes after a crash), then delete its record. Returns `encode_states`'s outcome.

        `slice_s`: encode in slices of about this many seconds (sized from the last slice's time
        per chunk), with a progress event after each, so a caller that stops the work from
        `on_event` (the daemon, for a waiting request) waits one short slice at most. Progress
        then counts the documents' states, done/total of the whole job, across restarts."""
        outcome = self.encode_states(work.doc_ids, on_event, batch=batch, states=work.states,
                                     summaries=work.summaries, slice_s=slice_s)
        if work.id is not None:
            self.store.finish_pending_encode(work.id)
        return outcome

    def _encode_states(self, result: FileResult, on_event: EventSink, states: bool = True,
                       summaries: bool = False) -> None:
        """Per-chunk model states (and/or summaries) for a stored file. A failure here leaves the
        file ingested: they are computed later, when a selector first needs them."""
        started = time.perf_counter()
        try:
            self.encode_states(result.doc_ids, on_event, states=states, summaries=summaries)
        except EvselError as exc:
            what = "chunk states" if states else "summaries"
            result.warnings.append(f"{what} not computed now ({exc.message}); they will be at the first ask")
            on_event({"type": "warning", "message": f"{result.path}: {result.warnings[-1]}"})
        result.seconds += time.perf_counter() - started

    def encode_states(self, doc_ids: list[int] | None = None, on_event: EventSink = _ignore,
                      batch: int = 64, states: bool = True, summaries: bool = False,
                      slice_s: float | None = None) -> dict:
        """Compute the per-chunk states ingest keeps (UNREAL's, for the adapter in use) that are
        missing for these documents (None: every document), and with `summaries` the memory
        summaries of their blocks. Written per batch (per summary), so an interrupted run resumes
        where it stopped. Returns {"encoded": chunks computed, "missing_before": ..., "summaries": written}."""
        outcome = self._encode_unreal_states(doc_ids, on_event, batch, slice_s) if states else {
            "encoded": 0, "missing_before": 0}
        if states and self.settings.qrranker_kv:
            outcome["qrranker_kv"] = self._encode_qrranker_kv(doc_ids, on_event, batch, slice_s)
        if summaries:
            outcome["summaries"] = self.write_summaries(doc_ids, on_event)
        return outcome

    def write_summaries(self, doc_ids: list[int] | None = None, on_event: EventSink = _ignore) -> int:
        """The memory summaries (models/memory.py) of these documents' blocks that are missing;
        returns how many were written."""
        from evsel.models import memory

        known = {d["id"] for d in self.store.documents()}
        doc_ids = [d for d in doc_ids if d in known] if doc_ids is not None else None
        if doc_ids == []:
            return 0
        writer = memory.SummaryWriter(self.backbone, self.store)
        missing = writer.missing(memory.blocks_of(self.store.chunks(doc_ids)))
        writer.ensure(missing, on_event, "writing summaries")
        return len(missing)

    def _encode_unreal_states(self, doc_ids: list[int] | None, on_event: EventSink, batch: int,
                              slice_s: float | None = None) -> dict:
        from evsel.models import unreal

        key = unreal.ingest_state_key(self.backbone, self.settings.unreal_adapter)
        if key is None:
            return {"encoded": 0, "missing_before": 0}
        method, config = key
        known = {d["id"] for d in self.store.documents()}
        doc_ids = [d for d in doc_ids if d in known] if doc_ids is not None else None
        if doc_ids == []:
            return {"encoded": 0, "missing_before": 0}
        missing = self.store.chunks_missing_states(self.backbone.fingerprint, method, config, doc_ids)
        if missing and slice_s is not None:
            total = len({c.content_hash for c in self.store.chunks(doc_ids)})
            label = "UNREAL chunk states"

            def encode(part: list[ChunkRecord]) -> None:
                unreal.encode_at_ingest(self.backbone, self.states, part, self.settings.unreal_adapter, None,
                                        batch=len(part))

            def progress(done: int) -> None:
                on_event({"type": "progress", "task": "encode", "label": label,
                          "done": total - len(missing) + done, "total": total})

            timed_slices(missing, encode, slice_s, progress, most=batch)
        elif missing:
            unreal.encode_at_ingest(self.backbone, self.states, missing, self.settings.unreal_adapter, on_event,
                                    batch=batch)
        return {"encoded": len(missing), "missing_before": len(missing)}

    def _encode_qrranker_kv(self, doc_ids: list[int] | None, on_event: EventSink, batch: int,
                            slice_s: float | None = None) -> int:
        """QRRanker's block KV files (EVSEL_QRRANKER_KV) that these documents' chunks lack, for the
        reranker as `--rerank qrranker` builds it; written per slice, so a stopped run resumes.
        Returns the chunks encoded (0 where the backbone has no QR heads: the first ask says why)."""
        from evsel.models.selectors import get_selector

        known = {d["id"] for d in self.store.documents()}
        doc_ids = [d for d in doc_ids if d in known] if doc_ids is not None else None
        if doc_ids == []:
            return 0
        selector = get_selector("qrranker", self.selector_context(on_event))
        try:
            files = selector.scorer.kv_files
        except EvselError as exc:  # no QR heads for this backbone: nothing to compute
            on_event({"type": "warning", "message": f"QRRanker block KV not computed ({exc.message})"})
            return 0
        if files is None:
            return 0
        chunks = list({c.content_hash: c for c in self.store.chunks(doc_ids)}.values())
        missing = [c for c in chunks if not files.has(c.content_hash)]
        label = "QRRanker block KV"

        def progress(done: int) -> None:
            on_event({"type": "progress", "task": "encode", "label": label,
                      "done": len(chunks) - len(missing) + done, "total": len(chunks)})

        if slice_s is not None:
            timed_slices(missing, selector.encode_store_kv, slice_s, progress, most=batch)
        else:
            for start in range(0, len(missing), batch):
                progress(start)
                selector.encode_store_kv(missing[start:start + batch])
            progress(len(missing))
        return len(missing)

    def _chunker_config(self, chunk_tokens: int) -> dict:
        return {"tokens": chunk_tokens, "tokenizer": self.backbone.fingerprint[:16]}

    def _ingest_file(
        self, path: Path, collection: str, kind: str, chunk_tokens: int, on_event: EventSink
    ) -> FileResult:
        started = time.perf_counter()
        warnings: list[str] = []
        try:
            # read once and hash exactly the bytes parsed: a file rewritten meanwhile is never stored
            # with the hash of one version and the text of another
            data = read_file(path, kind)
            sha = hashlib.sha256(data).hexdigest()
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

            def reading(done: int, total: int) -> None:  # a long EPUB: shown, and a daemon job may stop here
                on_event({"type": "progress", "task": "parse", "label": f"reading {path.name}", "done": done,
                          "total": total})

            parsed = parse_file(path, kind, warnings, data=data, on_progress=reading)
            del data
            on_event({"type": "progress", "task": "parse", "label": f"read {path.name}", "done": 1, "total": 1})
            for message in warnings:
                on_event({"type": "warning", "message": message})
            # chunks are made as the store writes them, a batch at a time: a book's chunk list is
            # never held whole. One "store" stage: chunks stored, of an estimate until the last.
            all_chars = sum(len(doc.text) for doc in parsed) or 1
            made = {"chunks": 0, "chars": 0, "stored": 0}

            def estimate() -> int:
                if not made["chars"]:
                    return max(2, all_chars // (chunk_tokens * 3))  # about 3 characters a token
                return max(made["stored"], made["chunks"] + 1, round(made["chunks"] * all_chars / made["chars"]))

            def storing(done: int, total: int | None) -> None:  # inside the file's transaction: a cancel here rolls it back
                made["stored"] = done
                on_event({"type": "progress", "task": "store", "label": f"storing {path.name}", "done": done,
                          "total": total if total is not None else estimate()})

            def records(doc, before: int):
                """The document's chunk records as the chunker makes them; refuses a document without text."""
                def chunking(done: int, _total: int) -> None:  # the chunker's pulse: shown, and a cancel lands here
                    made["chars"] = before + done
                    storing(made["stored"], None)

                any_text = False
                for chunk in chunker.iter_chunks(doc, self.backbone, chunk_tokens, chunking):
                    any_text = any_text or bool(chunk.text.strip())
                    made["chunks"] += 1
                    yield chunk.record()
                if not any_text:
                    raise InputError("no text to index", "check the file's contents", path=str(path))

            docs = []
            before = 0
            for doc in parsed:
                metadata = dict(doc.metadata, chunker=config, kind_arg=kind)
                docs.append({"part": doc.part, "kind": doc.kind, "title": doc.title, "metadata": metadata,
                             "n_chars": len(doc.text), "chunks": records(doc, before)})
                before += len(doc.text)
            del parsed
            ids = self.store.replace_file(collection_id, str(path), sha, docs, on_batch=storing)
            n_chunks = made["stored"]
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
            if self.settings.debug:
                raise
            error = known_error(exc) or EvselError(f"unexpected {type(exc).__name__} while ingesting: {exc}",
                                                   "rerun with EVSEL_DEBUG=1 for a traceback and report it")
            error.path = error.path or str(path)
            return FileResult(str(path), "failed", error=error.to_dict(), warnings=warnings,
                              seconds=time.perf_counter() - started)

    # scope
    def scope_data(self, kind: str, chunks: list[ChunkRecord], build: Callable[[], object], *config) -> object:
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
        select: str = DEFAULT_SELECT,
        evidence_only: bool = False,
        max_new_tokens: int = 96,
        rerank: str | None = None,
        rerank_top: int = RERANK_TOP,
        style: str = "short",
        memory: bool = False,
        corpus: str | None = None,
        on_event: EventSink = _ignore,
    ) -> dict:
        """`corpus`: a directory written by `evsel corpus build`; its indexes give the first stage
        (bm25, dense or unreal) instead of the local store, and the rest runs as for the store."""
        question = question.strip()
        if not question:
            raise EvselError("the question is empty", 'ask something, e.g. evsel ask "who killed the count?"')
        method_spec = MethodSpec.of(select, rerank)
        if memory:
            method_spec = method_spec.with_memory()
            rerank = method_spec.rerank.text
        spec = PipelineSpec(method_spec, rerank_top=rerank_top, top_n=top_n)
        timings: dict[str, float] = {}
        started = time.perf_counter()
        first = opened = None
        if corpus is not None:
            chunks: list[ChunkRecord] = []
            opened, first = self._corpus_stage(corpus, select, doc_ids, collection, on_event)
            context = first.context
        else:
            chunks = self.scope_chunks(doc_ids, collection)
            context = self.selector_context(on_event)
        timings["scope_s"] = time.perf_counter() - started

        pipeline = Pipeline(spec, context, first=first)
        if opened is not None and (pipeline.needs_model or not evidence_only):
            from .corpus.query import check_backbone

            check_backbone(opened, self.backbone.fingerprint)  # before anything loads
        if pipeline.needs_model:  # a prose answer needs no model; a dialogue one loads it when it generates
            on_event({"type": "progress", "task": "load", "label": "loading the model", "done": 0, "total": 1})
            t = time.perf_counter()
            pipeline.load()  # the backbone and the selectors' adapters
            timings["load_s"] = time.perf_counter() - t
        else:
            pipeline.load()  # what a selector loads apart from the backbone (MiniLM)
        ran = spec.name  # `default` is named by what it runs (default>qrranker: bm25>qrranker)
        if select == DEFAULT_SELECT and getattr(pipeline.first, "resolved", None):
            ran = pipeline.first.resolved + spec.name[len(select):]
        on_event({"type": "progress", "task": "select", "label": f"selecting evidence ({ran})",
                  "done": 0, "total": 1})
        ranking = pipeline.ranking(question, chunks, pipeline.depth)
        ranked = ranking.scored
        timings.update(ranking.timings)
        evidence = pipeline.evidence(ranked)
        for message in ranking.warnings:
            on_event({"type": "warning", "message": message})
        no_match = bool(ranking.extras.get("no_match"))

        text = None
        usage = {}
        grounded = None
        if not evidence_only:
            on_event({"type": "progress", "task": "generate", "label": "writing the answer", "done": 0, "total": 1})
            generated = answer(self.backbone, question, evidence, max_new_tokens, style)
            timings["generate_s"] = generated["generate_s"]
            text = generated["text"]
            usage = {"prompt_tokens": generated["prompt_tokens"], "generated_tokens": generated["generated_tokens"]}
            grounded = {"style": style, "kind": generated["kind"], "reason": generated["reason"],
                        "span": generated["span"], "generated": generated.get("generated"),
                        "answer_type": generated.get("answer_type")}
            if grounded["span"] is not None:
                cited = evidence[grounded["span"]["passage"] - 1].chunk
                grounded["span"].update({k: v for k, v in cited.provenance().items()
                                         if k in ("doc_id", "title", "path", "chunk_id", "page_start", "page_end",
                                                  "session", "time_start")})
                grounded["span"]["speaker"] = generated.get("speaker")
        timings["total_s"] = time.perf_counter() - started
        # `default` reports the method it ran (bm25, or the measured best)
        method = {"select": getattr(pipeline.first, "resolved", None) or select, "top_n": top_n,
                  "candidates": len(chunks) if opened is None else opened.n_chunks}
        if opened is not None:
            method.update(select=pipeline.first.name, corpus=str(opened.path))
        if rerank is not None:
            method.update(rerank=rerank, rerank_top=rerank_top)
        if no_match:
            method["no_match"] = True
        result = {
            "question": question,
            "answer": text,
            "grounding": grounded,
            "evidence": [{"rank": s.rank, "score": round(s.score, 4), **s.chunk.provenance(), "text": s.chunk.text}
                         for s in evidence],
            "method": method,
            "timings": {k: round(v, 4) for k, v in timings.items()},
            "usage": usage,
        }
        if memory:
            result["memory"] = ranking.extras.get("memory", [])
        if not evidence_only or pipeline.needs_model:
            result["method"]["backbone"] = self.backbone.name
            result["method"]["fingerprint"] = self.backbone.fingerprint
            result["method"]["device"] = self.backbone.plan.device
        return result

    def _corpus_stage(self, corpus: str, select: str, doc_ids, collection, on_event: EventSink):
        """The open corpus and the first stage that reads it (`ask --corpus`). The candidates'
        states for a reranker go to the cache eval keeps for chunks outside the store."""
        from .corpus import query

        if doc_ids or collection is not None:
            raise EvselError("--doc and --collection choose documents of the local store, not of a corpus",
                             "drop them, or ask the local store without --corpus")
        opened = query.open_corpus(corpus)
        return opened, query.CorpusStage(opened, select, self.selector_context(on_event, for_eval=True),
                                         bm25_candidates=self.settings.corpus_bm25_candidates)

    def corpus_add(self, corpus: str, targets: list[str], on_event: EventSink = _ignore) -> dict:
        """`evsel corpus add`: append the documents of `targets` to a corpus, with the states and
        BM25 statistics a build gives them (evsel/corpus/update.py)."""
        from .corpus import update

        return update.add(corpus, targets, self.backbone, self.settings, on_event)

    def corpus_rm(self, corpus: str, docs: list[str]) -> dict:
        """`evsel corpus rm`: delete documents (by sha256 or doc_path) from a corpus."""
        from .corpus import update

        return update.remove(corpus, docs)

    # evaluation and training: engine requests, so they run where the model is resident
    def eval(
        self,
        dataset: str,
        methods: list[str],
        ks: list[int] | None = None,
        generate: bool = False,
        limit: int | None = None,
        split: str | None = None,
        concat: int = 0,
        fold: int | None = None,
        data_dir: str | None = None,
        top_n: int = 5,
        chunk_tokens: int = chunker.DEFAULT_CHUNK_TOKENS,
        max_new_tokens: int = 32,
        per_question: bool = False,
        rerank_top: int = RERANK_TOP,
        answer_style: str = "short",
        memory: bool = False,
        on_event: EventSink = _ignore,
    ) -> dict:
        """`evsel eval`: every method through the ask pipeline on the same in-memory chunks. Chunk
        states (and summaries) go to eval's own cache, never into the user's store. `memory`:
        every qrranker reranker reads the candidates' summaries (as qrranker:memory)."""
        from pathlib import Path as _Path

        from .evaluation import EvalConfig, load_dataset, run

        if chunk_tokens < 16:
            raise EvselError(f"--chunk-tokens {chunk_tokens} is too small", "use 16 or more (default 140)")
        config = EvalConfig(methods=list(methods), ks=list(ks or [1, 3, 5, 10]), generate=generate, limit=limit,
                            top_n=top_n, chunk_tokens=chunk_tokens, max_new_tokens=max_new_tokens,
                            per_question=per_question, rerank_top=rerank_top, answer_style=answer_style,
                            memory=memory)
        folder = data_dir or self.settings.data_dir
        data = load_dataset(dataset, _Path(folder) if folder else None, split=split, concat=concat, fold=fold)
        return run(data, config, self, on_event=on_event)

    def train_convert(self, out: str, options: dict, data_dir: str | None = None,
                      on_event: EventSink = _ignore) -> dict:
        """`evsel train convert`: UNREAL training data in the common JSONL format."""
        from evsel.recipes import unreal as recipe

        folder = data_dir or self.settings.data_dir
        return recipe.convert(Path(out), recipe.DataConfig(**options), self.backbone,
                              Path(folder) if folder else None, on_event)

    def train_unreal(self, out: str, recipe_name: str = "full", data: str | None = None,
                     sources: list[str] | None = None, options: dict | None = None, command: str | None = None,
                     on_event: EventSink = _ignore) -> dict:
        """`evsel train unreal`: train (or resume) UNREAL's adapter; log lines come as events."""
        from evsel.recipes import unreal as recipe

        return recipe.run_recipe(self, out, recipe_name, data, sources or [], options or {}, command,
                                 self.settings.data_dir, on_event)

    def train_qrranker(self, out: str, detect_heads: bool = False, options: dict | None = None,
                       command: str | None = None, on_event: EventSink = _ignore, recipe_name: str = "full") -> dict:
        """`evsel train qrranker`: with `detect_heads`, QR-head detection on a training seed set
        (OUT/heads.json); without, train (or resume) the reranking adapter of those heads
        (OUT/adapter.safetensors beside OUT/heads.json); log lines come as events."""
        from evsel.recipes import qrranker as recipe

        if detect_heads:
            return recipe.run_detection(self, out, options or {}, command, self.settings.data_dir, on_event)
        return recipe.run_training(self, out, recipe_name, options or {}, command, self.settings.data_dir, on_event)

    def train_hybrid(self, out: str, options: dict | None = None, command: str | None = None,
                     on_event: EventSink = _ignore, recipe_name: str = "full") -> dict:
        """`evsel train hybrid`: the learned fusion's features (cached in OUT/features) and weights
        (OUT/hybrid.json)."""
        from evsel.recipes import hybrid as recipe

        return recipe.run_training(self, out, recipe_name, options or {}, command, self.settings.data_dir, on_event)

    def train_blocksearch(self, out: str, options: dict | None = None, command: str | None = None,
                          on_event: EventSink = _ignore, recipe_name: str = "full") -> dict:
        """`evsel train blocksearch`: train (or resume) BlockSearch's code decoder (OUT/adapter.safetensors)."""
        from evsel.recipes import blocksearch as recipe

        return recipe.run_training(self, out, recipe_name, options or {}, command, self.settings.data_dir, on_event)

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

    # watched folders: in-process they are only saved; the daemon watches them when it runs (it
    # answers these requests itself, and starts observing at once)
    def watch_add(self, path: str, collection: str = DEFAULT_COLLECTION) -> dict:
        from . import paths

        root = str(paths.watch_folder(path))
        added = self.store.add_watch(root, collection)
        return {"path": root, "collection": collection, "added": added, "files": None}

    def watch_remove(self, path: str) -> dict:
        from . import paths

        root = paths.watched_path(path)
        if not self.store.remove_watch(root):
            raise NotFoundError(f"{root} is not watched", "list watched folders with: evsel watch --list")
        return {"path": root, "removed": True}

    def watch_list(self) -> list[dict]:
        return self.store.watches()

    def models_info(self, load: bool = True) -> dict:
        """The backbone, its fingerprint, device, dtype, and which backend generates, with why.
        Loads what generates (llama.cpp needs no dense copy)."""
        backbone = self.backbone
        seconds = backbone.load_generator() if load else 0.0
        info = backbone.info()
        info["load_s"] = round(backbone.load_seconds if backbone.loaded else seconds, 3)
        from evsel.models.selectors.default import default_method

        info["default_method"], info["default_why"] = default_method(backbone, self.settings)
        return info


def timed_slices(items: list, work: Callable[[list], None], slice_s: float, progress: Callable[[int], None],
                 most: int = 64, clock: Callable[[], float] = time.perf_counter) -> None:
    """Run `work` over `items` in consecutive slices of about `slice_s` seconds each: the first
    slice holds one item, each next one as many as the last slice's time per item fits (at least
    one, at most `most`). `progress(done)` is called before the first slice and after each one
    (where a caller may stop the work by raising)."""
    done, size = 0, 1
    progress(0)
    while done < len(items):
        part = items[done:done + size]
        started = clock()
        work(part)
        per_item = (clock() - started) / len(part)
        done += len(part)
        progress(done)
        size = most if per_item <= 0 else max(1, min(most, int(slice_s / per_item)))


def resume_arguments(pending: PendingIngest, with_options: bool = True) -> dict:
    """`Engine.ingest`'s arguments that finish a file a crash interrupted: its request's options
    (rows from before m006 have none: their collection, kind and chunk size), or with
    `with_options` off, for a row whose options this version cannot use, its collection alone.
    Whether its states and summaries follow is the request's either way."""
    if with_options:
        params = {"collection": pending.collection, "kind": pending.kind}
        if pending.chunk_tokens is not None:
            params["chunk_tokens"] = pending.chunk_tokens
        params.update(pending.options)
        params = {k: v for k, v in params.items() if k in IngestOptions().stored()}
    else:
        params = {"collection": pending.collection or DEFAULT_COLLECTION}
    return {**params, "targets": [pending.path], "encode": pending.encode, "summaries": pending.summaries}


def _metadata(doc: dict) -> dict:
    import json

    value = doc.get("metadata")
    return json.loads(value) if isinstance(value, str) else (value or {})
