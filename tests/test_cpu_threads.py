"""The thread count measured per machine at the first model load (models/runtime/cpu_threads.py): it is
recorded and read back, EVSEL_THREADS and a count this process already set win over it, and it
changes no state: chunk states at every candidate count match one thread's within the tolerance
the compiled path is held to (2% relative L2 per pooled vector, the same top 3), on the tiny
model and on the real one."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from evsel.models.runtime import cpu_threads
from evsel.models.unreal import selection as unreal

from fixtures_tiny import WORDS


@pytest.fixture
def torch_threads():
    """torch's thread count as the test found it, put back after (it is process-wide)."""
    before = torch.get_num_threads()
    yield before
    torch.set_num_threads(before)


def _texts(n: int) -> list[str]:
    rng = np.random.default_rng(7)
    return [" ".join(rng.choice(WORDS, size=5 + 3 * i)) for i in range(n)]


def _states_at(backbone, counts: list[int], texts: list[str], layer: int, pool: int) -> dict[int, np.ndarray]:
    out = {}
    for n in counts:
        torch.set_num_threads(n)
        out[n] = unreal.ChunkEncoder(backbone, [layer], pool=pool).encode(texts)[layer].astype(np.float32)
    return out


def _assert_same_states(states: dict[int, np.ndarray], query: np.ndarray, scores) -> None:
    one = states[1]
    want = np.argsort(-scores(query, one))[:3]
    for n, got in states.items():
        error = np.linalg.norm(got - one, axis=-1) / np.linalg.norm(one, axis=-1)
        assert error.max() <= 0.02, (n, error.max())
        assert list(np.argsort(-scores(query, got))[:3]) == list(want), n


def _cpus_or_skip() -> int:
    cpus = cpu_threads.usable_cpus()
    if cpus < 2:
        pytest.skip("this machine lets the process use one CPU: there is no thread count to choose")
    return cpus


def test_states_match_one_thread_at_every_candidate_count_tiny(gqa_model_dir, torch_threads):
    from evsel.models.runtime.backbone import Backbone

    backbone = Backbone(str(gqa_model_dir), "cpu", threads=1)
    counts = cpu_threads.candidates(max(2, cpu_threads.usable_cpus()))
    states = _states_at(backbone, counts, _texts(10), layer=2, pool=3)
    _assert_same_states(states, states[1][4, :2], unreal.maxsim)


def test_first_load_measures_records_and_later_loads_read_it(gqa_model_dir, torch_threads):
    from evsel.models.runtime.backbone import Backbone

    cpus = _cpus_or_skip()
    torch.set_num_threads(cpus)  # as torch starts: one per CPU, nothing set by the process
    first = Backbone(str(gqa_model_dir), "cpu")
    _ = first.model
    record = first.cache_dir / cpu_threads.RECORD
    data = json.loads(record.read_text())
    assert data["machine"] == cpu_threads.machine_key(cpus)
    assert set(data["tokens_per_s"]) == {str(n) for n in cpu_threads.candidates(cpus)}
    assert all(v > 0 for v in data["tokens_per_s"].values())
    fastest = max(data["tokens_per_s"], key=data["tokens_per_s"].get)
    assert data["threads"] == int(fastest) == torch.get_num_threads()
    info = first.info()
    assert info["threads"] == data["threads"] and info["threads_from"].startswith("measured at the first load")

    other = next(n for n in cpu_threads.candidates(cpus) if n != data["threads"])
    record.write_text(json.dumps({**data, "threads": other}))  # a later load reads the record, measures nothing
    torch.set_num_threads(cpus)
    _ = Backbone(str(gqa_model_dir), "cpu").model
    assert torch.get_num_threads() == other

    record.write_text("{not json")  # a damaged record is measured again and rewritten
    torch.set_num_threads(cpus)
    _ = Backbone(str(gqa_model_dir), "cpu").model
    again = json.loads(record.read_text())
    assert again["threads"] == torch.get_num_threads() and again["machine"] == data["machine"]


