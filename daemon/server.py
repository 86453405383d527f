"""The resident daemon: one process per EVSEL_HOME that keeps the backbone loaded.

Threads:
- main: accepts connections on the Unix socket, watches for idle time and stop signals;
- one per connection: reads requests; fast ones (status, docs, watch list) are answered right
  there, model ones become jobs and the thread streams the job's progress back to the client;
- the model worker: runs jobs one at a time, in arrival order, on the engine (the same `Engine`
  methods the CLI runs in-process, so the results are the same);
- the watcher's observer and debouncer, and a preload thread that loads the backbone at start.

A client that disconnects or sends `cancel` cancels its job: a queued job is dropped, a running
one stops at its next progress event (the model finishes the step it is in). Nothing a request
does can stop the daemon: every failure is answered to its client and logged.
"""

from __future__ import annotations

import inspect
import logging
import logging.handlers
import os
import queue
import selectors
import signal
import socket
import threading
import time
import traceback
import uuid
from collections import deque
from pathlib import Path

from evsel import __version__, paths
from evsel import settings as settings_module
from evsel.engine import DEFAULT_SELECT, REQUESTS, Engine, IngestOptions, resume_arguments
from evsel.models.selectors import needs_model
from evsel.models.selectors.default import resolve_select
from evsel.errors import EvselError, InputError, NotFoundError, from_dict, user_message
from evsel.parsers import collect_files
from evsel.settings import Settings
from evsel.store import DEFAULT_COLLECTION, PendingEncode, Store

from . import runtime, watcher
from .cache import CachedChunksStore, DaemonEngine, ScopeDataCache
from .checks import bind_params, check_params, json_type
from .protocol import FAST_METHODS, PROTOCOL_VERSION, LineReader, ProtocolError, encode

log = logging.getLogger("evsel.daemon")

SHUTDOWN_WAIT_S = 30.0  # how long a stopping daemon waits for the running job to stop
DEFAULT_IDLE_TIMEOUT = 1800.0  # seconds without clients, jobs or watches before the daemon exits
MAX_ENGINES = 2  # backbones kept loaded at once (--model / --device combinations)
BACKGROUND_SLICE_S = 0.5  # seconds of background encoding between checks for waiting requests (it yields)
BACKGROUND_BATCH = 16  # the most chunks in one such slice
RECONCILE_S = 2.0  # how often the watch list is re-read from the store
MAX_CLIENTS = 1024  # connections served at once (EVSEL_DAEMON_MAX_CLIENTS); one more is refused with an error
CLIENT_IDLE_S = 600.0  # a connection silent this long between requests is closed (EVSEL_DAEMON_CLIENT_IDLE)
FD_RESERVE = 64  # descriptors kept free of connections: the store, logs, the model's files, watches
LOG_BYTES = 2 << 20
LOG_BACKUPS = 3


class YieldToRequests(BaseException):
    """Raised from a background job's progress callback when a request is waiting: the job stops
    after the batch it just stored and goes back to the end of the queue."""


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

    def cancel(self, reason: str = "cancelled") -> None:
        self.cancel_reason = reason
        self.cancelled.set()


