"""The default never waits for an encode (issue 45): a chat's default, the fusion, ranks a scope
whose states are not encoded with what is ready, encoding nothing for the scope, and says what
ran; once the states are encoded, the LLM's signals join. End to end with the real model."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.model

TRANSCRIPT = """Session 1
Maria: Hi John! My aunt gave our family some money last year, so we bought a small house.
John: That is lovely news, Maria. I still live near the beach, the waves are loud at night.
Maria: Do you still go climbing in the mountains every summer?
John: Not this year. I took up painting instead, mostly seascapes.
Session 2
Maria: My dog Biscuit learned to open the garden gate by himself.
John: Ha! My neighbour's cat does the same with the kitchen door.
Maria: We are thinking of adopting a second dog in the spring.
John: I started volunteering at the animal shelter on Saturdays.
"""


def plant_defaults(tmp_path, monkeypatch, **methods) -> None:
    """EVSEL_HYBRID_WEIGHTS: the shipped weights with a defaults record naming `methods` by kind."""
    import json
    import shutil

    from evsel.models.fusion import hybrid
    from evsel.models.runtime.backbone import Backbone

    weights = tmp_path / "weights"
    shutil.copytree(hybrid.shipped_dir(Backbone(None).fingerprint), weights)
    (weights / "defaults.json").write_text(json.dumps({"format": "evsel-defaults/1", "defaults": {
        kind: {"method": method, "why": "planted"} for kind, method in methods.items()}}))
    monkeypatch.setenv("EVSEL_HYBRID_WEIGHTS", str(weights))


def test_a_chat_default_ranks_with_what_is_ready_then_with_the_llm_signals(evsel_home, tmp_path, monkeypatch):
    from evsel.engine import Engine
    from evsel.requests import AskRequest
    from evsel.settings import Settings

    plant_defaults(tmp_path, monkeypatch, dialogue="hybrid", book="hybrid")  # chats ship on BM25 (their speed)
    chat = tmp_path / "chat.txt"
    chat.write_text(TRANSCRIPT)
    engine = Engine(Settings.resolve())  # EVSEL_ENCODE=0 (conftest): the ingest encodes nothing
    engine.ingest([str(chat)])
    assert engine.models_info(load=False)["default_by_kind"]["dialogue"]["method"] == "hybrid"
    states = "select count(*) from chunk_states"

    cold = engine.ask(AskRequest("Who gave Maria's family money?"))
    signals = cold["method"]["signals"]
    assert cold["method"]["select"] == "hybrid" and signals["ran"] == ["bm25"]
    assert set(signals["waiting"]) == {"dense", "unreal"} and all("0 of" in w for w in signals["waiting"].values())
    assert engine.store.db.execute(states).fetchone()[0] == 0  # nothing encoded for the scope
    assert "aunt" in " ".join(e["text"] for e in cold["evidence"][:2])

    engine.encode_states()  # what the background encode does after an ingest through the daemon
    warm = engine.ask(AskRequest("Who gave Maria's family money?"))
    assert warm["method"]["signals"] == {"ran": ["bm25", "dense", "unreal", "qr", "dialogue"], "waiting": {}}
    assert "aunt" in " ".join(e["text"] for e in warm["evidence"][:2])


def test_the_states_each_default_reads():
    from evsel.models.selectors.default import states_read

    assert states_read("hybrid") == {"dense", "unreal", "qrranker"}
    assert states_read("hybrid:bm25+dense+dialogue") == {"dense"}
    assert states_read("rrf:unreal") == {"unreal"} and states_read("bm25") == set()


def test_an_ingest_encodes_only_what_the_kinds_default_reads(evsel_home, tmp_path, monkeypatch):
    """Books on BM25 by the defaults record: the encode an ingest leaves stores no state for them
    (a 10-K whose default is BM25 was encoded all the same, slowing every ask for nothing)."""
    from evsel.engine import Engine
    from evsel.paths import sample_story_path
    from evsel.settings import Settings

    plant_defaults(tmp_path, monkeypatch, book="bm25", dialogue="hybrid")
    engine = Engine(Settings.resolve())
    engine.ingest([str(sample_story_path())])
    outcome = engine.ingest_stage().encode_states(None)  # what follows an ingest (the daemon's background job)
    assert engine.store.db.execute("select count(*) from chunk_states").fetchone()[0] == 0, outcome
