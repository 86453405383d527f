"""What several test modules share that is not a fixture: the shared benchmark data and the
defaults record a test plants (the tiny random Llama is fixtures_tiny.py's `tiny_llama`)."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parent.parent.parent / "shared"
DATA = SHARED / "data"


def shared_data(*parts: str) -> Path:
    """A file from ../shared/data, or skip the test saying why."""
    path = DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent: the shared benchmark data is not checked out beside the project")
    return path


def book_default() -> str:
    """The method `ask` runs on books with no --select, as `evsel models info` names it (the
    shipped hybrid.json's test, or EVSEL_HYBRID_WEIGHTS's)."""
    from evsel.engine import Engine
    from evsel.settings import Settings

    return Engine(Settings.resolve()).models_info(load=False)["default_by_kind"]["book"]["method"]


def plant_defaults(folder: Path, **methods: str) -> str:
    """A defaults record naming `methods` by kind (EVSEL_HYBRID_WEIGHTS / hybrid_weights): an
    ingest encodes only the states the kinds' defaults read, and a tiny model's default is BM25."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "defaults.json").write_text(json.dumps({"format": "evsel-defaults/1", "defaults": {
        kind: {"method": method, "why": "planted"} for kind, method in methods.items()}}))
    return str(folder)