class Daemon:
    def __init__(self, idle_timeout: float = DEFAULT_IDLE_TIMEOUT, preload: bool = True,
                 model: str | None = None, device: str = "auto", foreground: bool = False,
                 debounce: float | None = None):
        self.files = runtime.files()
        self.idle_timeout = idle_timeout
        self.preload = preload
        # the daemon's own settings (its environment at start), for jobs no client sent: resumed
        # ingests and encodes, watched folders
        self.settings = Settings.resolve(model=model, device=device or "auto", no_daemon=False)
        self.foreground = foreground
        self.debounce = debounce if debounce is not None else settings_module.watch_debounce()
        self.build = runtime.build_id()
        self.lock = runtime.HomeLock(self.files.lock)
        self.scope_data = ScopeDataCache()
        self.queue: queue.Queue = queue.Queue()
        self.waiting: list[Job] = []  # mirror of the queue, for status and shutdown
        self.waiting_lock = threading.Lock()
        self.running: Job | None = None
        self.engines: dict[tuple, DaemonEngine] = {}
        self.engines_lock = threading.Lock()
        self.fast_lock = threading.Lock()
        self.light_lock = threading.Lock()  # one light request at a time, on light_store
        self.status_lock = threading.Lock()
        self.clients = 0
        self.clients_lock = threading.Lock()
        self.max_clients = int(_env_number("EVSEL_DAEMON_MAX_CLIENTS", MAX_CLIENTS))
        self.client_idle_s = _env_number("EVSEL_DAEMON_CLIENT_IDLE", CLIENT_IDLE_S)
        self.last_activity = time.monotonic()
        self.stop_event = threading.Event()
        self.started_at = time.time()
        self.recent: deque = deque(maxlen=50)
        self.counts = {"requests": 0, "errors": 0, "cancelled": 0}
        self.preload_state = "off" if not preload else "pending"
        self.setup_done = threading.Event()  # set once the preload has the tokenizer (at once without one)
        if not preload:
            self.setup_done.set()
        self.resumed: list[str] = []
        # the preload's one measurement of the backbone's load (tokenizer, fingerprint, weights),
        # for the log and status alike
        self.preload_engine: Engine | None = None
        self.preload_s: float | None = None
        self.sock: socket.socket | None = None
        self.watcher: watcher.Watcher | None = None
        self.reconciled = time.monotonic()

    # start-up
    def run(self) -> int:
        home = self.files.home
        runtime.check_home_private(home)
        if self.lock.fd is None and not self.lock.acquire():
            running = runtime.read_pid_file(self.files) or {}
            raise runtime.DaemonError(
                f"a daemon is already running for {home} (pid {running.get('pid', '?')})",
                "stop it with: evsel daemon stop",
            )
        try:
            return self._run_locked()
        finally:
            self.lock.release()

    def _run_locked(self) -> int:
        # files a dead daemon left behind are ours to clean: we hold the lock
        for path in (self.files.socket, self.files.pid):
            path.unlink(missing_ok=True)
        self._setup_logging()
        # the home is the process's: made absolute once, before leaving the start directory (requests
        # carry their settings with absolute paths, so no job depends on a working directory)
        os.environ["EVSEL_HOME"] = str(self.files.home.resolve())
        if os.environ.get("EVSEL_MODEL_CACHE"):
            os.environ["EVSEL_MODEL_CACHE"] = str(Path(os.environ["EVSEL_MODEL_CACHE"]).expanduser().resolve())
        os.chdir("/")
        self.worker_store = CachedChunksStore(self.scope_data)  # used by the model thread only
        self.fast_store = Store()  # docs requests and the watch list, under fast_lock
        self.status_store = Store()  # status only, so it never waits behind a slow docs request
        self.fast_engine = Engine(self.settings, store=self.fast_store)
        self.light_store = CachedChunksStore(self.scope_data)  # light asks only, under light_lock
        self.sock = runtime.bind_unix(self.files.socket)
        self.socket_inode = os.stat(self.files.socket).st_ino
        runtime.write_pid_file(self.files, {
            "pid": os.getpid(), "version": __version__, "build": self.build, "protocol": PROTOCOL_VERSION,
            "socket": str(self.files.socket), "started_at": self.started_at,
        })
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: self.stop_event.set())
            signal.signal(signal.SIGINT, lambda *_: self.stop_event.set())
        log.info("daemon started: pid %d, evsel %s, socket %s, idle timeout %s", os.getpid(), self.build,
                 self.files.socket, f"{self.idle_timeout:g}s" if self.idle_timeout > 0 else "off")
        threading.Thread(target=self._worker, name="evsel-model", daemon=True).start()
        if self.preload:
            threading.Thread(target=self._preload, name="evsel-preload", daemon=True).start()
        self._resume_pending()
        self._resume_encodes()
        self.watcher = watcher.Watcher(self._submit_watch, self.debounce)
        self.watcher.start()
        for row in self.fast_store.watches():
            self.watcher.watch(row["path"], row["collection"])
        try:
            self._accept_loop()
        finally:
            self._shutdown()
        return 0

    def _setup_logging(self) -> None:
        log.setLevel(logging.INFO)
        log.propagate = False
        for handler in list(log.handlers):
            log.removeHandler(handler)
        # opened 0600 with O_NOFOLLOW (at start and at each rotation): a symlink planted in the home is refused
        handler = runtime.PrivateLogHandler(self.files.log, maxBytes=LOG_BYTES, backupCount=LOG_BACKUPS)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.addHandler(handler)
        if self.foreground:
            stream = logging.StreamHandler()
            stream.setFormatter(logging.Formatter("evsel daemon: %(message)s"))
            log.addHandler(stream)

    def _preload(self) -> None:
        self.preload_state = "loading"
        try:
            engine = self._engine_for(self.settings)
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

    # the accept loop, idle time and shutdown
    def _accept_loop(self) -> None:
        self.max_clients = _fit_clients_to_fd_limit(self.max_clients)
        self.sock.settimeout(0.25)
        while not self.stop_event.is_set():
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                conn = None
            except OSError as exc:
                log.error("accept failed: %s", exc)
                time.sleep(0.1)
                conn = None
            if conn is not None:
                with self.clients_lock:
                    full = self.clients >= self.max_clients
                    if not full:
                        self.clients += 1
                    self.last_activity = time.monotonic()
                if full:
                    self._refuse(conn)
                else:
                    threading.Thread(target=self._serve, args=(conn,), name="evsel-client", daemon=True).start()
            # housekeeping, however busy the socket is
            if self._idle_expired():
                log.info("idle for %.0fs: shutting down", self.idle_timeout)
                break
            if time.monotonic() - self.reconciled > RECONCILE_S:
                self._reconcile_watches()
                if not self._socket_is_ours():
                    log.info("the socket %s was removed or replaced: nobody can reach this daemon, stopping",
                             self.files.socket)
                    break

    def _reconcile_watches(self) -> None:
        """Follow the store's watch list, which another process (evsel --no-daemon watch) may change."""
        self.reconciled = time.monotonic()
        try:
            with self.status_lock:
                rows = {r["path"]: r["collection"] for r in self.status_store.watches()}
        except Exception as exc:  # noqa: BLE001  a locked store now is fine next time
            log.warning("reading the watch list failed: %s", exc)
            return
        current = {root: entry["collection"] for root, entry in list(self.watcher.roots.items())}
        for root, collection in rows.items():
            if current.get(root) != collection:
                log.info("watch %s (collection %s): found in the store", root, collection)
                self.watcher.watch(root, collection)
        for root in set(current) - set(rows):
            log.info("watch %s: no longer in the store", root)
            self.watcher.unwatch(root)
            self._cancel_watch_jobs(root)

    def _socket_is_ours(self) -> bool:
        try:
            return os.stat(self.files.socket).st_ino == self.socket_inode
        except OSError:
            return False

    def _idle_expired(self) -> bool:
        if self.idle_timeout <= 0:
            return False
        with self.clients_lock:
            busy = self.clients > 0
        with self.waiting_lock:
            busy = busy or bool(self.waiting) or self.running is not None
        if busy or (self.watcher is not None and self.watcher.roots):
            self.last_activity = time.monotonic()  # watching folders is work: never idle then
            return False
        return time.monotonic() - self.last_activity > self.idle_timeout

    def _shutdown(self) -> None:
        log.info("stopping")
        try:
            self.sock.close()
        except OSError:
            pass
        if self._socket_is_ours():
            self.files.socket.unlink(missing_ok=True)
        with self.waiting_lock:
            waiting, self.waiting = self.waiting, []
            running = self.running
        for job in waiting:
            job.cancel("shutdown")
            job.outbox.put({"type": "error", "error": _stopped_error()})
        if running is not None:
            running.cancel("shutdown")
        self.queue.put(None)
        deadline = time.monotonic() + SHUTDOWN_WAIT_S
        while self.running is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        abandoned = self.running
        if abandoned is not None and abandoned.journaled:
            self._drop_journal(abandoned)
        if self.watcher is not None:
            self.watcher.stop()
        deadline = time.monotonic() + 2  # let connection threads deliver their last messages
        while self.clients and time.monotonic() < deadline:
            time.sleep(0.05)
        if (runtime.read_pid_file(self.files) or {}).get("pid") == os.getpid():
            self.files.pid.unlink(missing_ok=True)
        log.info("stopped")

    def _drop_journal(self, job: Job) -> None:
        """The pending_ingests rows of an ingest the daemon abandons as it stops: the user stopped
        it, so nothing resumes it (its unfinished file is rolled back when the process exits)."""
        records = list(dict(job.journaled).items())  # the worker may still be removing some
        log.info("%s %s did not stop in %.0fs; dropping its %d pending file(s)", job.label, job.id,
                 SHUTDOWN_WAIT_S, len(records))
        try:
            store = Store()
            store.wait_for_writers(5.0)  # the job may hold the write lock
            for _path, record_id in records:
                store.finish_pending_ingest(record_id)
        except Exception as exc:  # noqa: BLE001  stopping goes on: the rows are resumed at the next start
            log.warning("could not drop the pending files of %s %s: %s", job.label, job.id, exc)

    # connections
    def _refuse(self, conn: socket.socket) -> None:
        """One error reply to a connection over the cap, then close it (on the accept thread: a
        fresh socket's send buffer is empty, so the short reply never blocks)."""
        log.warning("refused a connection: %d connections open (the most served at once)", self.max_clients)
        try:
            conn.settimeout(1.0)
            _send(conn, _error_message(None, {
                "type": "DaemonError",
                "message": f"the evsel daemon has too many connections open ({self.max_clients})",
                "hint": "close idle clients, then run the command again" + (
                    f" (a connection idle for {self.client_idle_s:g}s is closed)" if self.client_idle_s > 0 else "")}))
        except OSError:
            pass
        finally:
            conn.close()

    def _serve(self, conn: socket.socket) -> None:
        # a client silent this long between requests holds a thread and a descriptor for nothing
        conn.settimeout(self.client_idle_s if self.client_idle_s > 0 else None)
        reader = LineReader(conn)
        try:
            while True:
                message = reader.read()
                if message is None:
                    break
                if message.get("type") == "cancel":
                    continue  # nothing of this connection's is running
                if message.get("v") != PROTOCOL_VERSION:
                    _send(conn, {"v": PROTOCOL_VERSION, "id": message.get("id"), "type": "error", "error": {
                        "type": "ProtocolMismatch",
                        "message": f"the daemon speaks protocol {PROTOCOL_VERSION}, the client {message.get('v')}",
                        "hint": "restart the daemon: evsel daemon stop"}})
                    break
                try:
                    self._handle(conn, reader, message)
                except (OSError, ProtocolError):
                    raise
                except Exception as exc:  # noqa: BLE001  a bug here: the client still gets one error reply
                    log.error("client request failed:\n%s", traceback.format_exc())
                    _send(conn, _error_message(message.get("id"), self._internal_error(exc)))
                    break
        except socket.timeout:
            log.info("client connection closed: idle for %gs", self.client_idle_s)
        except ProtocolError as exc:  # not JSON, not an object, too large: say so, then close
            log.info("client connection closed: %s", exc)
            try:
                _send(conn, _error_message(None, {"type": "ProtocolError", "message": f"bad message: {exc}",
                                                  "hint": "messages are JSON objects, one per line; see "
                                                          "daemon/PROTOCOL.md"}))
            except OSError:
                pass
        except OSError as exc:
            log.info("client connection closed: %s", exc)
        except Exception:  # noqa: BLE001  a bug here ends one connection, never the daemon
            log.error("client connection failed:\n%s", traceback.format_exc())
        finally:
            try:
                conn.close()
            except OSError:
                pass
            with self.clients_lock:
                self.clients -= 1
                self.last_activity = time.monotonic()

    def _handle(self, conn: socket.socket, reader: LineReader, message: dict) -> None:
        request_id = message.get("id") or uuid.uuid4().hex[:12]
        method = message.get("method")
        params = message.get("params") or {}
        self.counts["requests"] += 1
        if not isinstance(method, str) or not isinstance(params, dict):
            _send(conn, _error_message(request_id, {"type": "ProtocolError", "message": "a request needs a method "
                                                    "name and a params object", "hint": "see daemon/PROTOCOL.md"}))
            return
        for name in ("settings", "client"):
            if not isinstance(message.get(name), (dict, type(None))):
                self.counts["errors"] += 1
                _send(conn, _error_message(request_id, {
                    "type": "ProtocolError", "message": f"bad request: {name} must be an object, "
                    f"not {json_type(message[name])}", "hint": "see daemon/PROTOCOL.md"}))
                return
        if method in REQUESTS:
            error = check_params(method, params)
            if error is not None:
                self.counts["errors"] += 1
                _send(conn, _error_message(request_id, error))
                return
        if method in FAST_METHODS:
            started = time.perf_counter()
            try:
                result = self._fast(method, params, message)
                _send(conn, {"v": PROTOCOL_VERSION, "id": request_id, "type": "result", "result": result,
                             "meta": {"queue_s": 0.0, "run_s": round(time.perf_counter() - started, 4)}})
            except EvselError as exc:
                self.counts["errors"] += 1
                _send(conn, _error_message(request_id, exc.to_dict()))
            except Exception as exc:  # noqa: BLE001
                self.counts["errors"] += 1
                log.error("%s failed:\n%s", method, traceback.format_exc())
                _send(conn, _error_message(request_id, self._internal_error(exc)))
            return
        error = self._check_engine_method(method, params)
        if error is not None:
            self.counts["errors"] += 1
            _send(conn, _error_message(request_id, error))
            return
        try:
            settings = Settings.from_dict(message.get("settings"))
        except (EvselError, TypeError, ValueError) as exc:
            self.counts["errors"] += 1
            # an EvselError's str() carries its hint already: the message alone, the hint once
            text = exc.message if isinstance(exc, EvselError) else str(exc)
            _send(conn, _error_message(request_id, {"type": "ProtocolError", "message": f"bad settings: {text}",
                                                    "hint": "a client of another evsel version? run: evsel daemon stop"}))
            return
        job = Job(method, params, settings, client_pid=(message.get("client") or {}).get("pid"))
        job.id = request_id
        if self._light(job):
            # nothing but background work ahead of it: run now, beside the model worker (a request
            # that was waiting keeps its turn, so requests still run in order of arrival)
            threading.Thread(target=self._run_light, args=(job,), name="evsel-light", daemon=True).start()
            position = 0
        else:
            position = self._enqueue(job)
        _send(conn, {"v": PROTOCOL_VERSION, "id": request_id, "type": "accepted", "queue_position": position})
        self._stream(conn, reader, job)

    def _stream(self, conn: socket.socket, reader: LineReader, job: Job) -> None:
        """Relay the job's messages to the client; its EOF or `cancel` cancels the job."""
        # a selector, not select.select: that refuses descriptors >= 1024 (FD_SETSIZE)
        with selectors.DefaultSelector() as selector:
            selector.register(conn, selectors.EVENT_READ)
            self._relay(conn, reader, job, selector)

    def _relay(self, conn: socket.socket, reader: LineReader, job: Job, selector: selectors.BaseSelector) -> None:
        while True:
            try:
                out = job.outbox.get(timeout=0.1)
            except queue.Empty:
                out = None
            if out is not None:
                try:
                    _send(conn, {"v": PROTOCOL_VERSION, "id": job.id, **out})
                except OSError:
                    job.cancel()
                    return
                if out["type"] in ("result", "error"):
                    return
            readable = reader.pending() or bool(selector.select(0))
            if readable:
                try:
                    message = reader.read()
                except (OSError, ProtocolError):
                    message = None
                if message is None or message.get("type") == "cancel":
                    log.info("%s %s: cancelled by the client", job.method, job.id)
                    job.cancel()
                    with self.waiting_lock:
                        if job in self.waiting:
                            self.waiting.remove(job)  # the worker drops it when it comes up
                    raise OSError("client went away")  # ends this connection

    # fast requests
    def _fast(self, method: str, params: dict, message: dict):
        if method == "hello":
            return {"evsel_version": __version__, "build": self.build, "protocol": PROTOCOL_VERSION,
                    "pid": os.getpid(), "home": str(self.files.home), "started_at": self.started_at}
        if method == "status":
            return self.status()
        if method == "shutdown":
            log.info("stop requested by pid %s", (message.get("client") or {}).get("pid"))
            self.stop_event.set()
            return {"stopping": True, "pid": os.getpid()}
        with self.fast_lock:
            if method == "watch_add":
                return self._watch_add(params.get("path", ""), params.get("collection") or DEFAULT_COLLECTION)
            if method == "watch_remove":
                return self._watch_remove(params.get("path", ""))
            if method == "watch_list":
                return self._watch_list()
            fn = getattr(self.fast_engine, method)
            bind_params(fn, params)
            result = fn(**params)
            if method == "docs_rm":
                self.scope_data.invalidate({d["id"] for d in result})
                self._drop_background_of({d["id"] for d in result})
            return result

    def _watch_add(self, path: str, collection: str) -> dict:
        """The engine's watch_add, then the folder is observed and synced at once."""
        if not os.path.isabs(path):
            raise InputError("the daemon takes absolute paths only", "a client of another evsel version? "
                             "run: evsel daemon stop", path=path)
        result = self.fast_engine.watch_add(path, collection)
        root = result["path"]
        self.watcher.watch(root, collection)
        try:
            result["files"] = len(collect_files(Path(root)))
        except InputError:
            result["files"] = 0
        log.info("watch %s (collection %s): %s", root, collection, "added" if result["added"] else "updated")
        return result

    def _watch_remove(self, path: str) -> dict:
        """The engine's watch_remove, then the folder is no longer observed and its syncs are
        cancelled. A folder observed without its row (removed by another process) is removed too."""
        root = paths.watched_path(path)
        try:
            result, not_watched = self.fast_engine.watch_remove(path), None
        except NotFoundError as exc:
            result, not_watched = {"path": root, "removed": True}, exc
        stopped = self.watcher.unwatch(root)
        self._cancel_watch_jobs(root)
        if not_watched is not None and not stopped:
            raise not_watched
        log.info("watch %s: removed", root)
        return result

    def _watch_list(self, store: Store | None = None) -> list[dict]:
        live = self.watcher.describe()
        rows = []
        for row in (store or self.fast_store).watches():
            rows.append({**row, **live.get(row["path"], {"observing": False})})
        return rows

    def status(self) -> dict:
        with self.waiting_lock:
            waiting = [{"method": j.label, "waiting_s": round(time.perf_counter() - j.enqueued, 2)}
                       for j in self.waiting if not j.background]
            background = [{"method": j.label, "running": j is self.running, "progress": j.last_event}
                          for j in ([self.running] if self.running is not None else []) + self.waiting
                          if j.background and not j.cancelled.is_set()]
            running = self.running
        with self.status_lock:
            docs = self.status_store.totals()
            watches = self._watch_list(self.status_store) if self.watcher is not None else []
        with self.engines_lock:
            engines = list(self.engines.values())
        backbones = []
        for engine in engines:
            backbone = engine._backbone
            if backbone is None:
                continue
            entry = {"name": backbone.name, "loaded": backbone.loaded, "model_arg": engine.model_arg,
                     "requested_device": engine.device}
            if backbone._plan is not None:
                entry.update(device=backbone._plan.device, dtype=backbone._plan.dtype)
            if backbone.loaded:
                preloaded = engine is self.preload_engine and self.preload_s is not None
                entry["load_s"] = round(self.preload_s if preloaded else backbone.load_seconds, 2)
            backbones.append(entry)
        with self.clients_lock:
            clients = self.clients
        return {
            "running": True,
            "pid": os.getpid(),
            "version": __version__,
            "build": self.build,
            "protocol": PROTOCOL_VERSION,
            "home": str(self.files.home),
            "socket": str(self.files.socket),
            "log": str(self.files.log),
            "started_at": self.started_at,
            "uptime_s": round(time.time() - self.started_at, 1),
            "idle_timeout_s": self.idle_timeout,
            "preload": self.preload_state,
            "backbones": backbones,
            "memory_mb": _rss_mb(),
            "documents": docs[0],
            "chunks": docs[1],
            "cache": self.scope_data.stats(),
            "queue": {
                "running": None if running is None else {
                    "method": running.label, "id": running.id,
                    "running_s": round(time.perf_counter() - (running.started or time.perf_counter()), 2),
                    "progress": running.last_event,
                },
                "waiting": waiting,
                "background": background,
            },
            "clients": clients,
            "requests": dict(self.counts),
            "recent": list(self.recent)[-10:],
            "watches": watches,
            "resumed": self.resumed,
            # a home looser than 0700 or a store/log file looser than 0600 (made by an older evsel or by hand)
            "home_mode_warning": paths.permission_warning(self.files.home),
        }

    # engine requests
    def _light(self, job: Job) -> bool:
        """Does the job need no model, with no request ahead of it (background work aside)?"""
        params = job.params
        if job.method != "ask" or params.get("evidence_only") is not True or params.get("rerank") \
                or params.get("memory"):
            return False
        try:
            select = resolve_select(params.get("select") or DEFAULT_SELECT, job.settings)
        except EvselError:  # a missing model: the worker reports it
            return False
        if needs_model(select):
            return False
        with self.waiting_lock:
            return not any(not j.background for j in self.waiting) and (
                self.running is None or self.running.background)

    def _run_light(self, job: Job) -> None:
        with self.light_lock:
            job.started = time.perf_counter()
            status = "ok"
            try:
                engine = DaemonEngine(job.settings, self.light_store, self.scope_data)
                params = dict(job.params, on_event=lambda event: job.outbox.put({"type": "event", "event": event}))
                job.outbox.put({"type": "result", "result": engine.ask(**params), "meta": self._meta(job)})
            except Exception as exc:  # noqa: BLE001  a bug in one request must not take the daemon down
                status = self._reply_failure(job, exc)
            self.last_activity = time.monotonic()
            self._record(job, status)

    def _reply_failure(self, job: Job, exc: Exception) -> str:
        """Send the job's client the error `exc` stands for (an EvselError as it is, a bug with its
        traceback logged); returns the status to record."""
        self.counts["errors"] += 1
        if isinstance(exc, EvselError):
            job.outbox.put({"type": "error", "error": exc.to_dict(), "meta": self._meta(job)})
            return f"error: {exc.line()}"
        log.error("%s %s failed:\n%s", job.label, job.id, traceback.format_exc())
        job.outbox.put({"type": "error", "error": self._internal_error(exc), "meta": self._meta(job)})
        return f"error: {user_message(exc)}"

    def _check_engine_method(self, method: str, params: dict) -> dict | None:
        return check_params(method, params)

    def _enqueue(self, job: Job) -> int:
        with self.waiting_lock:
            position = len(self.waiting) + (1 if self.running is not None else 0)
            self.waiting.append(job)
        self.queue.put(job)
        return position

    def _engine_for(self, settings: Settings) -> Engine:
        """The resident engine for the settings' model and device, set to the request's settings
        (jobs run one at a time, so the worker's engine serves one request at a time)."""
        model = settings.model
        if model and not Path(model).exists():
            # not kept: the engine's own check reports the missing path
            return DaemonEngine(settings, self.worker_store, self.scope_data)
        key = (str(Path(model).resolve()) if model else None, settings.device)
        with self.engines_lock:
            engine = self.engines.pop(key, None)
            if engine is None:
                engine = DaemonEngine(settings, self.worker_store, self.scope_data)
            engine.settings = settings
            self.engines[key] = engine  # most recently used last
            while len(self.engines) > MAX_ENGINES:
                evicted = next(iter(self.engines))
                log.info("unloading backbone %s (%s)", *evicted)
                del self.engines[evicted]
        return engine

    def _worker(self) -> None:
        self.setup_done.wait()
        while True:
            job = self.queue.get()
            if job is None:
                return
            with self.waiting_lock:
                if job in self.waiting:
                    self.waiting.remove(job)
                if job.cancelled.is_set():
                    self._record(job, "cancelled")
                    continue
                self.running = job
            job.started = time.perf_counter()
            self.last_activity = time.monotonic()
            status = "ok"
            try:
                result = self._run(job)
                job.outbox.put({"type": "result", "result": result, "meta": self._meta(job)})
            except YieldToRequests:
                status = "yielded"
                with self.waiting_lock:
                    self.running = None
                self._enqueue(job)  # after the requests that were waiting
                self._record(job, status)
                continue
            except RequestCancelled as exc:
                status = "cancelled"
                self.counts["cancelled"] += 1
                if job.cancel_reason == "shutdown":
                    job.outbox.put({"type": "error", "error": _stopped_error()})
                stored = getattr(exc, "stored_files", None)  # an ingest's files finished before the cancel
                log.info("%s %s: cancelled%s", job.label, job.id, "" if stored is None else
                         f"; stored before it: {', '.join(stored)}" if stored else "; nothing stored")
            except Exception as exc:  # noqa: BLE001  a bug in one request must not take the daemon down
                status = self._reply_failure(job, exc)
            finally:
                with self.waiting_lock:
                    self.running = None
                self.last_activity = time.monotonic()
            self._record(job, status)

    def _meta(self, job: Job) -> dict:
        now = time.perf_counter()
        return {"queue_s": round((job.started or now) - job.enqueued, 4),
                "run_s": round(now - (job.started or now), 4), "received_at": job.received_at}

    def _record(self, job: Job, status: str) -> None:
        entry = {"id": job.id, "method": job.label, "client_pid": job.client_pid, "received_at": job.received_at,
                 **{k: v for k, v in self._meta(job).items() if k != "received_at"}, "status": status}
        self.recent.append(entry)
        level = logging.INFO if status in ("ok", "cancelled", "yielded") else logging.WARNING
        log.log(level, "%s %s (client %s): %s, queued %.2fs, ran %.2fs", job.label, job.id, job.client_pid, status,
                entry["queue_s"], entry["run_s"])

    def _emitter(self, job: Job):
        def emit(event: dict) -> None:
            if job.cancelled.is_set():
                raise RequestCancelled(job.cancel_reason)
            job.last_event = event
            if job.background:
                if self._requests_waiting():
                    raise YieldToRequests()
                return
            job.outbox.put({"type": "event", "event": event})

        return emit

    def _requests_waiting(self) -> bool:
        with self.waiting_lock:
            return any(not j.background for j in self.waiting)

    def _run(self, job: Job):
        emit = self._emitter(job)
        engine = self._engine_for(job.settings)
        if job.task is not None:
            return job.task(engine, emit)
        fn = getattr(engine, job.method)
        params = dict(job.params)
        if "on_event" in inspect.signature(fn).parameters:
            params["on_event"] = emit
        if job.method == "ingest":
            # stored now (each file recorded until done), states and summaries in the background:
            # the client gets its answer in seconds
            outcome = engine.ingest_files(params["targets"], IngestOptions.from_params(params), emit, defer=True,
                                          journal=True, journaled=job.journaled)
            self._queue_deferred(outcome.followups)
            result = outcome.files
        else:
            result = fn(**params)
        if job.method in ("ingest", "docs_rm"):
            self._invalidate(result)
        return result

    # per-chunk states and summaries, computed in the background after an ingest (and resumed after a crash)
    def _queue_deferred(self, followups: list[PendingEncode]) -> None:
        """A background job for each piece of work an ingest deferred (the store records it until done)."""
        for work in followups:
            def task(engine, emit, work=work):
                outcome = engine.run_deferred(work, emit, batch=BACKGROUND_BATCH, slice_s=BACKGROUND_SLICE_S)
                log.info("states of documents %s: %d chunks encoded, %s summaries written", work.doc_ids,
                         outcome["encoded"], outcome.get("summaries", 0))
                return outcome

            label = f"{'encoding' if work.states else 'writing'} {work.what} of " \
                    f"document{'s' if len(work.doc_ids) > 1 else ''} {_id_list(work.doc_ids)}"
            job = Job("encode_states", {}, work.settings, task=task, label=label, background=True)
            job.work = work
            self._enqueue(job)

    def _drop_background_of(self, removed: set[int]) -> None:
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
                self.fast_store.finish_pending_encode(job.work.id)
            log.info("%s: dropped, its documents were removed", job.label)

    def _resume_encodes(self) -> None:
        for work in self.worker_store.pending_encodes():
            log.info("resuming the %s of documents %s", work.what, work.doc_ids)
            self.resumed.append(f"{work.what} of documents {_id_list(work.doc_ids)}")
            self._queue_deferred([work])

    def _invalidate(self, result) -> None:
        changed = set()
        for item in result if isinstance(result, list) else []:
            if isinstance(item, dict):
                if item.get("status") == "ingested":
                    changed.update(item.get("doc_ids") or [])
                elif "id" in item and "status" not in item:
                    changed.add(item["id"])
        if changed:
            self.scope_data.invalidate(changed)

    # crash safety for ingest
    def _resume_pending(self) -> None:
        """Queue the files a crash left recorded in the store, each with the options and settings
        of the request it belonged to (`evsel.engine.resume_arguments`)."""
        for pending in self.worker_store.pending_ingests():
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
                self._invalidate(outcome.files)
                for r in outcome.files:
                    why = f" ({from_dict(r['error']).line()})" if r.get("error") else ""
                    log.info("resumed ingest of %s: %s%s", r["path"], r["status"], why)
                self._queue_deferred(outcome.followups)
                return outcome.files

            self._enqueue(Job("ingest", params, pending.settings or self.settings, task=task, label="resume ingest"))

    # watch folders
    def _submit_watch(self, root: str, collection: str, paths: list[str] | None) -> None:
        def task(engine, emit):  # nobody listens to emit; it still carries cancellation
            if root not in self.watcher.roots:  # removed while this sync was on its way to the queue
                raise RequestCancelled("watch removed")
            try:
                if paths is None:
                    outcome = watcher.full_sync(engine, root, collection, emit)
                else:
                    outcome = watcher.sync_paths(engine, root, collection, paths, emit)
            except EvselError as exc:
                self.watcher.record_error(root, exc.line())
                raise
            followups = outcome.pop("followups")
            self.watcher.record(root, outcome)
            self._queue_deferred(followups)
            self._invalidate(outcome["files"])
            self.scope_data.invalidate({d["id"] for d in outcome["removed"]})
            return outcome

        label = f"watch sync {root}" if paths is None else f"watch {len(paths)} file(s) in {root}"
        job = Job("watch", {}, self.settings, task=task, label=label)
        job.watch_root = root
        self._enqueue(job)

    def _cancel_watch_jobs(self, root: str) -> int:
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

    def _internal_error(self, exc: BaseException) -> dict:
        return {"type": "EvselError", "message": user_message(exc).split("; rerun with")[0],
                "hint": f"the daemon's log has the traceback: {self.files.log}"}


