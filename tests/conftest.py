"""Every test gets its own EVSEL_HOME; the dense model copy is shared across the session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# the tiny random Llama's fixtures; helpers.py holds what tests import (shared_data, plant_defaults)
pytest_plugins = ["fixtures_tiny"]


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("model-cache")


@pytest.fixture(autouse=True)
def evsel_home(tmp_path, monkeypatch, model_cache) -> Path:
    home = tmp_path / "evsel-home"
    monkeypatch.setenv("EVSEL_HOME", str(home))
    monkeypatch.setenv("EVSEL_MODEL_CACHE", str(model_cache))
    monkeypatch.setenv("EVSEL_NO_DAEMON", "1")
    monkeypatch.setenv("EVSEL_ENCODE", "0")  # chunk states at ingest cost minutes on CPU; tests that need them ask
    monkeypatch.setenv("EVSEL_QRRANKER_KV", "0")  # so does QRRanker's stored KV (on by default); its tests ask
    monkeypatch.delenv("EVSEL_MODEL", raising=False)
    monkeypatch.delenv("EVSEL_DEVICE", raising=False)
    return home


@pytest.fixture(scope="session")
def backbone_tokenizer(model_cache):
    """The real SmolLM2 tokenizer (no model weights needed); EVSEL_MODEL_CACHE is as it was after."""
    previous = os.environ.get("EVSEL_MODEL_CACHE")
    os.environ["EVSEL_MODEL_CACHE"] = str(model_cache)
    try:
        from evsel.models.runtime.backbone import Backbone

        backbone = Backbone()
        _ = backbone.tokenizer
        _ = backbone.fingerprint
    finally:
        if previous is None:
            os.environ.pop("EVSEL_MODEL_CACHE", None)
        else:
            os.environ["EVSEL_MODEL_CACHE"] = previous
    return backbone
