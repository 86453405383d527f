"""Where evsel keeps its state: EVSEL_HOME (read by evsel.settings), else the platform's data dir."""

from __future__ import annotations

import os
import shlex
import stat
from pathlib import Path

import platformdirs

from . import settings


def evsel_home() -> Path:
    """The state directory: $EVSEL_HOME, else the platform's user data dir. Created on demand."""
    home = settings.evsel_home() or Path(platformdirs.user_data_dir("evsel"))
    if not home.is_dir():
        try:
            home.mkdir(mode=0o700, parents=True)
        except FileExistsError:
            pass  # another process made it a moment ago
        else:
            os.chmod(home, 0o700)  # exactly 0700 whatever the umask: it holds the ingested text
    return home


def folder_problem(folder: Path) -> tuple[str, str] | None:
    """(what is wrong, what to run) when another user owns `folder` or can write to it (even with
    the sticky bit, as /tmp has: they can still create names in it), so they could plant a store,
    a socket or a log there for evsel to write the user's text into; else None."""
    info = os.stat(folder)
    if info.st_uid != os.getuid():
        return (f"{folder} belongs to another user (uid {info.st_uid})",
                "point EVSEL_HOME at a folder you own")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (f"{folder} is writable by other users ({stat.S_IMODE(info.st_mode):04o})",
                f"run: chmod go-w {shlex.quote(str(folder))}   (or point EVSEL_HOME at a private folder)")
    return None


def file_problem(path) -> str | None:
    """Why an existing file of the store must not be used (a symlink, not a regular file, another
    user's: someone planted it to read what evsel writes), or None when it is fine or absent."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link"
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    if info.st_uid != os.getuid():
        return f"belongs to another user (uid {info.st_uid})"
    return None


# files in EVSEL_HOME that hold the user's text or say what they asked (checked by `permission_warning`)
PRIVATE_FILES = ("evsel.db", "evsel.db-wal", "evsel.db-shm", "daemon.log", "daemon.err", "daemon.pid",
                 "cache/eval.db")


def create_private_file(path) -> bool:
    """Create `path` empty with mode 0600 (never through a symlink) when it does not exist yet.
    True when this call created it; False when it existed or is not a plain path (":memory:")."""
    text = str(path)
    if not text or text == ":memory:" or text.startswith("file:"):
        return False
    try:
        fd = os.open(text, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError:
        return False  # it exists (or cannot be made: then its opener says why)
    os.close(fd)
    return True


def make_private(*files) -> None:
    """chmod 0600 the files of these that exist and are regular files (not through symlinks)."""
    for name in files:
        try:
            info = os.lstat(name)
            if stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) & 0o077:
                os.chmod(name, 0o600)
        except OSError:
            pass


def permission_warning(home: Path | None = None) -> str | None:
    """One line when the home is looser than 0700 or a file of it holding the user's text looser
    than 0600 (a home made by an older evsel, or by hand), saying what to run; else None."""
    home = Path(home) if home is not None else evsel_home()
    try:
        home_mode = stat.S_IMODE(home.stat().st_mode)
    except OSError:
        return None
    parts, loose = [], []
    if home_mode & 0o077:
        parts.append(f"EVSEL_HOME {home} is {home_mode:04o}")
    for name in PRIVATE_FILES:
        try:
            info = os.lstat(home / name)
        except OSError:
            continue
        mode = stat.S_IMODE(info.st_mode)
        if stat.S_ISREG(info.st_mode) and mode & 0o077:
            loose.append(home / name)
            parts.append(f"{name} is {mode:04o}")
    if not parts:
        return None
    fix = [f"chmod 700 {shlex.quote(str(home))}"] if home_mode & 0o077 else []
    if loose:
        fix.append("chmod 600 " + " ".join(shlex.quote(str(p)) for p in loose))
    return (f"{', '.join(parts)}: other users may read your documents and questions "
            f"(evsel makes its home 0700 and its files 0600); run: {' && '.join(fix)}")


def db_path() -> Path:
    return evsel_home() / "evsel.db"


def eval_cache_path() -> Path:
    """`evsel eval`'s own state cache: chunk states of benchmark documents, never the user's store."""
    path = evsel_home() / "cache"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path / "eval.db"


def model_cache_dir() -> Path:
    """Dense copies of GGUF backbones and other per-model artifacts, keyed by fingerprint.
    $EVSEL_MODEL_CACHE lets several homes (tests, users) share one copy."""
    path = settings.model_cache() or evsel_home() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def watch_folder(path: str) -> Path:
    """The absolute, resolved folder to watch, or an error saying what is wrong with it."""
    from .errors import InputError

    folder = Path(path).expanduser()
    if not folder.exists():
        raise InputError("no such directory", "check the path", path=str(path))
    if not folder.is_dir():
        raise InputError("not a directory", "evsel watch takes a folder; ingest a single file with: evsel ingest",
                         path=str(path))
    return folder.resolve()


def watched_path(path: str) -> str:
    """How --remove names a folder: resolved if it still exists, else absolute as given."""
    folder = Path(path).expanduser()
    return str(folder.resolve() if folder.exists() else folder.absolute())


def sample_story_path() -> Path:
    return Path(__file__).parent / "samples" / "the_gull_point_light.md"