def _send(conn: socket.socket, message: dict) -> None:
    try:
        data = encode(message)
    except (TypeError, ValueError) as exc:  # a result that is not plain data: say so instead
        log.error("cannot send %s as JSON: %s", message.get("type"), exc)
        data = encode({"v": PROTOCOL_VERSION, "id": message.get("id"), "type": "error", "error": {
            "type": "EvselError", "message": f"the daemon cannot send this result as JSON ({exc})",
            "hint": "run the command with --no-daemon"}})
    conn.sendall(data)


def _error_message(request_id: str, error: dict) -> dict:
    return {"v": PROTOCOL_VERSION, "id": request_id, "type": "error", "error": error}


def _stopped_error() -> dict:
    return {"type": "DaemonError", "message": "the evsel daemon stopped before this request finished",
            "hint": "run the command again"}


def _id_list(ids: list[int]) -> str:
    shown = ", ".join(map(str, ids[:5]))
    return shown + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")


def _env_number(name: str, default: float) -> float:
    """A number from the daemon's environment (limits the tests lower), else the default."""
    try:
        return float(os.environ.get(name) or default)
    except ValueError:
        log.warning("%s=%r is not a number; using %g", name, os.environ.get(name), default)
        return default


def _fit_clients_to_fd_limit(wanted: int) -> int:
    """Raise the soft descriptor limit toward the hard one so `wanted` connections fit beside the
    daemon's own files; returns how many connections fit."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        need = wanted + FD_RESERVE
        if soft != resource.RLIM_INFINITY and soft < need:
            target = need if hard == resource.RLIM_INFINITY else min(need, hard)
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    except (ImportError, ValueError, OSError):
        return wanted
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft - FD_RESERVE))


def _rss_mb() -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    try:
        import resource

        return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    except (ImportError, OSError):
        return None
