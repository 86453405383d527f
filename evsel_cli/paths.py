"""Where evsel keeps its state. One function, one environment override (EVSEL_HOME)."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def evsel_home() -> Path:
    """The state directory: $EVSEL_HOME, else the platform's user data dir. Created on demand."""
    override = os.environ.get("EVSEL_HOME")
    home = Path(override).expanduser() if override else Path(platformdirs.user_data_dir("evsel"))
    home.mkdir(parents=True, exist_ok=True)
    return home


def db_path() -> Path:
    return evsel_home() / "evsel.db"


def model_cache_dir() -> Path:
    """Dense copies of GGUF backbones and other per-model artifacts, keyed by fingerprint.
    $EVSEL_MODEL_CACHE lets several homes (tests, users) share one copy."""
    override = os.environ.get("EVSEL_MODEL_CACHE")
    path = Path(override).expanduser() if override else evsel_home() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def sample_story_path() -> Path:
    return Path(__file__).parent / "samples" / "the_gull_point_light.md"
