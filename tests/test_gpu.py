"""GPU mode: the tiny random Llama of test_unreal.py end to end on `cuda`: hidden states, chunk
states through the state cache, an adapter made and calibrated on the GPU, UNREAL queries and
scores (equal to the CPU's), the selectors as `ask` runs them, and training steps that resume on
the CPU. Every test skips, saying why, on a machine without a CUDA device."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from evsel.models.unreal import selection as unreal
from test_unreal import _text, _training_folder, tiny_model_dir  # noqa: F401  (tiny_model_dir: a fixture)


@pytest.fixture
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: torch.cuda.is_available() is False on this machine, so GPU mode "
                    "cannot run here")


def _chunks(texts):
    from evsel.store.store import ChunkRecord

    return [ChunkRecord(id=i + 1, doc_id=1, seq=i, text=t, content_hash=hashlib.sha256(t.encode()).hexdigest(),
                        n_tokens=0, char_start=0, char_end=0) for i, t in enumerate(texts)]


SELECTORS = (("unreal", {}), ("rrf:unreal", {}), ("intrinsic", {"layers": (1, 2)}))


def _selector_scores(engine, adapter, question: str, chunks) -> dict[str, dict[int, float]]:
    """{selector: {chunk id: score}} for SELECTORS as eval runs them (chunks in memory), with
    this UNREAL adapter."""
    from evsel.models.selectors import get_selector

    engine.settings = engine.settings.with_(unreal_adapter=str(adapter))
    context = engine.selector_context(for_eval=True)
    return {name: {s.chunk.id: s.score for s in get_selector(name, context, **options).rank(question, chunks)}
            for name, options in SELECTORS}


def test_unreal_on_cuda_matches_the_cpu(cuda, tiny_model_dir, tmp_path, monkeypatch):
    from evsel.engine import Engine

    gpu = Engine(model=str(tiny_model_dir), device="cuda")
    cpu = Engine(model=str(tiny_model_dir), device="cpu")
    backbone = gpu.backbone
    assert backbone.plan.device == "cuda" and next(backbone.model.parameters()).is_cuda
    # fp32 on both sides, with the same weights (each side loaded them in its own dtype)
    cpu.backbone.model.float()
    gpu.backbone.model.float().load_state_dict(cpu.backbone.model.state_dict())
    texts = [_text(20 + i, 4 + 3 * i) for i in range(6)]
    chunks = _chunks(texts)

    # the early-stopping pass: ids given on the CPU, states on the GPU
    ids = torch.tensor([[backbone.bos_id()] + backbone.text_ids(texts[:1])[0]])
    mask = torch.ones_like(ids)
    hidden = backbone.hidden_states_at(ids, mask, 2)
    assert hidden.is_cuda
    np.testing.assert_allclose(hidden.cpu().numpy(), cpu.backbone.hidden_states_at(ids, mask, 2).numpy(),
                               rtol=1e-3, atol=1e-3)

    # chunk states through the state cache, as numpy on the host
    states = unreal.chunk_states(backbone, gpu.states, chunks, 2, 3)
    assert states.shape == (6, 3, 32) and states.dtype == np.float16
    on_cpu = unreal.ChunkEncoder(cpu.backbone, [2], 3).encode(texts)[2]
    np.testing.assert_allclose(states.astype(np.float32), on_cpu.astype(np.float32), rtol=2e-3, atol=2e-3)

    # an adapter made, initialised and calibrated where the backbone is
    config = unreal.UnrealConfig(layer=2, pool=3, retrieval_tokens=8, groups=2, c0=2, readout=[1, 2])
    adapter = unreal.new_adapter(config, 32, backbone.plan.device)
    adapter.init_from_backbone(backbone)
    unreal.calibrate(adapter, backbone, [_text(i, 9) for i in range(6)])
    assert all(t.is_cuda for t in [*adapter.trainable(), adapter.stats])
    adapter.save(tmp_path / "adapter")
    cpu_adapter = unreal.load_adapter(tmp_path / "adapter")  # the same tensors, on the CPU
    assert cpu_adapter.digest() == adapter.digest()
    reference = unreal.new_adapter(config, 32)
    reference.init_from_backbone(cpu.backbone)
    unreal.calibrate(reference, cpu.backbone, [_text(i, 9) for i in range(6)])
    torch.testing.assert_close(adapter.rho.cpu(), reference.rho, rtol=1e-5, atol=1e-5)  # the same start
    torch.testing.assert_close(adapter.stats.cpu(), reference.stats, rtol=1e-3, atol=1e-3)

    # query and scores: numpy out, the same numbers as the CPU's
    question, c0 = "who lit the lamp", texts[:2]
    query = unreal.UnrealQuery(backbone, adapter)
    vectors = query.encode_question(question, c0)
    assert isinstance(vectors, np.ndarray) and vectors.shape == (2, 32)
    keys = query.chunk_keys(states)
    assert keys.is_cuda and keys.dtype == torch.float32
    scores = query.score_keys(vectors, keys)
    assert isinstance(scores, np.ndarray) and scores.shape == (6,)
    cpu_query = unreal.UnrealQuery(cpu.backbone, cpu_adapter)
    cpu_vectors = cpu_query.encode_question(question, c0)
    np.testing.assert_allclose(vectors, cpu_vectors, rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(scores, cpu_query.score_keys(cpu_vectors, cpu_query.chunk_keys(states)),
                               rtol=1e-3, atol=1e-2)

    # the selectors as eval runs them, with that adapter: the CPU's scores, the CPU encoding the
    # chunks itself (an eval cache of its own, not the one the GPU filled)
    on_gpu = _selector_scores(gpu, tmp_path / "adapter", question, chunks)
    monkeypatch.setenv("EVSEL_HOME", str(tmp_path / "cpu-home"))
    on_cpu = _selector_scores(cpu, tmp_path / "adapter", question, chunks)
    ids = [c.id for c in chunks]
    for name, _ in SELECTORS:
        # the same order (these chunks' scores are far apart: no near-tie to flip), near the same scores
        assert list(on_gpu[name]) == list(on_cpu[name]) and sorted(on_cpu[name]) == ids, name
        np.testing.assert_allclose([on_gpu[name][i] for i in ids], [on_cpu[name][i] for i in ids],
                                   rtol=1e-3, atol=1e-2, err_msg=name)


def test_training_steps_on_cuda_resume_on_the_cpu(cuda, tiny_model_dir, tmp_path):
    from evsel.engine import Engine
    from evsel.recipes.unreal import RunParts, TrainConfig, Trainer, load_data

    engine = Engine(model=str(tiny_model_dir), device="cuda")  # bf16, as a GPU run trains
    data = _training_folder(tmp_path / "data")
    config = TrainConfig(data=str(data), out=str(tmp_path / "run"), layer=2, pool=3, retrieval_tokens=8, groups=2,
                         c0=2, readout=[1, 2], batch=4, steps=2, lr=2e-3, warmup=1, dev_every=0, dev_queries=2,
                         calibrate_chunks=8, checkpoint_every=1, device="cuda")
    trainer = Trainer(config, RunParts(lambda: engine.backbone, lambda: engine.states, engine.device))
    trainer.setup(*load_data(data))  # calibration, chunk keys and the temperature, on the GPU
    assert all(t.is_cuda for t in [*trainer.adapter.trainable(), trainer.adapter.stats, trainer.keys])
    assert trainer.config.tau > 0
    rho = trainer.adapter.rho.detach().clone()
    summary = trainer.run()
    assert summary["steps"] == 2
    assert not torch.equal(trainer.adapter.rho, rho)
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "loss" in r] == [1, 2]
    assert all(np.isfinite(r["loss"]) and np.isfinite(r["grad_norm"]) for r in log if "loss" in r)
    assert "dev_recall@5" in log[-1]  # the dev check scored GPU keys

    # backprop through the whole of x_ret (--train-soft-prompt) works there too
    trainer.config.train_soft_prompt = True
    trainer.optimizer.zero_grad(set_to_none=True)
    trainer.batch_loss(trainer.train[:2])
    assert trainer.adapter.soft_prompt.grad is not None and trainer.adapter.soft_prompt.grad.is_cuda

    # the GPU's checkpoint (optimizer state included) resumes on the CPU
    cpu_engine = Engine(model=str(tiny_model_dir), device="cpu")
    resumed = Trainer(replace(config, steps=3, device="cpu"), cpu_engine)
    resumed.setup(*load_data(data))
    assert resumed.step == 2 and not resumed.adapter.rho.is_cuda
    assert resumed.run()["steps"] == 3
