"""Where evsel keeps its state: EVSEL_HOME (read by evsel.settings), else the platform's data dir."""

from __future__ import annotations

from pathlib import Path

import platformdirs

from . import settings


def evsel_home() -> Path:
    """The state directory: $EVSEL_HOME, else the platform's user data dir. Created on demand."""
    home = settings.evsel_home() or Path(platformdirs.user_data_dir("evsel"))
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    return home


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
