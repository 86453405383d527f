"""Where the daemon keeps its files in EVSEL_HOME, and the checks around them.

One daemon per EVSEL_HOME. It holds an exclusive lock on `daemon.lock` for its whole life; the
kernel drops the lock when the process dies (even by kill -9), so "is a daemon alive?" is answered
by trying the lock, never by trusting a pid file or a socket file that a crash left behind.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

from evsel import __version__
from evsel.errors import EvselError

# AF_UNIX paths are limited to 108 bytes on Linux (104 on macOS); longer ones are reached by
# changing into the directory first (see `bind_unix` / `connect_unix`).
_SUN_PATH_MAX = 100


class DaemonError(EvselError):
    """The daemon cannot be started, reached or trusted."""


@dataclass(frozen=True)
class DaemonFiles:
    home: Path

    @property
    def socket(self) -> Path:
        return self.home / "daemon.sock"

    @property
    def pid(self) -> Path:
        return self.home / "daemon.pid"

    @property
    def lock(self) -> Path:
        return self.home / "daemon.lock"

    @property
    def log(self) -> Path:
        return self.home / "daemon.log"

    @property
    def err(self) -> Path:
        """The detached daemon's stderr: where a start that fails says why."""
        return self.home / "daemon.err"


def files() -> DaemonFiles:
    from evsel.paths import evsel_home

    return DaemonFiles(evsel_home())


def build_id() -> str:
    """The evsel version plus a digest of the installed source files' sizes and mtimes.

    A client and a daemon with different build ids do not talk: the client restarts the daemon,
    so an upgrade (or an edited checkout) never answers with old code. EVSEL_DAEMON_BUILD pins it
    (tests use it so that edits made while they run do not restart their daemons).
    """
    import evsel
    from evsel import settings

    tag = settings.daemon_build_tag()
    if tag:
        return f"{__version__}+{tag}"

    roots = [Path(evsel.__file__).parent, Path(__file__).parent, Path(__file__).parent.parent / "models"]
    digest = hashlib.sha1()
    for root in roots:
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*.py")):
            try:
                info = path.stat()
            except OSError:
                continue
            digest.update(f"{path}:{info.st_size}:{info.st_mtime_ns}\n".encode())
    return f"{__version__}+{digest.hexdigest()[:12]}"


def check_home_private(home: Path) -> None:
    """Refuse a home that other users could write to: they could replace the socket or the store."""
    info = home.stat()
    if info.st_uid != os.getuid():
        raise DaemonError(
            f"EVSEL_HOME {home} belongs to another user (uid {info.st_uid})",
            "point EVSEL_HOME at a folder you own, or use --no-daemon",
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise DaemonError(
            f"EVSEL_HOME {home} is writable by other users, so the daemon will not start there",
            f"run: chmod go-w {home}   (or use --no-daemon)",
        )


class HomeLock:
    """The exclusive lock that makes a process the daemon of its home."""

    def __init__(self, path: Path):
        self.path = path
        self.fd: int | None = None

    def acquire(self) -> bool:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self.fd = fd
        return True

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def daemon_alive(daemon_files: DaemonFiles) -> bool:
    """True when a process holds the home's daemon lock (alive, perhaps still starting)."""
    if not daemon_files.lock.exists():
        return False
    lock = HomeLock(daemon_files.lock)
    if lock.acquire():
        lock.release()
        return False
    return True


def clean_stale(daemon_files: DaemonFiles) -> list[str]:
    """Remove a socket and pid file left by a daemon that died without cleaning up.

    Only when nobody holds the lock: then no live daemon owns these files. Returns what was removed.
    """
    if daemon_alive(daemon_files):
        return []
    removed = []
    for path in (daemon_files.socket, daemon_files.pid):
        try:
            path.unlink()
            removed.append(path.name)
        except FileNotFoundError:
            pass
    return removed


def read_pid_file(daemon_files: DaemonFiles) -> dict | None:
    try:
        return json.loads(daemon_files.pid.read_text())
    except (OSError, ValueError):
        return None


def write_pid_file(daemon_files: DaemonFiles, data: dict) -> None:
    tmp = daemon_files.pid.with_name(f"daemon.pid.tmp{os.getpid()}")
    tmp.write_text(json.dumps(data))
    os.chmod(tmp, 0o600)
    tmp.replace(daemon_files.pid)


def _short_path(path: Path):
    """(directory to change into, name to use) when the socket path is too long for AF_UNIX."""
    if len(os.fsencode(str(path))) <= _SUN_PATH_MAX:
        return None, str(path)
    return str(path.parent), path.name


def bind_unix(path: Path) -> socket.socket:
    """A listening socket at `path`, mode 0600 from the moment it exists (umask), then checked."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    directory, name = _short_path(path)
    old_umask = os.umask(0o177)
    cwd = os.getcwd() if directory else None
    try:
        if directory:
            os.chdir(directory)  # only at start-up, before any other thread exists
        sock.bind(name)
    finally:
        os.umask(old_umask)
        if cwd:
            os.chdir(cwd)
    os.chmod(path, 0o600)
    sock.listen(64)
    return sock


def connect_unix(path: Path, timeout: float | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    directory, name = _short_path(path)
    if directory is None:
        sock.connect(name)
        return sock
    # a long path: connect through /proc's view of an open directory, leaving our cwd alone
    fd = os.open(directory, os.O_RDONLY)
    try:
        proc = f"/proc/self/fd/{fd}/{name}"
        if os.path.exists(f"/proc/self/fd/{fd}") and len(proc) <= _SUN_PATH_MAX:
            sock.connect(proc)
            return sock
        cwd = os.getcwd()
        os.chdir(directory)
        try:
            sock.connect(name)
        finally:
            os.chdir(cwd)
        return sock
    finally:
        os.close(fd)
