"""The resident daemon: one process per EVSEL_HOME that keeps the backbone loaded. This module is
its server (the socket, connections, fast requests and status); daemon/scheduler.py runs the jobs.

Threads:
- main: accepts connections on the Unix socket, watches for idle time and stop signals;
- one per connection: reads requests; fast ones (status, docs, watch list) are answered right
  there, model ones become jobs and the thread streams the job's progress back to the client;
- the model worker (the scheduler's): runs jobs one at a time, in arrival order, on the engine (the
  same `Engine` methods the CLI runs in-process, so the results are the same);
- the watcher's observer and debouncer, and a preload thread that loads the backbone at start.

A client that disconnects or sends `cancel` cancels its job: a queued job is dropped, a running
one stops at its next progress event (the model finishes the step it is in). Nothing a request
does can stop the daemon: every failure is answered to its client and logged.
"""

from __future__ import annotations

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
from pathlib import Path

from evsel import __version__, paths
from evsel import settings as settings_module
from evsel.engine import Engine
from evsel.errors import EvselError, InputError, NotFoundError
from evsel.store.journal import Journal
from evsel.ingest.parsers import collect_files
from evsel.settings import Settings
from evsel.store.store import DEFAULT_COLLECTION, Store

from . import runtime, watcher
from .cache import ScopeDataCache
from .checks import check_params, json_type
from .protocol import CANCEL_WAIT_S, DAEMON_METHODS, FAST_METHODS, PROTOCOL_VERSION, LineReader, ProtocolError, encode
from .scheduler import Job, Scheduler, internal_error

log = logging.getLogger("evsel.daemon")


class PrivateLogHandler(logging.handlers.RotatingFileHandler):
    """daemon.log, opened (and reopened at each rotation) with `open_private`: never through a
    symlink planted in the home."""

    def _open(self):
        fd = runtime.open_private(Path(self.baseFilename), os.O_WRONLY | os.O_APPEND)
        return os.fdopen(fd, "a", encoding=self.encoding or "utf-8", errors=self.errors)


