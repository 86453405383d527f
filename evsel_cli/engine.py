"""The engine every entry point shares: the CLI in-process, the daemon, tests and scripts.

Functions here take plain arguments, report progress through an `on_event` callback and return
plain dicts, so the same call works locally and over the daemon's socket.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable, Protocol

# the selectors package is light to import (no numpy, no model)
from evsel.models.selectors import DEFAULT as DEFAULT_SELECT
from evsel.models.selectors import DEFAULT_METHODS, register_cleanups
from evsel.models.selectors.default import resolve

from .answer.step import STYLES
from .requests import REQUESTS
from .ingest.chunker import DEFAULT_CHUNK_TOKENS
from .defaults import DATASETS
from .errors import EmptyStoreError, EvselError, NotFoundError
from .requests import AskRequest
from .ingest.run import Ingest, IngestOptions, IngestOutcome, remove_documents, resume_arguments
from .store.journal import Journal, PendingEncode, PendingIngest
from .ingest.parsers import KINDS
from .pipeline import MAX_QUESTION_CHARS, RERANK_TOP, Pipeline, PipelineSpec, readable_question
from .provenance import evidence_label
from .settings import Settings
from .store.store import DEFAULT_COLLECTION, ChunkRecord, Store
from .answer.windows import neighbours_of

# What the commands need to know to parse their options (they import the engine, not its parts).
__all__ = ["DATASETS", "DEFAULT_CHUNK_TOKENS", "DEFAULT_COLLECTION", "DEFAULT_METHODS", "DEFAULT_SELECT", "KINDS",
           "MAX_QUESTION_CHARS", "REQUESTS", "RERANK_TOP", "STYLES", "Engine", "IngestOptions", "IngestOutcome",
           "evidence_label", "resume_arguments"]

Event = dict
EventSink = Callable[[Event], None]


class ScopeCache(Protocol):
    """Where an engine keeps data derived from scopes between requests (daemon/cache.py's)."""

    def scope_data(self, kind: str, chunks: list[ChunkRecord], build: Callable[[], object], *config) -> object: ...


def writable_folder(out: str) -> str:
    """`out`, made and written to once before a run that ends by writing there: a folder it cannot
    be (a read-only disk, a file on the way) is one line now, not a failure after minutes of work.
    The levels the probe made are removed again: a run refused later for its inputs leaves nothing."""
    import errno
    import tempfile

    made = []
    try:
        at = Path(out).absolute()
        while not at.exists() and not at.is_symlink() and at != at.parent:
            made.append(at)
            at = at.parent
        Path(out).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
        for level in made:  # deepest first
            level.rmdir()
    except OSError as exc:
        why = {errno.EROFS: "it is on a read-only file system", errno.ENOTDIR: "a part of it is a file, not a folder",
               errno.EEXIST: "it is a file, not a folder", errno.EACCES: "permission denied",
               errno.ENOSPC: "the disk is full"}.get(exc.errno, exc.strerror or str(exc))
        raise EvselError(f"cannot write to --out {out}: {why}", "choose a folder you can write to") from exc
    return out


def _ignore(_event: Event) -> None:
    pass


class Engine:
    """Holds the store, the (lazily loaded) backbone and the settings of one request.

    In-process an engine serves one command; the daemon makes one per request with `for_request`,
    sharing its resident backbone, store connection and in-memory caches.
    """

    def __init__(self, settings: Settings | None = None, store: Store | None = None, *,
                 model: str | None = None, device: str | None = None, scope_cache: ScopeCache | None = None):
        settings = settings or Settings()
        if model is not None or device is not None:  # a shortcut for scripts, tests and benchmarks
            settings = settings.with_(model=model if model is not None else settings.model,
                                      device=device or settings.device)
        self.settings = settings
        register_cleanups()  # every process with an engine deletes what selectors keep beside a store
        self._store = store
        self._backbone = None
        self.scope_cache = scope_cache  # keeps `scope_data` between requests (the daemon's); None: built each time
        self._eval_states = None
        self.resources: dict = {}  # selector-owned objects (the MiniLM encoder), kept with the engine
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
    def journal(self) -> Journal:
        """The watch list and pending work the daemon keeps in this store's database."""
        return Journal(self.store)

    @property
    def loaded_backbone(self):
        """The backbone if this engine has made one (its weights may not be loaded yet), else None."""
        return self._backbone

    @property
    def backbone(self):
        if self._backbone is None:
            from evsel.models.runtime.backbone import Backbone

            self._backbone = Backbone(self.settings.model, self.settings.device, threads=self.settings.threads,
                                      model_as_given=self.settings.model_as_given)
        return self._backbone

    @property
    def states(self):
        """Per-chunk states in the user's store (filled at ingest, read by ask)."""
        from evsel.models.shared.statecache import StateCache

        return StateCache(self.store)

    @property
    def eval_states(self):
        """Eval's own state cache (EVSEL_HOME/cache/eval.db): eval never writes into the user's store."""
        if self._eval_states is None:
            from evsel import paths
            from evsel.models.shared.statecache import StateCache
            from evsel.store.store import connect

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
    def ingest_stage(self) -> Ingest:
        """Ingest into this engine's store, handed the parts it needs."""
        return Ingest(self.store, self.settings, lambda: self.backbone, self.selector_context)

    def ingest(
        self,
        targets: list[str],
        collection: str = DEFAULT_COLLECTION,
        kind: str = "auto",
        chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
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
        memory summaries (models/qrranker/memory.py) are written after the states."""
        options = IngestOptions(collection, kind, chunk_tokens, encode, resolve_links, summaries)
        return self.ingest_files(targets, options, on_event).files

    def ingest_files(self, targets: list[str], options: IngestOptions = IngestOptions(),
                     on_event: EventSink = _ignore, *, defer: bool = False, journal: bool = False,
                     resume: PendingIngest | None = None, journaled: dict[str, int] | None = None) -> IngestOutcome:
        """`ingest`, with what it leaves to do (`Ingest.files`: `defer`, `journal`, `resume`, `journaled`)."""
        return self.ingest_stage().files(targets, options, on_event, defer=defer, journal=journal, resume=resume,
                                         journaled=journaled)

    def run_deferred(self, work: PendingEncode, on_event: EventSink = _ignore, batch: int = 64,
                     slice_s: float | None = None) -> dict:
        """Compute what an ingest deferred, then delete its record (`Ingest.run_deferred`)."""
        return self.ingest_stage().run_deferred(work, on_event, batch=batch, slice_s=slice_s)

    def encode_states(self, doc_ids: list[int] | None = None, on_event: EventSink = _ignore,
                      batch: int = 64, states: bool = True, summaries: bool = False,
                      slice_s: float | None = None) -> dict:
        """The per-chunk states (and with `summaries` the memory summaries) that are missing for
        these documents (None: every document), every method's, computed by each selector's ingest
        hook (`Ingest.encode_states`; after an ingest, only what the default reads is)."""
        return self.ingest_stage().encode_states(doc_ids, on_event, batch=batch, states=states, summaries=summaries,
                                                 slice_s=slice_s, only_default=False)

    def scope_data(self, kind: str, chunks: list[ChunkRecord], build: Callable[[], object], *config) -> object:
        """Data derived from a scope's chunks (a BM25 index, stacked chunk states), built by `build`.

        In-process it is built on every call; an engine given a `scope_cache` (the daemon's) keeps
        it in memory, keyed by `kind`, `config` and the chunks' ids and content hashes, so a changed
        scope never hits.
        """
        if self.scope_cache is None:
            return build()
        return self.scope_cache.scope_data(kind, chunks, build, *config)

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
    def ask(self, request: AskRequest, on_event: EventSink = _ignore) -> dict:
        """`request.corpus`: a directory written by `evsel corpus build`; its indexes give the first
        stage (bm25, dense or unreal) instead of the local store, and the rest runs as for the store."""
        question, readable = readable_question(request.question, on_event)
        spec = PipelineSpec.of(request.select, request.rerank, request.memory, rerank_top=request.rerank_top,
                               top_n=request.top_n)
        started = time.perf_counter()
        chunks, first, opened = [], None, None
        if request.corpus is not None:
            opened, first = self._corpus_stage(request.corpus, request.select, request.doc_ids, request.collection,
                                               on_event)
        else:
            chunks = self.scope_chunks(request.doc_ids, request.collection)
        timings = {"scope_s": time.perf_counter() - started}
        pipeline = Pipeline(spec, first.context if first else self.selector_context(on_event), first=first,
                            kinds={c.kind for c in chunks} if chunks else None)
        if opened is not None and (pipeline.needs_model or not request.evidence_only):
            from .corpus.query import check_backbone

            check_backbone(opened, self.backbone.fingerprint)  # before anything loads
        pipeline.load_timed(on_event, timings)
        found = pipeline.select(readable, chunks, on_event, timings, memory=request.memory,
                                candidates=len(chunks) if opened is None else opened.n_chunks,
                                corpus=None if opened is None else str(opened.path))
        found.question = question  # the reply echoes the question as asked; the models read `readable`
        if not request.evidence_only:
            neighbours = self.scope_data("neighbours", chunks, lambda: neighbours_of(chunks)) if chunks else None
            found.read_answer(self.backbone, readable, request.max_new_tokens, request.style, neighbours, on_event)
        timings["total_s"] = time.perf_counter() - started
        if not request.evidence_only or pipeline.needs_model:
            found.method.update(backbone=self.backbone.name, fingerprint=self.backbone.fingerprint,
                                device=self.backbone.plan.device)
        return found.to_dict()

    def _corpus_stage(self, corpus: str, select: str, doc_ids, collection, on_event: EventSink):
        """The open corpus and the first stage that reads it (`ask --corpus`). The candidates'
        states for a reranker go to the cache eval keeps for chunks outside the store."""
        from .corpus import query

        if doc_ids or collection is not None:
            raise EvselError("--doc and --collection choose documents of the local store, not of a corpus",
                             "drop them, or ask the local store without --corpus")
        opened = query.open_corpus(corpus)
        method = resolve(select, self.settings, lambda: self.backbone, corpus=True).methods()[0]
        return opened, query.CorpusStage(opened, method, self.selector_context(on_event, for_eval=True),
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
        chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
        max_new_tokens: int = 32,
        per_question: bool = False,
        rerank_top: int = RERANK_TOP,
        answer_style: str = "short",
        memory: bool = False,
        reader: str | None = None,
        on_event: EventSink = _ignore,
    ) -> dict:
        """`evsel eval`: every method through the ask pipeline on the same in-memory chunks. Chunk
        states (and summaries) go to eval's own cache, never into the user's store. `memory`:
        every qrranker reranker reads the candidates' summaries (as qrranker:memory)."""
        from pathlib import Path as _Path

        from .evaluation.datasets import load_dataset
        from .evaluation.runner import EvalConfig, run

        if chunk_tokens < 16:
            raise EvselError(f"--chunk-tokens {chunk_tokens} is too small", "use 16 or more (default 140)")
        config = EvalConfig(methods=list(methods), ks=list(ks or [1, 3, 5, 10]), generate=generate, limit=limit,
                            top_n=top_n, chunk_tokens=chunk_tokens, max_new_tokens=max_new_tokens,
                            per_question=per_question, rerank_top=rerank_top, answer_style=answer_style,
                            memory=memory, reader=reader)
        folder = data_dir or self.settings.data_dir
        data = load_dataset(dataset, _Path(folder) if folder else None, split=split, concat=concat, fold=fold,
                            pdf_reader=self.settings.pdf_reader)
        return run(data, config, self, on_event=on_event)

    def train_convert(self, out: str, options: dict, data_dir: str | None = None,
                      on_event: EventSink = _ignore) -> dict:
        """`evsel train convert`: UNREAL training data in the common JSONL format."""
        out = writable_folder(out)
        from evsel.recipes import unreal as recipe

        folder = data_dir or self.settings.data_dir
        return recipe.convert(Path(out), recipe.DataConfig(**options), self.backbone,
                              Path(folder) if folder else None, on_event)

    def train_unreal(self, out: str, recipe_name: str = "full", data: str | None = None,
                     sources: list[str] | None = None, options: dict | None = None, command: str | None = None,
                     on_event: EventSink = _ignore) -> dict:
        """`evsel train unreal`: train (or resume) UNREAL's adapter; log lines come as events."""
        out = writable_folder(out)
        from evsel.recipes import unreal as recipe

        parts = recipe.RunParts(lambda: self.backbone, lambda: self.states, self.device)
        return recipe.run_recipe(parts, out, recipe_name, data, sources or [], options or {}, command,
                                 self.settings.data_dir, on_event)

    def train_qrranker(self, out: str, detect_heads: bool = False, options: dict | None = None,
                       command: str | None = None, on_event: EventSink = _ignore, recipe_name: str = "full") -> dict:
        """`evsel train qrranker`: with `detect_heads`, QR-head detection on a training seed set
        (OUT/heads.json); without, train (or resume) the reranking adapter of those heads
        (OUT/adapter.safetensors beside OUT/heads.json); log lines come as events."""
        out = writable_folder(out)
        from evsel.recipes import qrranker as recipe

        if detect_heads:
            return recipe.run_detection(self, out, options or {}, command, self.settings.data_dir, on_event)
        return recipe.run_training(self, out, recipe_name, options or {}, command, self.settings.data_dir, on_event)

    def train_hybrid(self, out: str, options: dict | None = None, command: str | None = None,
                     on_event: EventSink = _ignore, recipe_name: str = "full") -> dict:
        """`evsel train hybrid`: the learned fusion's features (cached in OUT/features) and weights
        (OUT/hybrid.json)."""
        out = writable_folder(out)
        from evsel.recipes import hybrid as recipe

        return recipe.run_training(self, out, recipe_name, options or {}, command, self.settings.data_dir, on_event)

    def train_defaults(self, out: str, held_out: list[dict], weights: str | None = None, command: str | None = None,
                       warm_ask_ratios: dict | None = None, candidates: dict | None = None) -> dict:
        """`evsel train defaults`: each kind's default method in OUT/defaults.json, from the fusion's
        fit (`weights`, else EVSEL_HYBRID_WEIGHTS's, else the shipped ones) judged again."""
        from evsel.models.fusion import hybrid
        from evsel.recipes.hybrid import write_defaults

        source = Path(weights or self.settings.hybrid_weights or hybrid.shipped_dir(self.backbone.fingerprint))
        return write_defaults(source, held_out, Path(writable_folder(out)), command or "", warm_ask_ratios,
                              candidates)

    def train_blocksearch(self, out: str, options: dict | None = None, command: str | None = None,
                          on_event: EventSink = _ignore, recipe_name: str = "full") -> dict:
        """`evsel train blocksearch`: train (or resume) BlockSearch's code decoder (OUT/adapter.safetensors)."""
        out = writable_folder(out)
        from evsel.recipes import blocksearch as recipe

        return recipe.run_training(self, out, recipe_name, options or {}, command, self.settings.data_dir, on_event)

    def train_reader(self, out: str, options: dict | None = None, command: str | None = None,
                     on_event: EventSink = _ignore, recipe_name: str = "full") -> dict:
        """`evsel train reader`: the answer-span head, or with `lora`/`resume` the LoRA reader
        (OUT/adapter.safetensors, OUT/reader.json)."""
        out = writable_folder(out)
        options = options or {}
        if options.get("lora") or options.get("resume"):
            from evsel.recipes import lora_reader as recipe
        else:
            from evsel.recipes import reader as recipe

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
        return self.remove_documents(doc_ids)["removed"]

    def remove_documents(self, doc_ids: list[int]) -> dict:
        """`docs_rm`, with the documents whose chunks were deleted (`changed_document_ids`)."""
        return remove_documents(self.store, doc_ids)

    # watched folders: in-process they are only saved; the daemon watches them when it runs (it
    # answers these requests itself, and starts observing at once)
    def watch_add(self, path: str, collection: str = DEFAULT_COLLECTION) -> dict:
        from . import paths

        root = str(paths.watch_folder(path))
        added = self.journal.add_watch(root, collection)
        return {"path": root, "collection": collection, "added": added, "files": None}

    def watch_remove(self, path: str) -> dict:
        from . import paths

        root = paths.watched_path(path)
        if not self.journal.remove_watch(root):
            raise NotFoundError(f"{root} is not watched", "list watched folders with: evsel watch --list")
        return {"path": root, "removed": True}

    def watch_list(self) -> list[dict]:
        return self.journal.watches()

    def sync_folder(self, root: str, collection: str, paths: list[str] | None = None,
                    on_event: EventSink = _ignore) -> dict:
        """Bring the store in line with a watched folder, or with `paths` in it (`Ingest.sync_folder`):
        {root, files, removed, gone, followups, changed_document_ids}."""
        return self.ingest_stage().sync_folder(root, collection, paths, on_event)

    def models_info(self, load: bool = True) -> dict:
        """The backbone, its fingerprint, device, dtype, and which backend generates, with why.
        Loads what generates (llama.cpp needs no dense copy)."""
        backbone = self.backbone
        seconds = backbone.load_generator() if load else 0.0
        info = backbone.info()
        info["load_s"] = round(backbone.load_seconds if backbone.loaded else seconds, 3)
        from evsel.models.selectors.default import default_method, default_methods

        info["default_method"], info["default_why"] = default_method(backbone, self.settings)
        info["default_by_kind"] = {kind: {"method": method, "why": why}
                                   for kind, (method, why) in default_methods(backbone, self.settings).items()}
        from evsel.models.reader.shipped import describe, reader_for, shipped_readers

        chosen = shipped_readers(backbone.fingerprint)
        info["reader_by_kind"] = {
            kind: {"reader": describe(reader_for(backbone, dialogue=kind == "dialogue")) if load else None,
                   "why": chosen.get(kind, {}).get("why", "the backbone's one shipped reader")}
            for kind in ("prose", "dialogue")}
        return info