def test_evsel_threads_and_a_count_already_set_win_over_the_measure(gqa_model_dir, torch_threads):
    from evsel.models.runtime.backbone import Backbone

    cpus = _cpus_or_skip()
    torch.set_num_threads(cpus)
    given = Backbone(str(gqa_model_dir), "cpu", threads=1)  # EVSEL_THREADS=1
    (given.cache_dir / cpu_threads.RECORD).unlink(missing_ok=True)  # the model cache is the session's
    _ = given.model
    assert torch.get_num_threads() == 1 and given.info()["threads_from"] == "EVSEL_THREADS"
    assert not (given.cache_dir / cpu_threads.RECORD).exists()
    # a recipe's --threads (or a bench) set below one per CPU before the model loads: kept
    lazy = Backbone(str(gqa_model_dir), "cpu")
    _ = lazy.model
    assert torch.get_num_threads() == 1 and not (lazy.cache_dir / cpu_threads.RECORD).exists()
    assert lazy.info()["threads_from"].startswith("set in this process")


@pytest.mark.model
def test_real_model_states_and_unreal_top3_match_one_thread(torch_threads):
    """SmolLM2 on the bundled story's first 40 chunks at the shipped UNREAL adapter's layer and
    pool: pooled states within 2% of one thread's at every candidate count, the same top 3 by the
    adapter's own scoring of a question about the story."""
    from evsel.ingest import chunker
    from evsel.models.runtime.backbone import Backbone
    from evsel.ingest.parsers import parse_file
    from evsel.paths import sample_story_path

    backbone = Backbone(threads=1)
    texts = [c.text for doc in parse_file(sample_story_path()) for c in chunker.chunk_document(doc, backbone)][:40]
    adapter = unreal.default_adapter(backbone)
    cfg = adapter.config
    query_side = unreal.UnrealQuery(backbone, adapter)
    query = query_side.encode_question("Who killed Ambrose Tenterden?", texts[:cfg.c0])
    counts = cpu_threads.candidates(max(2, cpu_threads.usable_cpus()))
    states = _states_at(backbone, counts, texts, cfg.layer, cfg.pool)

    def scores(q, keys):
        return query_side.score_keys(q, query_side.chunk_keys(keys))

    _assert_same_states(states, query, scores)


@pytest.mark.parametrize("speeds", [[1, 2], None, {"1": "fast"}, "1 thread", {"1": [3.0]}])
def test_a_damaged_record_is_measured_again(tmp_path, torch_threads, speeds):
    """A record whose fields are of the wrong type broke every model load ("unexpected
    AttributeError") until deleted: it is damaged, so measured again and rewritten."""
    key = cpu_threads.machine_key(2)
    record = tmp_path / cpu_threads.RECORD
    record.write_text(json.dumps({"threads": 2, "tokens_per_s": speeds, "machine": key,
                                  "measured_at": "2026-01-01T00:00:00", "load_1m": 0.5}))
    passes = []
    choice = cpu_threads.choose(record, lambda: passes.append(1) or 10, cpus=2)
    assert passes and choice.threads in (1, 2) and "tokens/s" in choice.describe(record)
    assert json.loads(record.read_text())["tokens_per_s"] == choice.tokens_per_s


def test_a_recorded_count_above_the_usable_cpus_is_clamped(tmp_path):
    key = cpu_threads.machine_key(2)
    record = tmp_path / cpu_threads.RECORD
    record.write_text(json.dumps({"threads": 100000, "tokens_per_s": {"1": 10.0, "2": 12.0}, "machine": key,
                                  "measured_at": "2026-01-01T00:00:00", "load_1m": None}))
    choice = cpu_threads.choose(record, lambda: pytest.fail("a valid record is not measured again"), cpus=2)
    assert choice.threads == 2


def test_evsel_threads_above_the_usable_cpus_is_clamped(gqa_model_dir, torch_threads):
    from evsel.models.runtime.backbone import Backbone

    _ = Backbone(str(gqa_model_dir), "cpu", threads=100000).model  # EVSEL_THREADS=100000
    assert torch.get_num_threads() == cpu_threads.usable_cpus()
