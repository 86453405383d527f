"""Where evsel keeps its state: EVSEL_HOME (read by evsel.settings), else the platform's data dir."""

from __future__ import annotations

import os
import shlex
import stat
from pathlib import Path

from . import settings


def evsel_home() -> Path:
    """The state directory: $EVSEL_HOME, else the platform's user data dir. Created on demand."""
    home = settings.evsel_home()
    if home is None:
        import platformdirs  # only without EVSEL_HOME: a few ms of every command's start-up

        home = Path(platformdirs.user_data_dir("evsel"))
    if not home.is_dir():
        try:
            home.mkdir(mode=0o700, parents=True)
        except FileExistsError:
            pass  # another process made it a moment ago
        else:
            os.chmod(home, 0o700)  # exactly 0700 whatever the umask: it holds the ingested text
    return home


def folder_problem(folder: Path, names: str = "EVSEL_HOME") -> tuple[str, str] | None:
    """(what is wrong, what to run) when another user owns `folder` or can write to it (even with
    the sticky bit, as /tmp has: they can still create names in it), so they could plant a store,
    a socket or a log there for evsel to write the user's text into; else None. `names`: the
    variable that points evsel at it (the way out)."""
    info = os.stat(folder)
    if info.st_uid != os.getuid():
        return (f"{folder} belongs to another user (uid {info.st_uid})",
                f"point {names} at a folder you own")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        # 700, not go-w: go-w leaves 1777 at 1755, which the home's own check then reports
        return (f"{folder} is writable by other users ({stat.S_IMODE(info.st_mode):04o})",
                f"run: chmod 700 {shlex.quote(str(folder))}   (or point {names} at a private folder)")
    return None


# a name evsel never reads or writes: where a user moves a folder another user planted (they cannot
# move it out of the folder it is in: that needs write access to the folder itself)
ASIDE = ".untrusted"


def entry_problem(path) -> tuple[str, str] | None:
    """(what is wrong, what to run) when `path`, a file or folder evsel keeps, is a symbolic link,
    neither a regular file nor a folder, another user's, or writable by other users (planted, or
    open to be replaced: either way someone else would read or steer what evsel uses); None when
    it is fine or absent."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    quoted = shlex.quote(str(path))
    folder = stat.S_ISDIR(info.st_mode)
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link", f"remove it (rm {quoted}), then run the command again"
    if not folder and not stat.S_ISREG(info.st_mode) and not stat.S_ISSOCK(info.st_mode):  # the daemon's socket
        return "is not a regular file", f"remove it (rm {quoted}), then run the command again"
    if info.st_uid != os.getuid():
        move = (f"move it aside (mv {quoted} {shlex.quote(str(path) + ASIDE)}: evsel leaves that name alone)"
                if folder else f"remove it (rm {quoted})")
        return f"belongs to another user (uid {info.st_uid})", f"{move}, or if it is yours (made with sudo?) chown it to you"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):  # -R: a folder made by hand under umask 002, at once
        return (f"is writable by other users ({stat.S_IMODE(info.st_mode):04o})",
                f"run: chmod {'-R go-w' if folder else 'go-w'} {quoted}")
    return None


def refuse_unsafe(path, base, *, tree: bool = False, depth: int | None = None, purpose: str = "use it",
                  names: str = "EVSEL_HOME", label: str = "", keeps: str = "your documents") -> None:
    """The one check of every file and folder evsel reads or writes under EVSEL_HOME or
    EVSEL_MODEL_CACHE: `base` (the folder the user chose, followed if it is a link) must be theirs
    and not writable by others, and every level below it down to `path` that exists (with `tree`,
    everything inside `path` too, `depth` levels deep at most) theirs, not a symbolic link, not
    writable by others. Else an UnsafeHomeError in one line, before anything is read or written
    there. `purpose`, `label`, `keeps` and `names` word that line."""
    from .errors import UnsafeHomeError

    base, path = Path(os.path.abspath(base)), Path(os.path.abspath(path))
    try:
        problem = folder_problem(base, names)
    except OSError:
        problem = None  # no such folder (yet): whoever makes or opens it says so
    if problem:
        what, fix = problem
        raise UnsafeHomeError(f"{label}{what}, so evsel will not keep {keeps} there", fix)
    levels = [path] if path != base else []
    while levels and levels[-1].parent != base and levels[-1].parent != levels[-1]:
        levels.append(levels[-1].parent)
    if levels and levels[-1].parent != base:
        raise ValueError(f"{path} is not under {base}")
    for level in reversed(levels):
        _refuse_entry(level, purpose)
    if tree:
        for root, folders, files in os.walk(path):  # never follows a link: lstat finds those
            folders[:] = [name for name in folders if not name.endswith(ASIDE)]
            for name in folders + files:
                _refuse_entry(Path(root, name), purpose)
            if depth is not None and len(Path(root).relative_to(path).parts) + 1 >= depth:
                folders.clear()


def _refuse_entry(path: Path, purpose: str) -> None:
    from .errors import UnsafeHomeError

    problem = entry_problem(path)
    if problem:
        why, fix = problem
        raise UnsafeHomeError(f"{path} {why}, so evsel will not {purpose}", fix)


def private_folder(folder, base, **wording) -> Path:
    """mkdir -p `folder` below `base`, every level it makes exactly 0700 (whatever the umask),
    after `refuse_unsafe` has passed it and every level above it that already exists."""
    folder, base = Path(os.path.abspath(folder)), Path(os.path.abspath(base))
    refuse_unsafe(folder, base, **wording)
    chain, at = [], folder
    while not os.path.lexists(at):
        chain.append(at)
        if at == base or at.parent == at:
            break
        at = at.parent
    for level in reversed(chain):
        try:
            level.mkdir(mode=0o700, parents=level == base)
        except FileExistsError:
            refuse_unsafe(level, base, **wording)  # made by another process a moment ago: check it
            continue
        os.chmod(level, 0o700)
    return folder


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
    home = evsel_home()
    return private_folder(home / "cache", home, label="EVSEL_HOME ") / "eval.db"


def model_cache_dir() -> Path:
    """Dense copies of GGUF backbones and other per-model artifacts, keyed by fingerprint.
    $EVSEL_MODEL_CACHE lets several homes (tests, one user's) share one copy."""
    return model_cache_path()


def model_cache_path(*parts: str, tree: bool = False) -> Path:
    """A file or folder of the model cache, passed by `refuse_unsafe` (with `tree`, all inside it
    too), the cache folder made private where missing: what evsel loads from it are the weights it
    runs and the tokenizer it parses."""
    chosen = settings.model_cache()
    if chosen is not None:
        base, names, label = chosen, "EVSEL_MODEL_CACHE", "EVSEL_MODEL_CACHE "
    else:
        base, names, label = evsel_home(), "EVSEL_HOME", "EVSEL_HOME "
    wording = {"names": names, "label": label, "keeps": "models", "purpose": "load a model from it"}
    folder = private_folder(base if chosen is not None else base / "models", base, **wording)
    path = folder.joinpath(*parts)
    if parts or tree:
        refuse_unsafe(path, base, tree=tree, **wording)
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
