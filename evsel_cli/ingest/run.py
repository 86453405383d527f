"""Ingest: files read, parsed, chunked and stored (each file all or nothing), and the follow-up
work ingest leaves (chunk states, summaries), run inline or recorded for later (`defer`).

The selectors do their own ingest-time work through one hook (`Selector.ingest_work`), so this
module names none of them. `Engine.ingest`, `ingest_files`, `encode_states` and `run_deferred` are
its doors.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from . import chunker
from ..defaults import DEFAULT_COLLECTION
from ..errors import EvselError, InputError, UnsafeHomeError, known_error
from ..store.journal import Journal, PendingEncode, PendingIngest
from .parsers import collect_files, parse_file, read_file

if TYPE_CHECKING:
    from evsel.models.backbone import Backbone
    from evsel.models.selectors import SelectorContext

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
    replaced: list[int] = field(default_factory=list)  # the documents a changed file's new ones replace

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "replaced"}


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
    # the documents whose chunks were added, replaced or deleted (what a cache of chunks must drop)
    changed_document_ids: list[int] = field(default_factory=list)


def name_failure(path: Path) -> FileResult | None:
    """The failed result of a file whose name the store (UTF-8 text) cannot record as it is
    (caf\udce9.txt, from a name that is not UTF-8); None for any other name."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        error = InputError("the file name is not valid UTF-8, so the store cannot record it",
                           "rename the file (e.g. convmv -f latin1 -t utf8), then ingest it again", path=str(path))
        return FileResult(str(path), "failed", error=error.to_dict())
    return None


