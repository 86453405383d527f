"""Where the daemon keeps its files in EVSEL_HOME, and the checks around them.

One daemon per EVSEL_HOME. It holds an exclusive lock on `daemon.lock` for its whole life; the
kernel drops the lock when the process dies (even by kill -9), so "is a daemon alive?" is answered
by trying the lock, never by trusting a pid file or a socket file that a crash left behind.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import socket
import stat
import struct
import sys
import zlib
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
    """The evsel version plus a checksum of the installed source files' sizes and mtimes.

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
    listing = []
    for root in roots:
        # every *.py below root in Path order (by parts), as sorted(root.rglob("*.py")) gave, with
        # os.walk: pathlib's glob costs a client more than the walk itself
        found = [os.path.join(folder, name) for folder, _, names in os.walk(root) for name in names
                 if name.endswith(".py")]
        for path in sorted(found, key=lambda path: path.split(os.sep)):
            try:
                info = os.stat(path)
            except OSError:
                continue
            listing.append(f"{path}:{info.st_size}:{info.st_mtime_ns}\n")
    # a checksum, not a cryptographic digest: it tells builds apart, and zlib loads in a fraction
    # of the time hashlib's OpenSSL takes (every client computes it)
    return f"{__version__}+{zlib.crc32(''.join(listing).encode()):08x}"


def check_home_private(home: Path) -> None:
    """Refuse a home that other users could write to: they could replace the socket or the store.
    (Opening the store makes the same check, so --no-daemon is no way around it.)"""
    from evsel.paths import folder_problem, refuse_unsafe

    problem = folder_problem(home)
    if problem:
        what, fix = problem
        raise DaemonError(f"EVSEL_HOME {what}, so evsel will not start or talk to a daemon there", fix)
    refuse_unsafe(home, home, tree=True, depth=1)  # what the home holds: planted, refused before a daemon starts


def check_socket_path(path: Path) -> None:
    """Refuse a daemon.sock that is not a socket (a directory, a file, a link someone made there):
    evsel neither connects through it nor deletes it."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISSOCK(info.st_mode):
        return
    kind = ("a directory" if stat.S_ISDIR(info.st_mode) else "a symbolic link" if stat.S_ISLNK(info.st_mode)
            else "not a socket")
    remove = "rmdir" if stat.S_ISDIR(info.st_mode) else "rm"
    raise DaemonError(f"{path} is {kind}, not the evsel daemon's socket",
                      f"move it away (or {remove} {shlex.quote(str(path))}), then run the command again")


def peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end of a connected Unix socket (for a daemon: the one
    that called listen), or None where the platform cannot say."""
    if hasattr(socket, "SO_PEERCRED"):  # Linux: struct ucred {pid_t pid; uid_t uid; gid_t gid}
        data = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return struct.unpack("3i", data)[1]
    if sys.platform == "darwin" and hasattr(socket, "LOCAL_PEERCRED"):
        # struct xucred {u_int cr_version; uid_t cr_uid; short cr_ngroups; gid_t cr_groups[16]}
        data = sock.getsockopt(getattr(socket, "SOL_LOCAL", 0), socket.LOCAL_PEERCRED, struct.calcsize("IIh16I"))
        return struct.unpack_from("II", data)[1]
    return None


def check_peer(sock: socket.socket, path: Path) -> None:
    """Refuse a socket served by another user: it would receive our questions and settings."""
    uid = peer_uid(sock)
    if uid is not None and uid != os.getuid():
        raise DaemonError(
            f"the socket {path} is served by another user (uid {uid}, you are uid {os.getuid()}), "
            "so evsel will not talk to it",
            f"remove it (rm {path}) and make EVSEL_HOME private (chmod 700 {path.parent}), or use --no-daemon",
        )


def open_private(path: Path, flags: int) -> int:
    """A file descriptor for a file of ours in EVSEL_HOME, created 0600, never through a symbolic link.

    Refuses a symlink (O_NOFOLLOW), something that is not a regular file, a file of another user,
    or a file with other hard links (all of which someone may have planted to make us write
    elsewhere), before anything is written or truncated. The file ends up mode 0600.
    """
    try:
        fd = os.open(path, flags | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
                     | getattr(os, "O_NONBLOCK", 0), 0o600)
    except OSError as exc:
        if os.path.islink(path):
            raise DaemonError(f"{path} is a symbolic link, so evsel will not write through it",
                              f"remove it: rm {path}") from None
        raise DaemonError(f"cannot open {path}: {exc.strerror}", "check EVSEL_HOME's permissions") from None
    try:
        info = os.fstat(fd)
        why = ("is not a regular file" if not stat.S_ISREG(info.st_mode) else
               f"belongs to another user (uid {info.st_uid})" if info.st_uid != os.getuid() else
               "has other hard links" if info.st_nlink > 1 else None)
        if why:
            raise DaemonError(f"{path} {why}, so evsel will not write to it", f"remove it: rm {path}")
        if stat.S_IMODE(info.st_mode) != 0o600:
            os.fchmod(fd, 0o600)
        if hasattr(os, "O_NONBLOCK"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


class HomeLock:
    """The exclusive lock that makes a process the daemon of its home."""

    def __init__(self, path: Path):
        self.path = path
        self.fd: int | None = None

    def acquire(self) -> bool:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        except OSError as exc:
            if os.path.islink(self.path):
                raise DaemonError(f"{self.path} is a symbolic link, so evsel will not use it",
                                  f"remove it: rm {self.path}") from None
            raise DaemonError(f"cannot open {self.path}: {exc.strerror}", "check EVSEL_HOME's permissions") from None
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
    check_socket_path(daemon_files.socket)
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
    fd = open_private(tmp, os.O_WRONLY)
    os.ftruncate(fd, 0)
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(data))
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
    """A socket connected to `path`, checked to be served by our own user (`check_peer`) before
    anything is sent on it."""
    sock = _connect_unix(path, timeout)
    try:
        check_peer(sock, Path(path))
    except BaseException:
        sock.close()
        raise
    return sock


def _connect_unix(path: Path, timeout: float | None = None) -> socket.socket:
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
