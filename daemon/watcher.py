"""Watch folders: the daemon ingests new and changed files and removes deleted ones.

File system events (watchdog) are debounced per path: a path is synced only once it has been quiet
for `debounce` seconds, so an editor's save storm (write temp, rename, touch, chmod) is one ingest.
Syncs run as jobs on the daemon's model queue, through `Engine.sync_folder`, which ingests and
removes as the CLI does (chunk states deferred to the background, as a daemon ingest's are).
The watch list lives in the store (`watches` table) and survives restarts; every start re-syncs
each folder, catching what changed while the daemon was down.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from pathlib import Path
from typing import Callable

from watchdog.events import FileSystemEventHandler

from evsel.errors import EvselError, from_dict
from evsel.ingest.parsers import SUPPORTED_SUFFIXES

log = logging.getLogger("evsel.daemon")

MAX_FAILURES_SHOWN = 20
ROOT_CHECK_S = 1.0  # how often each watched folder is checked for being deleted or recreated


def wanted(root: str, path: str) -> bool:
    """Files a watch ingests: the same rule as ingesting the folder (supported suffix, not hidden)."""
    try:
        rel = Path(path).relative_to(root)
    except ValueError:
        return False
    return Path(path).suffix.lower() in SUPPORTED_SUFFIXES and not any(p.startswith(".") for p in rel.parts)


class Watcher:
    """watchdog observers for the watched folders, and the debouncer that turns events into syncs."""

    def __init__(self, submit: Callable[[str, str, list[str] | None], None], debounce: float = 1.0):
        # submit(root, collection, paths): paths None means a full sync of the folder
        self.submit = submit
        self.debounce = debounce
        self.lock = threading.Lock()
        self.roots: dict[str, dict] = {}  # root -> {collection, watch (observer handle)}
        self.pending: dict[tuple[str, str | None], float] = {}  # (root, path or None=rescan) -> last event
        self.failures: dict[str, dict[str, dict]] = {}  # root -> path -> {error, at}
        self.last_sync: dict[str, float] = {}
        self.roots_checked = 0.0
        self.observer = None
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="evsel-watch-debounce", daemon=True)

    def start(self) -> None:
        from watchdog.observers import Observer

        self.observer = Observer()
        self.observer.daemon = True
        self.observer.start()
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        if self.observer is not None:
            self.observer.stop()

    def watch(self, root: str, collection: str) -> None:
        """Start observing `root` and queue a full sync of it."""
        with self.lock:
            current = self.roots.get(root)
            if current is not None:
                if current["collection"] == collection:
                    return  # already watched as asked
                current["collection"] = collection
            else:
                entry = {"collection": collection, "watch": None, "error": None, "identity": _identity(root)}
                try:
                    entry["watch"] = self.observer.schedule(_Handler(self, root), root, recursive=True)
                except (OSError, EvselError) as exc:
                    entry["error"] = f"cannot watch the folder: {exc}"
                    log.warning("watch %s: %s", root, entry["error"])
                self.roots[root] = entry
        self.submit(root, collection, None)

    def check_roots(self) -> None:
        """Follow folders deleted and created again: inotify's watch dies with the folder it
        watched, so a folder that is gone stops being observed (and says so), and one that is
        back (or replaced by another folder of the same name) is observed again and synced.
        Observer calls are made outside `self.lock`: the observer's thread takes it in `event`."""
        with self.lock:
            entries = list(self.roots.items())
        for root, entry in entries:
            identity = _identity(root)
            if identity == entry["identity"] and (identity is None or entry["watch"] is not None):
                continue
            with self.lock:
                old, entry["watch"], entry["identity"] = entry["watch"], None, identity
                if identity is None:
                    entry["error"] = "the folder is gone; it is watched again when it is back"
            self._unschedule(old)
            if identity is None:
                log.warning("watch %s: %s", root, entry["error"])
                continue
            try:
                watch = self.observer.schedule(_Handler(self, root), root, recursive=True)
            except (OSError, EvselError) as exc:
                with self.lock:
                    entry["identity"] = None  # tried again at the next check
                    entry["error"] = f"cannot watch the folder: {exc}"
                continue
            with self.lock:
                still_watched = self.roots.get(root) is entry
                if still_watched:
                    entry["watch"], entry["error"] = watch, None
                    self.failures.get(root, {}).pop(root, None)  # "the watched folder is gone"
                    collection = entry["collection"]
            if not still_watched:
                self._unschedule(watch)
                continue
            log.info("watch %s: the folder is there again: syncing it", root)
            self.submit(root, collection, None)

    def _unschedule(self, watch) -> None:
        if watch is not None:
            try:
                self.observer.unschedule(watch)
            except (KeyError, OSError):
                pass

    def unwatch(self, root: str) -> bool:
        with self.lock:
            entry = self.roots.pop(root, None)
            self.failures.pop(root, None)
            for key in [k for k in self.pending if k[0] == root]:
                del self.pending[key]
        if entry is None:
            return False
        self._unschedule(entry["watch"])
        return True

    def root_deleted(self, root: str) -> None:
        """The observer saw the folder itself deleted: its watch is dead even if a folder of the
        same name (and maybe inode number) is back before the next check."""
        with self.lock:
            if root in self.roots:
                self.roots[root]["identity"] = _DELETED

    def event(self, root: str, path: str | None) -> None:
        with self.lock:
            if root in self.roots:
                self.pending[(root, path)] = time.monotonic()

    def _loop(self) -> None:
        while not self.stopping.wait(min(0.2, self.debounce / 4 or 0.05)):
            now = time.monotonic()
            if now - self.roots_checked >= ROOT_CHECK_S:
                self.roots_checked = now
                try:
                    self.check_roots()
                except Exception:  # noqa: BLE001  the debouncer must keep running
                    log.exception("checking the watched folders failed")
            with self.lock:
                ready = [k for k, t in self.pending.items() if now - t >= self.debounce]
                for key in ready:
                    del self.pending[key]
                batches: dict[str, list[str] | None] = {}
                for root, path in ready:
                    if root not in self.roots:
                        continue
                    if path is None or batches.get(root, []) is None:
                        batches[root] = None  # a rescan covers every single path
                    else:
                        batches.setdefault(root, []).append(path)
                collections = {root: self.roots[root]["collection"] for root in batches}
            for root, paths in batches.items():
                self.submit(root, collections[root], sorted(set(paths)) if paths is not None else None)

    # results, for status and the log
    def record(self, root: str, outcome: dict) -> None:
        with self.lock:
            failures = self.failures.setdefault(root, {})
            self.last_sync[root] = time.time()
            for r in outcome.get("files", []):
                if r["status"] == "failed":
                    line = from_dict(r["error"]).line() if r.get("error") else "failed"
                    failures[r["path"]] = {"error": line, "at": time.time()}
                    log.warning("watch %s: %s", root, line)
                else:
                    failures.pop(r["path"], None)
                    if r["status"] == "ingested":
                        log.info("watch %s: ingested %s (%d chunks)", root, r["path"], r["chunks"])
            for d in outcome.get("removed", []):
                log.info("watch %s: removed %s (document %d)", root, d["path"], d["id"])
            for path in outcome.get("gone", []):
                failures.pop(path, None)
            if outcome.get("full"):  # a full sync saw every file: drop failures of files no longer there
                failures.pop(root, None)
                for path in [p for p in failures if not os.path.exists(p)]:
                    del failures[path]

    def record_error(self, root: str, error: str) -> None:
        with self.lock:
            self.failures.setdefault(root, {})[root] = {"error": error, "at": time.time()}
        log.warning("watch %s: %s", root, error)

    def describe(self) -> dict[str, dict]:
        with self.lock:
            out = {}
            for root, entry in self.roots.items():
                failures = sorted(self.failures.get(root, {}).items(), key=lambda kv: -kv[1]["at"])
                out[root] = {
                    "collection": entry["collection"],
                    "observing": entry["watch"] is not None,
                    "error": entry["error"],
                    "last_sync": self.last_sync.get(root),
                    "pending_events": sum(1 for k in self.pending if k[0] == root),
                    "failures": [{"path": p, **f} for p, f in failures[:MAX_FAILURES_SHOWN]],
                    "failed": len(failures),
                }
            return out


_DELETED = (-1, -1)  # an identity no folder has


def _identity(root: str) -> tuple[int, int] | None:
    """The folder's (device, inode), or None when it is not a folder now."""
    try:
        st = os.stat(root)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


class _Handler(FileSystemEventHandler):
    def __init__(self, watcher: Watcher, root: str):
        super().__init__()
        self.watcher = watcher
        self.root = root

    def on_any_event(self, event) -> None:
        kind = event.event_type
        if kind not in ("created", "modified", "deleted", "moved", "closed"):
            return  # opened, closed_no_write, attrib: the content did not change
        paths = [os.fsdecode(event.src_path)]
        if kind == "moved":
            paths.append(os.fsdecode(event.dest_path))
        if event.is_directory:
            if kind == "deleted" and paths[0].rstrip(os.sep) == self.root.rstrip(os.sep):
                self.watcher.root_deleted(self.root)
            if kind != "modified":  # a folder created, deleted or moved: its files sent no events
                self.watcher.event(self.root, None)
            return
        for path in paths:
            if wanted(self.root, path):
                self.watcher.event(self.root, path)