DEFAULT_IDLE_TIMEOUT = 1800.0  # seconds without clients, jobs or watches before the daemon exits
RECONCILE_S = 2.0  # how often the watch list is re-read from the store
FD_RESERVE = 64  # descriptors kept free of connections: the store, logs, the model's files, watches
LOG_BYTES = 2 << 20
LOG_BACKUPS = 3


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
        self.scheduler = Scheduler(self.settings, self.scope_data, self.files.log, activity=self._touch)
        self.counts = self.scheduler.counts  # requests, errors and cancels, counted here and by the jobs
        self.fast_lock = threading.Lock()
        self.status_lock = threading.Lock()
        self.clients = 0
        self.clients_lock = threading.Lock()
        self.max_clients, bad_max = settings_module.daemon_max_clients()
        self.client_idle_s, bad_idle = settings_module.daemon_client_idle()
        for warning in (bad_max, bad_idle):
            if warning:
                log.warning("%s", warning)
        self.last_activity = time.monotonic()
        self.stop_event = threading.Event()
        self.started_at = time.time()
        if not preload:  # else set once the preload has the tokenizer
            self.scheduler.preload_state = "off"
            self.scheduler.setup_done.set()
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
        model_cache = settings_module.model_cache()
        if model_cache is not None:
            os.environ["EVSEL_MODEL_CACHE"] = str(model_cache.resolve())
        os.chdir("/")
        self.scheduler.open_stores()
        self.fast_store = Store()  # docs requests and the watch list, under fast_lock
        self._remove_leftover_temps()
        self.status_store = Store()  # status only, so it never waits behind a slow docs request
        self.fast_engine = Engine(self.settings, store=self.fast_store)
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
        threading.Thread(target=self.scheduler.worker, name="evsel-model", daemon=True).start()
        if self.preload:
            threading.Thread(target=self.scheduler.preload, name="evsel-preload", daemon=True).start()
        self.scheduler.resume_ingests()
        self.scheduler.resume_encodes()
        self.watcher = watcher.Watcher(self.scheduler.submit_watch, self.debounce)
        self.scheduler.watcher = self.watcher
        self.watcher.start()
        for row in Journal(self.fast_store).watches():
            self.watcher.watch(row["path"], row["collection"])
        try:
            self._accept_loop()
        finally:
            self._shutdown()
        return 0

    def _remove_leftover_temps(self) -> None:
        """Temp files of stored KV and keys that a killed writer left (a kill -9 mid-write)."""
        from evsel.models.shared import caches

        try:
            gone = caches.remove_leftover_temps(caches.store_dir_of(self.fast_store))
        except (OSError, EvselError) as exc:
            log.warning("leftover temp files not removed: %s", exc)
            return
        if gone:
            log.info("removed %d temp file(s) a stopped writer left", gone)

    def _setup_logging(self) -> None:
        log.setLevel(logging.INFO)
        log.propagate = False
        for handler in list(log.handlers):
            log.removeHandler(handler)
        # opened 0600 with O_NOFOLLOW (at start and at each rotation): a symlink planted in the home is refused
        handler = PrivateLogHandler(self.files.log, maxBytes=LOG_BYTES, backupCount=LOG_BACKUPS)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.addHandler(handler)
        if self.foreground:
            stream = logging.StreamHandler()
            stream.setFormatter(logging.Formatter("evsel daemon: %(message)s"))
            log.addHandler(stream)

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
                rows = {r["path"]: r["collection"] for r in Journal(self.status_store).watches()}
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
            self.scheduler.cancel_watch_jobs(root)

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
        busy = busy or self.scheduler.busy()
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
        self.scheduler.stop()
        if self.watcher is not None:
            self.watcher.stop()
        deadline = time.monotonic() + 2  # let connection threads deliver their last messages
        while self.clients and time.monotonic() < deadline:
            time.sleep(0.05)
        if (runtime.read_pid_file(self.files) or {}).get("pid") == os.getpid():
            self.files.pid.unlink(missing_ok=True)
        log.info("stopped")

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
                    _send(conn, _error_message(message.get("id"), internal_error(exc, self.files.log)))
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
        build = (message.get("client") or {}).get("build")
        if build is not None and build != self.build and method not in DAEMON_METHODS:
            # a client of another build sends no hello: it learns here, before anything runs, and restarts us
            _send(conn, _error_message(request_id, {
                "type": "BuildMismatch", "message": f"the daemon runs evsel {self.build}, the client {build}",
                "hint": "the client restarts the daemon: run the command again"}))
            return
        if method not in DAEMON_METHODS:  # an engine request: checked here, once, from its declaration
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
                _send(conn, _error_message(request_id, internal_error(exc, self.files.log)))
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
        if self.scheduler.light(job):
            # nothing but background work ahead of it: run now, beside the model worker (a request
            # that was waiting keeps its turn, so requests still run in order of arrival)
            threading.Thread(target=self.scheduler.run_light, args=(job,), name="evsel-light", daemon=True).start()
            position = 0
        else:
            position = self.scheduler.enqueue(job)
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
                    self.scheduler.forget(job)
                    if message is not None:
                        self._answer_cancel(conn, job)
                    raise OSError("client went away")  # ends this connection

    @staticmethod
    def _answer_cancel(conn: socket.socket, job: Job) -> None:
        """Tell a client that cancelled what its request stored: nothing when it had not started,
        else what the job says as it stops (the model finishes the step it is in)."""
        out = {"type": "cancelled", "stored": [] if job.method == "ingest" else None}
        if job.started is not None:
            deadline = time.monotonic() + CANCEL_WAIT_S
            while time.monotonic() < deadline:
                try:
                    reply = job.outbox.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    return
                if reply["type"] in ("cancelled", "result", "error"):
                    out = reply
                    break
        try:
            _send(conn, {"v": PROTOCOL_VERSION, "id": job.id, **out})
        except OSError:
            pass

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
            if method != "docs_rm":
                return getattr(self.fast_engine, method)(**params)
            outcome = self.fast_engine.remove_documents(**params)
            changed = set(outcome["changed_document_ids"])
            self.scope_data.invalidate(changed)
            self.scheduler.drop_background_of(changed, self.fast_engine.journal)
            return outcome["removed"]

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
        self.scheduler.cancel_watch_jobs(root)
        if not_watched is not None and not stopped:
            raise not_watched
        log.info("watch %s: removed", root)
        return result

    def _watch_list(self, store: Store | None = None) -> list[dict]:
        live = self.watcher.describe()
        rows = []
        for row in Journal(store or self.fast_store).watches():
            rows.append({**row, **live.get(row["path"], {"observing": False})})
        return rows

    def status(self) -> dict:
        from evsel.models.qrranker import kv as qrranker_kv

        with self.status_lock:
            docs = self.status_store.totals()
            watches = self._watch_list(self.status_store) if self.watcher is not None else []
        backbones = []
        for engine in self.scheduler.resident_engines():
            backbone = engine.loaded_backbone
            if backbone is None:
                continue
            entry = {"name": backbone.name, "loaded": backbone.loaded, "model_arg": engine.model_arg,
                     "requested_device": engine.device}
            plan = backbone.chosen_plan
            if plan is not None:
                entry.update(device=plan.device, dtype=plan.dtype)
            if backbone.loaded:
                preloaded = engine is self.scheduler.preload_engine and self.scheduler.preload_s is not None
                entry["load_s"] = round(self.scheduler.preload_s if preloaded else backbone.load_seconds, 2)
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
            "preload": self.scheduler.preload_state,
            "backbones": backbones,
            "memory_mb": _rss_mb(),
            "documents": docs[0],
            "chunks": docs[1],
            "cache": self.scope_data.stats(),
            "queue": self.scheduler.queue_status(),
            "clients": clients,
            "requests": dict(self.counts),
            "recent": list(self.scheduler.recent)[-10:],
            "watches": watches,
            "resumed": self.scheduler.resumed,
            "disk_full": qrranker_kv.disk_full_notes(),  # stored KV that background work could not write
            # a home looser than 0700 or a store/log file looser than 0600 (made by an older evsel or by hand)
            "home_mode_warning": paths.permission_warning(self.files.home),
        }

    def _touch(self) -> None:
        """A job started or ended: the daemon is not idle."""
        self.last_activity = time.monotonic()


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
