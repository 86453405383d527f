"""The daemon's scheduler: the jobs the model worker runs, one at a time in arrival order, on
resident engines (the first preloaded at start); the light asks it answers beside them; the
background work an ingest leaves (chunk states, summaries), run in short slices that yield to
waiting requests; and at start, the ingests and encodes a crash left unfinished.

A job's progress callback carries its cancellation: a cancelled job stops at its next progress
event (the model finishes the step it is in). A background job lets the requests waiting behind
it run there, between two of its slices, then goes on where it was.
"""

from __future__ import annotations

import inspect
import logging
import queue
import threading
import time
import traceback
import uuid
from collections import deque
from pathlib import Path
from typing import Callable

from evsel.engine import Engine, IngestOptions, resume_arguments
from evsel.errors import EvselError, from_dict, user_message
from evsel.store.journal import Journal, PendingEncode
from evsel.pipeline import needs_model
from evsel.requests import AskRequest
from evsel.settings import Settings
from evsel.store.store import Store

from .cache import ScopeDataCache
from .checks import check_params

log = logging.getLogger("evsel.daemon")

SHUTDOWN_WAIT_S = 30.0  # how long a stopping daemon waits for the running job to stop
MAX_ENGINES = 2  # backbones kept loaded at once (--model / --device combinations)
BACKGROUND_SLICE_S = 0.5  # seconds of background encoding between checks for waiting requests (served there)
BACKGROUND_BATCH = 16  # the most chunks in one such slice


class RequestCancelled(BaseException):
    """Raised from a job's progress callback to stop it (BaseException: the engine must not catch it)."""

    def __init__(self, reason: str = "cancelled"):
        super().__init__(reason)
        self.reason = reason


class Job:
    """One queued request (or internal task) for the model worker."""

    def __init__(self, method: str, params: dict, settings: Settings, client_pid: int | None = None, task=None,
                 label: str = "", background: bool = False):
        self.id = uuid.uuid4().hex[:12]
        self.method = method
        self.params = params
        self.settings = settings  # resolved by the client: absolute paths, its options and variables
        self.client_pid = client_pid
        self.task = task  # internal jobs: a callable(engine, emit) instead of an engine method
        self.label = label or method
        self.background = background  # yields to waiting requests between batches; nobody listens
        self.outbox: queue.Queue = queue.Queue()
        self.cancelled = threading.Event()
        self.cancel_reason = "cancelled"
        self.received_at = time.time()
        self.enqueued = time.perf_counter()
        self.started: float | None = None
        self.last_event: dict | None = None
        self.watch_root: str | None = None  # a watch folder's sync: cancelled when the watch is removed
        self.work: PendingEncode | None = None  # a background job's deferred work (its documents)
        self.journaled: dict[str, int] = {}  # an ingest's open pending_ingests rows (path -> id)
        self.served = False  # run between a background job's slices (the queue still holds it)
        self.served_between = 0  # a background job: the requests it let run between its slices
        self._stage: tuple | None = None  # a background job: ((label, total), since, done then)

    def note_rate(self, event: dict) -> None:
        """A background job's progress: the seconds its current stage has left at the rate so far
        (`eta_s` in the event that status shows), from the first count the stage reported."""
        if event.get("type") != "progress" or not event.get("total"):
            return
        now, key = time.perf_counter(), (event.get("label"), event["total"])
        if self._stage is None or self._stage[0] != key or event["done"] < self._stage[2]:
            self._stage = (key, now, event["done"])
            return
        _, since, first = self._stage
        if event["done"] > first and now > since:
            rate = (event["done"] - first) / (now - since)
            event["eta_s"] = round((event["total"] - event["done"]) / rate, 1)

    def cancel(self, reason: str = "cancelled") -> None:
        self.cancel_reason = reason
        self.cancelled.set()


