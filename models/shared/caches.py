"""The models' caches: `LRUCache`, values in memory, least recently used first out, bounded by size
or count; `ArrayCache`, arrays by name in a folder (one .npy file each, written atomically), or in
an `LRUCache` where there is no folder; and the layout of the per-chunk files a method keeps
beside a store (BlockSearch's keys, QRRanker's block KV):
<store dir>/<method>/<backbone fingerprint>/<config digest>/<chunk content hash>.npy."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np
from evsel import paths
from evsel.errors import EvselError, ModelError

SHORT_WRITE = re.compile(r"\d+ requested and \d+ written")
NAME = re.compile(r"[0-9A-Za-z_-]{1,128}")  # what may name a file of an ArrayCache (a content hash)


class LRUCache:
    """Values by key in memory, least recently used first out once their total size (`size_of`
    of each, with `max_bytes`) or their count (`max_items`) is over its bound; a value larger
    than `max_bytes` is not kept. Safe to share between threads."""

    def __init__(self, max_bytes: int | None = None, max_items: int | None = None, size_of=None):
        self.max_bytes = max_bytes
        self.max_items = max_items
        self.size_of = size_of or (lambda _value: 0)
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key):
        """The value (now the most recently used), or None."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                self.misses += 1
                return None
            self.hits += 1
            self._items.move_to_end(key)
            return item[0]

    def put(self, key, value) -> None:
        """Keep `value` under `key`; a key already there keeps its value."""
        size = self.size_of(value)
        with self._lock:
            if key in self._items or (self.max_bytes is not None and size > self.max_bytes):
                return
            self._items[key] = (value, size)
            self.bytes += size
            while ((self.max_bytes is not None and self.bytes > self.max_bytes)
                   or (self.max_items is not None and len(self._items) > self.max_items)):
                _, (_, old) = self._items.popitem(last=False)
                self.bytes -= old

    def pop(self, key):
        """Drop `key`; returns its value, or None when it was not there."""
        with self._lock:
            item = self._items.pop(key, None)
            if item is None:
                return None
            self.bytes -= item[1]
            return item[0]

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.bytes = 0

    def __contains__(self, key) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)


def private_dirs(folder: Path, top: Path) -> None:
    """mkdir -p `folder`, every level made from `top` down exactly 0700 (whatever the umask), after
    the home's one check (evsel.paths.refuse_unsafe) has passed `top` and each level below it."""
    paths.private_folder(folder, top.parent)


def fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class ArrayCache:
    """Arrays by name (a content hash): one .npy file each in `folder` (files 0600, folders 0700),
    or with `folder` None in memory (least recently used out past `max_bytes`). A file is written
    to a temp sibling, fsynced and renamed, so a killed writer never leaves a file that reads as
    valid; a file that does not load whole with the expected shape and type is deleted and reported
    missing (the caller computes it again)."""

    def __init__(self, folder: str | Path | None = None, top: str | Path | None = None, max_bytes: int = 1 << 30):
        """`top`: the highest folder the cache may create (default: `folder` itself)."""
        self.folder = Path(folder) if folder is not None else None
        self.top = Path(top) if top is not None else self.folder
        if self.folder is not None:  # a planted folder (a link, another user's) is refused before any use
            paths.refuse_unsafe(self.folder, self.top.parent)
        self.reads = self.writes = self.rejected = 0
        self.memory = LRUCache(max_bytes, size_of=lambda array: array.nbytes)

    @property
    def on_disk(self) -> bool:
        return self.folder is not None

    def path(self, name: str) -> Path:
        if not NAME.fullmatch(name or ""):
            raise ModelError(f"{name!r} is not a content hash")
        return self.folder / f"{name}.npy"

    def get(self, name: str, shape: tuple | None = None, dtype=None) -> np.ndarray | None:
        """The stored array, or None when absent or not valid (then deleted)."""
        if self.folder is None:
            item = self.memory.get(name)
            if item is not None:
                self.reads += 1
            return None if item is None or not self.fits(item, shape, dtype) else item
        path = self.path(name)
        try:
            with self._open_own(path) as handle:
                array = np.load(handle, allow_pickle=False)
                whole = handle.read(1) == b""
        except FileNotFoundError:
            return None
        except (OSError, ValueError, EOFError):  # truncated or damaged: np.load checks header and size
            array, whole = None, False
        if array is None or not whole or not self.fits(array, shape, dtype):
            self.rejected += 1
            try:
                path.unlink()
            except OSError:
                pass
            return None
        self.reads += 1
        return array

    @staticmethod
    def _open_own(path: Path):
        """`path` opened for reading only when it is a regular file of ours: a link is not followed
        (ELOOP) and a FIFO does not block the open; anything else raises OSError (damaged)."""
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
                     | getattr(os, "O_CLOEXEC", 0))
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
                raise OSError(f"{path} is not a regular file of this user")
            return os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise

    @staticmethod
    def fits(array: np.ndarray, shape: tuple | None, dtype) -> bool:
        if shape is not None and tuple(array.shape) != tuple(shape):
            return False
        return dtype is None or array.dtype == np.dtype(dtype)

    def put_many(self, arrays: dict) -> None:
        """Store {name: array}; on disk each atomically, the folder synced once."""
        if self.folder is None:
            for name, array in arrays.items():
                if name not in self.memory:
                    self.memory.put(name, array)
                    self.writes += 1
            return
        private_dirs(self.folder, self.top)
        for name, array in arrays.items():
            self._write(self.path(name), np.ascontiguousarray(array))
            self.writes += 1
        fsync_dir(self.folder)

    def put(self, name: str, array: np.ndarray) -> None:
        self.put_many({name: array})

    def _write(self, path: Path, array: np.ndarray) -> None:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".tmp", dir=path.parent)
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "wb") as handle:
                try:
                    np.lib.format.write_array(handle, array, allow_pickle=False)
                except OSError as exc:
                    if exc.errno is None and SHORT_WRITE.search(str(exc)):
                        # numpy's short write ("716354 requested and 413568 written") has no errno:
                        # to a regular file it means the disk (or the quota) is full
                        raise OSError(errno.ENOSPC, f"No space left on device ({exc})", str(tmp)) from exc
                    raise
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def delete(self, names) -> int:
        """Drop the arrays of these names; returns how many were there."""
        gone = 0
        for name in names:
            if self.folder is None:
                gone += self.memory.pop(name) is not None
                continue
            try:
                self.path(name).unlink()
                gone += 1
            except FileNotFoundError:
                pass
        return gone

    def __len__(self) -> int:
        if self.folder is None:
            return len(self.memory)
        return sum(1 for _ in self.folder.glob("*.npy")) if self.folder.is_dir() else 0

    @property
    def bytes(self) -> int:
        if self.folder is None:
            return self.memory.bytes
        return sum(p.stat().st_size for p in self.folder.glob("*.npy")) if self.folder.is_dir() else 0