class Ingest:
    """Ingest into one store: handed its parts (the store, the settings, a loader of the backbone,
    whose tokenizer chunks, and the selectors' context for their ingest work), not the engine."""

    def __init__(self, store, settings, load_backbone: Callable[[], "Backbone"],
                 selector_context: Callable[[EventSink], "SelectorContext"]):
        self.store = store
        self.journal = Journal(store)
        self.settings = settings
        self.load_backbone = load_backbone
        self.selector_context = selector_context

    @property
    def backbone(self):
        return self.load_backbone()

    def files(self, targets: list[str], options: IngestOptions = IngestOptions(),
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
        misnamed = {path: failure for path in paths if (failure := name_failure(path)) is not None}
        open_records = journaled if journaled is not None else {}
        if resume is not None:
            open_records[resume.path] = resume.id
        elif journal:
            recorded = self.journal.add_pending_ingests([
                PendingIngest(str(path), collection, kind, chunk_tokens, options.stored(), encode=encode,
                              summaries=summaries, settings=self.settings)
                for path in paths if path not in misnamed])
            open_records.update((item.path, item.id) for item in recorded)
        deferred: list[int] = []
        try:
            for index, path in enumerate(paths):
                on_event({"type": "progress", "task": "files", "label": found[path].name, "done": index,
                          "total": len(paths)})
                result = misnamed.get(path) or self._ingest_recorded(path, options, open_records.get(str(path)),
                                                                     on_event)
                if result.status == "ingested" and defer:
                    deferred.extend(result.doc_ids)
                elif result.status == "ingested":
                    if encode:
                        self._follow_up(result, on_event)
                    if summaries:
                        self._follow_up(result, on_event, states=False, summaries=True)
                results.append(result)
                if str(path) in open_records:
                    self.journal.finish_pending_ingest(open_records.pop(str(path)))
                on_event({"type": "file", **result.to_dict()})
            on_event({"type": "progress", "task": "files", "label": "", "done": len(paths), "total": len(paths)})
        except BaseException as exc:
            # cancelled after some files were stored (each all or nothing): the caller can say which
            exc.stored_files = [r.path for r in results if r.status == "ingested"]
            raise
        finally:
            # finished, failed or cancelled: nothing to resume. Only a crash skips this.
            while open_records:
                self.journal.finish_pending_ingest(open_records.popitem()[1])
        changed = sorted({i for r in results if r.status == "ingested" for i in (*r.doc_ids, *r.replaced)})
        outcome = IngestOutcome([r.to_dict() for r in results], changed_document_ids=changed)
        if deferred and (encode or summaries):
            work = PendingEncode(deferred, self.settings, states=encode, summaries=summaries)
            outcome.followups.append(self.journal.add_pending_encode(work))
            for r in outcome.files:
                if r["status"] == "ingested":
                    r.update({key: "background" for key, on in (("states", encode), ("summaries", summaries)) if on})
        return outcome

    def _ingest_recorded(self, path: Path, options: IngestOptions, record: int | None,
                         on_event: EventSink) -> FileResult:
        """One file of `files`, its pending-ingest record (if any) ended in the transaction that
        stores it: a crash between the two would leave a stored file to ingest again."""
        finished = None if record is None else (lambda: self.journal.finish_pending_ingest(record))
        return self.ingest_file(path, options.collection, options.kind, options.chunk_tokens, on_event, finished)

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
            self.journal.finish_pending_encode(work.id)
        return outcome

    def _follow_up(self, result: FileResult, on_event: EventSink, states: bool = True,
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
                      slice_s: float | None = None, only_default: bool = True) -> dict:
        """The follow-up work ingest leaves for these documents (None: every document): each
        selector's ingest hook (`Selector.ingest_work`: chunk states, block KV, and with
        `summaries` the memory summaries) computes what is missing. Written per batch (per
        summary), so an interrupted run resumes where it stopped. Returns {"encoded": chunks
        computed, "missing_before": ..., and what each hook adds}. `only_default`: only the states
        the documents' kinds' default methods read (`_default_reads`); else every method's."""
        from evsel.models.selectors import IngestWork, ingest_hooks
        from evsel.models.selectors.default import kind_of

        if doc_ids is not None:  # documents deleted since the work was queued have nothing to do
            known = {d["id"] for d in self.store.documents()}
            doc_ids = [d for d in doc_ids if d in known]
        chunks = self.store.chunks(doc_ids) if doc_ids != [] else []
        work = IngestWork(self.selector_context(on_event), doc_ids, states=states, summaries=summaries,
                          batch=batch, slice_s=slice_s)
        reads = self._default_reads() if only_default else None
        outcome = {"encoded": 0, "missing_before": 0}
        for hook in ingest_hooks():
            wanted = chunks if reads is None else [c for c in chunks if hook.name in reads[kind_of(c.kind)]]
            if summaries and len(wanted) < len(chunks):  # summaries were asked for every chunk, states not
                outcome.update(hook.ingest_work(chunks, replace(work, states=False)))
                if wanted:
                    outcome.update(hook.ingest_work(wanted, replace(work, summaries=False)))
            else:
                outcome.update(hook.ingest_work(wanted, work))
        return outcome

    def _default_reads(self) -> dict[str, set[str]]:
        """{kind: the methods whose per-chunk states the kind's default reads}: what an ingest
        encodes ahead of the first ask (the rest is encoded when a method first needs it)."""
        from evsel.models.selectors.default import resolve, states_read

        methods = resolve("default", self.settings, self.load_backbone).by_kind
        return {kind: states_read(method) for kind, (method, _) in methods.items()}

    def sync_folder(self, root: str, collection: str, paths: list[str] | None = None,
                    on_event: EventSink = _ignore) -> dict:
        """Bring the store in line with a watched folder: with `paths`, those files (the ones that
        exist ingested, the documents of the gone ones removed); without, the whole folder. A file
        is stored under its own path in the folder (a link by its name, not its target's, so
        deleting the link removes its document); chunk states are deferred (`followups`)."""
        if paths is None:
            if not os.path.isdir(root):
                raise InputError("the watched folder is gone", f"stop watching it with: evsel watch --remove {root}",
                                 path=root)
            try:
                present = [os.path.abspath(p) for p in collect_files(Path(root))]
            except InputError:  # an empty folder is fine for a watch
                present = []
            stored = set()
            if self.store.collection_id(collection) is not None:
                prefix = root.rstrip(os.sep) + os.sep
                stored = {d["path"] for d in self.store.documents(collection) if d["path"].startswith(prefix)}
            gone = sorted(p for p in stored if not os.path.exists(p))
        else:
            present = [os.path.abspath(p) for p in paths if os.path.isfile(p)]  # a dangling link is gone
            gone = [p for p in paths if not os.path.exists(p)]
        ingested = IngestOutcome([])
        if present:
            ingested = self.files(present, IngestOptions(collection, resolve_links=False), on_event, defer=True)
        removed = {"removed": [], "changed_document_ids": []}
        collection_id = self.store.collection_id(collection)
        if collection_id is not None and gone:
            ids = [d["id"] for p in gone for d in self.store.documents_for_path(collection_id, p)]
            if ids:
                removed = remove_documents(self.store, ids)
        outcome = {"root": root, "files": ingested.files, "removed": removed["removed"], "gone": gone}
        if paths is None:
            outcome["full"] = True
        changed = sorted({*ingested.changed_document_ids, *removed["changed_document_ids"]})
        return {**outcome, "followups": ingested.followups, "changed_document_ids": changed}

    def _chunker_config(self, chunk_tokens: int) -> dict:
        return {"tokens": chunk_tokens, "tokenizer": self.backbone.fingerprint[:16]}

    def _stored_as_asked(self, doc: dict, sha: str, config: dict, kind: str) -> bool:
        """Is a stored document this file's bytes, chunked and read as this ingest would?"""
        metadata = _metadata(doc)
        return (doc["sha256"] == sha and metadata.get("chunker") == config and metadata.get("kind_arg") == kind
                and (doc["kind"] != "pdf" or metadata.get("reader", "plain") == self.settings.pdf_reader))

    def _parse(self, path: Path, kind: str, data: bytes, warnings: list[str], on_event: EventSink) -> list:
        """The file's documents, parsed from `data`, with progress and the parser's warnings said."""
        on_event({"type": "progress", "task": "parse", "label": f"reading {path.name}", "done": 0, "total": 1})

        def reading(done: int, total: int) -> None:  # a long EPUB: shown, and a daemon job may stop here
            on_event({"type": "progress", "task": "parse", "label": f"reading {path.name}", "done": done,
                      "total": total})

        parsed = parse_file(path, kind, warnings, data=data, on_progress=reading, pdf_reader=self.settings.pdf_reader)
        on_event({"type": "progress", "task": "parse", "label": f"read {path.name}", "done": 1, "total": 1})
        for message in warnings:
            on_event({"type": "warning", "message": message})
        return parsed

    def _store_parsed(self, path: Path, collection_id: int, sha: str, kind: str, chunk_tokens: int, config: dict,
                      parsed: list, on_event: EventSink,
                      before_commit: Callable[[], None] | None = None) -> tuple[list[int], int]:
        """The parsed documents chunked and stored in one transaction: their ids and chunk count."""
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
        ids = self.store.replace_file(collection_id, str(path), sha, docs, on_batch=storing, before_commit=before_commit)
        return ids, made["stored"]

    def ingest_file(
        self, path: Path, collection: str, kind: str, chunk_tokens: int, on_event: EventSink,
        before_commit: Callable[[], None] | None = None,
    ) -> FileResult:
        """One file read, parsed, chunked and stored (all or nothing); a failure is its result.
        `before_commit` runs inside the file's transaction (Store.replace_file)."""
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
            if existing and all(self._stored_as_asked(d, sha, config, kind) for d in existing):
                return FileResult(str(path), "unchanged", [d["id"] for d in existing],
                                  sum(d["n_chunks"] for d in existing), time.perf_counter() - started)
            parsed = self._parse(path, kind, data, warnings, on_event)
            del data
            ids, n_chunks = self._store_parsed(path, collection_id, sha, kind, chunk_tokens, config, parsed, on_event,
                                               before_commit)
            return FileResult(str(path), "ingested", ids, n_chunks, time.perf_counter() - started, warnings=warnings,
                              replaced=[d["id"] for d in existing])
        except UnsafeHomeError:  # the home or the model cache, not this file: the command stops, in one line
            raise
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


def remove_documents(store, doc_ids: list[int]) -> dict:
    """The documents deleted, and those whose chunks were (`changed_document_ids`)."""
    docs = [store.document(i) for i in doc_ids]  # raises for an unknown id before deleting any
    store.remove_documents(doc_ids)
    return {"removed": [{"id": d["id"], "title": d["title"], "path": d["path"]} for d in docs],
            "changed_document_ids": sorted({d["id"] for d in docs})}


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