class Scheduler:
    """The job queue, the model worker and the engines it runs jobs on."""

    def __init__(self, settings: Settings, scope_data: ScopeDataCache, log_path: Path,
                 activity: Callable[[], None] = lambda: None):
        self.settings = settings  # the daemon's own, for jobs no client sent (resumed work, watches)
        self.scope_data = scope_data
        self.log_path = log_path  # named in the error a client gets for a bug
        self.activity = activity  # called when a job starts or ends (the daemon is not idle)
        self.queue: queue.Queue = queue.Queue()
        self.waiting: list[Job] = []  # mirror of the queue, for status and shutdown
        self.waiting_lock = threading.Lock()
        self.running: Job | None = None
        self.engines: dict[tuple, Engine] = {}
        self.engines_lock = threading.Lock()
        self.light_lock = threading.Lock()  # one light request at a time, on light_store
        self.setup_done = threading.Event()  # the worker starts once the backbone's lazy setup is done
        self.preload_state = "pending"  # off | pending | loading | done | failed: why
        # the preload's one measurement of the backbone's load (tokenizer, fingerprint, weights),
        # for the log and status alike
        self.preload_engine: Engine | None = None
        self.preload_s: float | None = None
        self.recent: deque = deque(maxlen=50)
        self.counts = {"requests": 0, "errors": 0, "cancelled": 0, "served_between_slices": 0}
        self.resumed: list[str] = []
        self.watcher = None  # the daemon's Watcher, once it runs: watch syncs report to it
        self.worker_store: Store | None = None
        self.light_store: Store | None = None

    def open_stores(self) -> None:
        """The stores jobs run on (opened once the daemon's home is settled)."""
        self.worker_store = Store(chunk_cache=self.scope_data)  # used by the model thread only
        self.light_store = Store(chunk_cache=self.scope_data)  # light asks only, under light_lock

    # the queue
    def enqueue(self, job: Job) -> int:
        with self.waiting_lock:
            position = len(self.waiting) + (1 if self.running is not None else 0)
            self.waiting.append(job)
        self.queue.put(job)
        return position

    def busy(self) -> bool:
        with self.waiting_lock:
            return bool(self.waiting) or self.running is not None

    def requests_waiting(self) -> bool:
        with self.waiting_lock:
            return any(not j.background for j in self.waiting)

    def forget(self, job: Job) -> None:
        """A cancelled job leaves the waiting list now (the worker drops it when it comes up)."""
        with self.waiting_lock:
            if job in self.waiting:
                self.waiting.remove(job)

    def queue_status(self) -> dict:
        with self.waiting_lock:
            waiting = [{"method": j.label, "waiting_s": round(time.perf_counter() - j.enqueued, 2)}
                       for j in self.waiting if not j.background]
            background = [{"method": j.label, "running": j is self.running, "progress": j.last_event}
                          for j in ([self.running] if self.running is not None else []) + self.waiting
                          if j.background and not j.cancelled.is_set()]
            running = self.running
        return {
            "running": None if running is None else {
                "method": running.label, "id": running.id,
                "running_s": round(time.perf_counter() - (running.started or time.perf_counter()), 2),
                "progress": running.last_event,
            },
            "waiting": waiting,
            "background": background,
        }

    def stop(self) -> Job | None:
        """Cancel every job and end the worker; returns the job still running after
        SHUTDOWN_WAIT_S (one in a phase that never looks at its cancel), if any."""
        with self.waiting_lock:
            waiting, self.waiting = self.waiting, []
            running = self.running
        for job in waiting:
            job.cancel("shutdown")
            job.outbox.put({"type": "error", "error": stopped_error()})
        if running is not None:
            running.cancel("shutdown")
        self.queue.put(None)
        deadline = time.monotonic() + SHUTDOWN_WAIT_S
        while self.running is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        abandoned = self.running
        if abandoned is not None and abandoned.journaled:
            self.drop_journal(abandoned)
        return abandoned

    def drop_journal(self, job: Job) -> None:
        """The pending_ingests rows of an ingest the daemon abandons as it stops: the user stopped
        it, so nothing resumes it (its unfinished file is rolled back when the process exits)."""
        records = list(dict(job.journaled).items())  # the worker may still be removing some
        log.info("%s %s did not stop in %.0fs; dropping its %d pending file(s)", job.label, job.id,
                 SHUTDOWN_WAIT_S, len(records))
        try:
            store = Store()
            store.wait_for_writers(5.0)  # the job may hold the write lock
            journal = Journal(store)
            for _path, record_id in records:
                journal.finish_pending_ingest(record_id)
        except Exception as exc:  # noqa: BLE001  stopping goes on: the rows are resumed at the next start
            log.warning("could not drop the pending files of %s %s: %s", job.label, job.id, exc)

    # engines
    def engine_for(self, settings: Settings) -> Engine:
        """The resident engine for the settings' model and device, set to the request's settings
        (jobs run one at a time, so the worker's engine serves one request at a time)."""
        model = settings.model
        if model and not Path(model).exists():
            # not kept: the engine's own check reports the missing path
            return Engine(settings, store=self.worker_store, scope_cache=self.scope_data)
        key = (str(Path(model).resolve()) if model else None, settings.device)
        with self.engines_lock:
            engine = self.engines.pop(key, None)
            if engine is None:
                engine = Engine(settings, store=self.worker_store, scope_cache=self.scope_data)
            engine.settings = settings
            self.engines[key] = engine  # most recently used last
            while len(self.engines) > MAX_ENGINES:
                evicted = next(iter(self.engines))
                log.info("unloading backbone %s (%s)", *evicted)
                del self.engines[evicted]
        return engine

    def preload(self) -> None:
        """Load the backbone of the daemon's settings at start (its own thread)."""
        self.preload_state = "loading"
        try:
            engine = self.engine_for(self.settings)
            started = time.perf_counter()
            try:
                # first, and before any job runs (the backbone's lazy setup is not thread-safe): an ingest
                # needs only the tokenizer, and need not wait for the model
                _ = engine.backbone.fingerprint
                _ = engine.backbone.tokenizer
            finally:
                self.setup_done.set()
            _ = engine.backbone.model
            self.preload_engine, self.preload_s = engine, time.perf_counter() - started
            self.preload_state = "done"
            log.info("backbone loaded: %s on %s in %.1fs", engine.backbone.name, engine.backbone.plan.device,
                     self.preload_s)
        except EvselError as exc:
            self.preload_state = f"failed: {exc.line()}"
            log.error("preloading the backbone failed: %s", exc.line())
        except Exception as exc:  # noqa: BLE001  a broken model file must not stop the daemon
            self.preload_state = f"failed: {user_message(exc)}"
            log.error("preloading the backbone failed:\n%s", traceback.format_exc())
        finally:
            self.setup_done.set()

    def resident_engines(self) -> list[Engine]:
        with self.engines_lock:
            return list(self.engines.values())

    # the model worker
    def worker(self) -> None:
        self.setup_done.wait()
        while True:
            job = self.queue.get()
            if job is None:
                return
            if job.served:  # run already, between a background job's slices
                continue
            with self.waiting_lock:
                if job in self.waiting:
                    self.waiting.remove(job)
            self.process(job)

    def process(self, job: Job) -> None:
        """Run one job on the model thread and send its client the outcome."""
        with self.waiting_lock:
            if job.cancelled.is_set():
                self.record(job, "cancelled")
                return
            self.running = job
        job.started = time.perf_counter()
        self.activity()
        status = "ok"
        try:
            result = self.run(job)
            job.outbox.put({"type": "result", "result": result, "meta": self.meta(job)})
        except RequestCancelled as exc:
            status = "cancelled"
            self.counts["cancelled"] += 1
            stored = getattr(exc, "stored_files", None)  # an ingest's files finished before the cancel
            if job.cancel_reason == "shutdown":
                job.outbox.put({"type": "error", "error": stopped_error()})
            else:  # for a client that cancelled and waits to hear what was stored
                job.outbox.put({"type": "cancelled", "stored": stored})
            log.info("%s %s: cancelled%s", job.label, job.id, "" if stored is None else
                     f"; stored before it: {', '.join(stored)}" if stored else "; nothing stored")
        except Exception as exc:  # noqa: BLE001  a bug in one request must not take the daemon down
            status = self.reply_failure(job, exc)
        finally:
            with self.waiting_lock:
                self.running = None
            self.activity()
        self.record(job, status)

    def serve_waiting(self, background: Job) -> None:
        """Run the requests waiting behind a background job now, between two of its slices, then
        hand the model back to it: it goes on where it was, without setting up again (unwinding
        and requeueing it cost seconds of setup at every ask, and the encode crawled)."""
        served = 0
        while True:
            with self.waiting_lock:
                job = next((j for j in self.waiting if not j.background), None)
                if job is None:
                    break
                self.waiting.remove(job)
            job.served = True  # the queue still holds it: the worker skips it there
            self.process(job)
            served += 1
        self.engine_for(background.settings)  # the engine back on the background job's settings
        with self.waiting_lock:
            self.running = background
        background.served_between += served
        self.counts["served_between_slices"] += served

    def meta(self, job: Job) -> dict:
        now = time.perf_counter()
        return {"queue_s": round((job.started or now) - job.enqueued, 4),
                "run_s": round(now - (job.started or now), 4), "received_at": job.received_at}

    def record(self, job: Job, status: str) -> None:
        entry = {"id": job.id, "method": job.label, "client_pid": job.client_pid, "received_at": job.received_at,
                 **{k: v for k, v in self.meta(job).items() if k != "received_at"}, "status": status}
        self.recent.append(entry)
        level = logging.INFO if status in ("ok", "cancelled") else logging.WARNING
        log.log(level, "%s %s (client %s): %s, queued %.2fs, ran %.2fs", job.label, job.id, job.client_pid, status,
                entry["queue_s"], entry["run_s"])

    def reply_failure(self, job: Job, exc: Exception) -> str:
        """Send the job's client the error `exc` stands for (an EvselError as it is, a bug with its
        traceback logged); returns the status to record."""
        self.counts["errors"] += 1
        if isinstance(exc, EvselError):
            job.outbox.put({"type": "error", "error": exc.to_dict(), "meta": self.meta(job)})
            return f"error: {exc.line()}"
        log.error("%s %s failed:\n%s", job.label, job.id, traceback.format_exc())
        job.outbox.put({"type": "error", "error": internal_error(exc, self.log_path), "meta": self.meta(job)})
        return f"error: {user_message(exc)}"

    def emitter(self, job: Job):
        def emit(event: dict) -> None:
            if job.cancelled.is_set():
                raise RequestCancelled(job.cancel_reason)
            job.last_event = event
            if job.background:
                job.note_rate(event)
                if self.requests_waiting():
                    self.serve_waiting(job)
                    if job.cancelled.is_set():  # a request removed its documents, or the daemon stops
                        raise RequestCancelled(job.cancel_reason)
                return
            job.outbox.put({"type": "event", "event": event})

        return emit

    def run(self, job: Job):
        emit = self.emitter(job)
        engine = self.engine_for(job.settings)
        if job.task is not None:
            return job.task(engine, emit)
        if job.method == "ingest":
            # stored now (each file recorded until done), states and summaries in the background:
            # the client gets its answer in seconds
            params = job.params
            outcome = engine.ingest_files(params["targets"], IngestOptions.from_params(params), emit, defer=True,
                                          journal=True, journaled=job.journaled)
            self.queue_deferred(outcome.followups)
            self.scope_data.invalidate(set(outcome.changed_document_ids))
            return outcome.files
        if job.method == "ask":
            return engine.ask(AskRequest(**job.params), on_event=emit)
        fn = getattr(engine, job.method)
        params = dict(job.params)
        if "on_event" in inspect.signature(fn).parameters:
            params["on_event"] = emit
        return fn(**params)

    # light requests: answered beside the model worker
    def light(self, job: Job) -> bool:
        """Does the job need no model, with no request ahead of it (background work aside)?"""
        params = job.params
        if job.method != "ask":
            return False
        def scope_kinds() -> set[str] | None:  # what the default's methods depend on (the fusion for chats)
            if params.get("corpus") or self.light_store is None:
                return None
            with self.light_lock:
                return self.light_store.scope_kinds(params.get("doc_ids"), params.get("collection"))

        try:
            if needs_model(params.get("select"), job.settings, params.get("rerank"), params.get("memory"),
                           evidence_only=params.get("evidence_only") is True, scope_kinds=scope_kinds):
                return False
        except EvselError:  # a missing model: the worker reports it
            return False
        with self.waiting_lock:
            return not any(not j.background for j in self.waiting) and (
                self.running is None or self.running.background)

    def run_light(self, job: Job) -> None:
        with self.light_lock:
            job.started = time.perf_counter()
            status = "ok"
            try:
                engine = Engine(job.settings, store=self.light_store, scope_cache=self.scope_data)
                result = engine.ask(AskRequest(**job.params),
                                    on_event=lambda event: job.outbox.put({"type": "event", "event": event}))
                job.outbox.put({"type": "result", "result": result, "meta": self.meta(job)})
            except Exception as exc:  # noqa: BLE001  a bug in one request must not take the daemon down
                status = self.reply_failure(job, exc)
            self.activity()
            self.record(job, status)

    # per-chunk states and summaries, computed in the background after an ingest (and resumed after a crash)
    def queue_deferred(self, followups: list[PendingEncode]) -> None:
        """A background job for each piece of work an ingest deferred (the store records it until done)."""
        for work in followups:
            def task(engine, emit, work=work):
                outcome = engine.run_deferred(work, emit, batch=BACKGROUND_BATCH, slice_s=BACKGROUND_SLICE_S)
                log.info("states of documents %s: %d chunks encoded, %s summaries written", work.doc_ids,
                         outcome["encoded"], outcome.get("summaries", 0))
                return outcome

            label = f"{'encoding' if work.states else 'writing'} {work.what} of " \
                    f"document{'s' if len(work.doc_ids) > 1 else ''} {id_list(work.doc_ids)}"
            job = Job("encode_states", {}, work.settings, task=task, label=label, background=True)
            job.work = work
            self.enqueue(job)

    def drop_background_of(self, removed: set[int], journal: Journal) -> None:
        """Cancel the background work whose documents were all removed (a running one stops after
        its slice) and delete its record, so it leaves the status and the store at once."""
        with self.waiting_lock:
            jobs = [j for j in ([self.running] if self.running is not None else []) + self.waiting
                    if j.work is not None and set(j.work.doc_ids) <= removed]
            for job in jobs:
                job.cancel("documents removed")
                if job in self.waiting:
                    self.waiting.remove(job)  # the worker skips it when it comes up
        for job in jobs:
            if job.work.id is not None:
                journal.finish_pending_encode(job.work.id)
            log.info("%s: dropped, its documents were removed", job.label)

    # what a crash left unfinished
    def resume_encodes(self) -> None:
        for work in Journal(self.worker_store).pending_encodes():
            log.info("resuming the %s of documents %s", work.what, work.doc_ids)
            self.resumed.append(f"{work.what} of documents {id_list(work.doc_ids)}")
            self.queue_deferred([work])

    def resume_ingests(self) -> None:
        """Queue the files a crash left recorded in the store, each with the options and settings
        of the request it belonged to (`evsel.engine.resume_arguments`)."""
        for pending in Journal(self.worker_store).pending_ingests():
            if pending.unreadable:
                log.warning("pending ingest of %s: unreadable options (%s); resuming with the defaults",
                            pending.path, pending.unreadable)
            params = resume_arguments(pending)
            if check_params("ingest", params) is not None:  # a row this version cannot use as it is
                params = resume_arguments(pending, with_options=False)
            self.resumed.append(pending.path)
            log.info("resuming the ingest of %s, interrupted by a crash", pending.path)

            def task(engine, emit, params=params, pending=pending):
                outcome = engine.ingest_files(params["targets"], IngestOptions.from_params(params), emit, defer=True,
                                              resume=pending)
                self.scope_data.invalidate(set(outcome.changed_document_ids))
                for r in outcome.files:
                    why = f" ({from_dict(r['error']).line()})" if r.get("error") else ""
                    log.info("resumed ingest of %s: %s%s", r["path"], r["status"], why)
                self.queue_deferred(outcome.followups)
                return outcome.files

            self.enqueue(Job("ingest", params, pending.settings or self.settings, task=task, label="resume ingest"))

    # watch folders
    def submit_watch(self, root: str, collection: str, paths: list[str] | None) -> None:
        """Queue a watched folder's sync: `paths` None is the whole folder (the Watcher's callback)."""
        def task(engine, emit):  # nobody listens to emit; it still carries cancellation
            if root not in self.watcher.roots:  # removed while this sync was on its way to the queue
                raise RequestCancelled("watch removed")
            try:
                outcome = engine.sync_folder(root, collection, paths, emit)
            except EvselError as exc:
                self.watcher.record_error(root, exc.line())
                raise
            followups = outcome.pop("followups")
            self.scope_data.invalidate(set(outcome.pop("changed_document_ids")))
            self.watcher.record(root, outcome)
            self.queue_deferred(followups)
            return outcome

        label = f"watch sync {root}" if paths is None else f"watch {len(paths)} file(s) in {root}"
        job = Job("watch", {}, self.settings, task=task, label=label)
        job.watch_root = root
        self.enqueue(job)

    def cancel_watch_jobs(self, root: str) -> int:
        """Drop the queued syncs of a folder no longer watched and cancel its running one (it stops
        at its next progress event, before the next file). Returns how many were cancelled."""
        with self.waiting_lock:
            dropped = [j for j in self.waiting if j.watch_root == root]
            for job in dropped:
                job.cancel("watch removed")
                self.waiting.remove(job)  # the worker skips it when it comes up
            running = self.running if self.running is not None and self.running.watch_root == root else None
            if running is not None:
                running.cancel("watch removed")
        cancelled = len(dropped) + (running is not None)
        if cancelled:
            log.info("watch %s: cancelled %d sync(s)", root, cancelled)
        return cancelled


def internal_error(exc: BaseException, log_path: Path) -> dict:
    """What a client is told of a bug: one line, and where the traceback is."""
    return {"type": "EvselError", "message": user_message(exc).split("; rerun with")[0],
            "hint": f"the daemon's log has the traceback: {log_path}"}


def stopped_error() -> dict:
    return {"type": "DaemonError", "message": "the evsel daemon stopped before this request finished",
            "hint": "run the command again"}


def id_list(ids: list[int]) -> str:
    shown = ", ".join(map(str, ids[:5]))
    return shown + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