# ---------------------------------------------------------------------------------------------
# per-chunk files beside a store


def store_dir_of(store) -> Path | None:
    """The folder of a Store's database file (None for an in-memory one)."""
    if store is None:
        return None
    for _seq, name, file in store.db.conn.execute("pragma database_list").fetchall():
        if name == "main":
            return Path(file).parent if file else None
    return None


def config_digest(data: dict) -> str:
    """The folder name for what a method's cached files depend on besides the chunk text and the
    weights (`data`: JSON, its keys in any order)."""
    return hashlib.blake2b(json.dumps(data, sort_keys=True).encode(), digest_size=8).hexdigest()


def method_root(store_dir: str | Path, method: str) -> Path:
    return Path(store_dir) / method


def method_folders(store_dir: str | Path, method: str) -> list[Path]:
    """Every <fingerprint>/<digest> folder of a method's files beside a store."""
    root = method_root(store_dir, method)
    paths.refuse_unsafe(root, store_dir)
    if not root.is_dir():
        return []
    folders = [d for fp in root.iterdir() if fp.is_dir() and not fp.name.endswith(paths.ASIDE)
               for d in fp.iterdir() if d.is_dir()]
    for folder in folders:  # a planted level (a link, another user's) is refused, not followed
        paths.refuse_unsafe(folder, store_dir)
    return folders


def delete_chunk_files(store_dir: str | Path, method: str, hashes) -> int:
    """Delete the files of these content hashes under every backbone and config of a method
    (the store's delete path calls it with the hashes no chunk holds any more). Returns files deleted."""
    hashes = [h for h in hashes if NAME.fullmatch(h or "")]
    return sum(ArrayCache(folder).delete(hashes) for folder in method_folders(store_dir, method))


FILE_METHODS = ("qrranker", "blocksearch")  # the methods that keep files beside a store (KV, keys)


def remove_leftover_temps(store_dir: str | Path, methods=FILE_METHODS, older_than: float = 60.0) -> int:
    """Delete the temp files a killed writer left in the methods' folders beside a store (called
    as the daemon starts); only those older than `older_than` seconds, as another process may be
    writing one now. Returns the files deleted."""
    import time

    gone = 0
    now = time.time()
    for method in methods if store_dir is not None else ():
        try:
            folders = method_folders(store_dir, method)
        except EvselError:  # a planted level: refused where it is used, never walked here
            continue
        for folder in folders:
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue
            for entry in entries:
                if not (entry.name.startswith(".") and entry.name.endswith(".tmp")):
                    continue
                try:
                    if now - entry.stat(follow_symlinks=False).st_mtime > older_than:
                        os.unlink(entry.path)
                        gone += 1
                except OSError:
                    pass
    return gone
