"""UNREAL on a tiny random Llama (2 layers, hidden 32, vocab 99) saved as a real HF folder and
loaded through the real Backbone: pooling and MaxSim against hand computations, the adapter's
round trip, the state cache, intrinsic scores, and training steps."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from evsel.models.unreal import selection as unreal
from fixtures_tiny import SMALL_SHAPE
from helpers import plant_defaults

WORDS = ["the", "keeper", "light", "storm", "ship", "rock", "night", "lamp", "sea", "gull", "tower", "boat",
         "wind", "wave", "door", "key", "letter", "knife", "blood", "clock", "window", "stair", "rope", "oil"]


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_llama) -> Path:
    """The tiny model at 2 layers, hidden 32, with a vocabulary of 99 (the special tokens and 95 words)."""
    words = list(dict.fromkeys(WORDS + [w.capitalize() for w in WORDS] + [f"w{i}" for i in range(99)]))[:95]
    return tiny_llama(words, **SMALL_SHAPE, max_position_embeddings=1024)


@pytest.fixture
def tiny_engine(tiny_model_dir):
    from evsel.engine import Engine

    engine = Engine(model=str(tiny_model_dir), device="cpu")
    engine.backbone.model.float()  # fp32: hand computations compare to 1e-5
    return engine


def _text(seed: int, n: int) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(rng.choice(WORDS, size=n))


def test_pooling_segments_by_hand():
    # 10 tokens in 7 segments: boundaries j*10//7 = 0,1,2,4,5,7,8,10 -> sizes 1,1,2,1,2,1,2
    w = unreal.pooling_weights([10], 11, 7, offset=1)[0]
    assert w[:, 0].sum() == 0  # the sink never pooled
    sizes = [(row > 0).sum().item() for row in w]
    assert sizes == [1, 1, 2, 1, 2, 1, 2]
    assert torch.nonzero(w[2]).flatten().tolist() == [3, 4]  # tokens 2..3 after the sink
    assert torch.allclose(w.sum(dim=1), torch.ones(7))
    # 3 tokens, 7 segments: empty segments take their nearest token alone
    short = unreal.pooling_weights([3], 4, 7)[0]
    assert [int(torch.nonzero(row).flatten()[0]) for row in short] == [1, 1, 1, 2, 2, 3, 3]
    states = torch.arange(4 * 2, dtype=torch.float32).reshape(1, 4, 2)  # token t = (2t, 2t+1)
    pooled = unreal.pool_states(states, [3], 2)
    # segments: tokens [1] and [2, 3] after the sink -> (2, 3) and mean((4, 5), (6, 7)) = (5, 6)
    assert pooled[0].tolist() == [[2.0, 3.0], [5.0, 6.0]]


def test_maxsim_by_hand():
    q = np.array([[1.0, 0.0], [0.0, 2.0]], dtype=np.float32)  # G=2
    k = np.array([
        [[3.0, 1.0], [0.0, 1.0]],  # q0: max(3, 0) = 3; q1: max(2, 2) = 2 -> 5
        [[-1.0, 4.0], [2.0, -1.0]],  # q0: max(-1, 2) = 2; q1: max(8, -2) = 8 -> 10
    ], dtype=np.float16)
    assert unreal.maxsim(q, k).tolist() == [5.0, 10.0]
    assert unreal.maxsim(q, k, block=1).tolist() == [5.0, 10.0]
    assert unreal.maxsim_torch(torch.tensor(q)[None], torch.tensor(k).float()).tolist() == [[5.0, 10.0]]


def test_chunk_states_match_hidden_states(tiny_engine):
    backbone = tiny_engine.backbone
    texts = [_text(1, 12), _text(2, 5), _text(3, 3)]
    got = unreal.ChunkEncoder(backbone, [1], pool=3).encode(texts)[1]
    assert got.shape == (3, 3, 32) and got.dtype == np.float16
    for i, text in enumerate(texts):
        ids = [backbone.bos_id()] + backbone.tokenizer(text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            hidden = backbone.model(torch.tensor([ids]), output_hidden_states=True).hidden_states[1][0, 1:]
        n = hidden.shape[0]
        bounds = [(j * n // 3, (j + 1) * n // 3) for j in range(3)]
        expected = torch.stack([hidden[lo:hi].mean(0) for lo, hi in bounds]).numpy()
        np.testing.assert_allclose(got[i].astype(np.float32), expected, rtol=2e-3, atol=2e-3)


def _adapter(backbone, **overrides):
    config = unreal.UnrealConfig(**{"layer": 2, "pool": 3, "retrieval_tokens": 8, "groups": 2, "c0": 2,
                                    "readout": [1, 2], **overrides})
    adapter = unreal.new_adapter(config, backbone.model.config.hidden_size)
    adapter.init_from_backbone(backbone)
    unreal.calibrate(adapter, backbone, [_text(i, 9) for i in range(6)])
    return adapter


def test_query_vectors_and_score_by_hand(tiny_engine):
    backbone = tiny_engine.backbone
    adapter = _adapter(backbone)
    with torch.no_grad():
        adapter.alpha.copy_(torch.tensor([0.25, 2.0]))
    query = unreal.UnrealQuery(backbone, adapter)
    ids = query.prefix_ids("who lit the lamp", [_text(5, 8), _text(6, 8)])
    states = query.readout(ids)  # (2 layers, R=8, 32)
    # the same states from one plain forward pass over the whole of x_ret
    emb = backbone.model.model.embed_tokens(torch.tensor([[backbone.bos_id()] + ids]))
    x = torch.cat([emb[:, :1], adapter.soft_prompt[None], emb[:, 1:], adapter.rho[None]], dim=1)
    with torch.no_grad():
        hidden = backbone.model(inputs_embeds=x, output_hidden_states=True).hidden_states
    np.testing.assert_allclose(states[0].numpy(), hidden[1][0, -8:].numpy(), rtol=1e-4, atol=1e-4)
    # q = sum_l alpha_l (q_l - mu_l) / sigma_l, then 2 groups of 4 retrieval tokens
    mixed = sum(a * (states[i] - adapter.layer_stats(lay)[0]) / adapter.layer_stats(lay)[1]
                for i, (a, lay) in enumerate(zip([0.25, 2.0], [1, 2])))
    expected_q = torch.stack([mixed[:4].mean(0), mixed[4:].mean(0)])
    with torch.no_grad():
        q = query.query_vectors(states)
    np.testing.assert_allclose(q.numpy(), expected_q.numpy(), rtol=1e-4, atol=1e-4)
    # the selector's path: stored fp16 states standardized to keys once per scope, then MaxSim
    k = np.random.default_rng(0).normal(size=(5, 3, 32)).astype(np.float16)
    mean, std = adapter.layer_stats(2)
    keys = (torch.tensor(k).float() - mean) / std
    by_hand = [sum(max(float(q[g] @ keys[i, b]) for b in range(3)) for g in range(2)) for i in range(5)]
    np.testing.assert_allclose(query.score_keys(q.numpy(), query.chunk_keys(k)), by_hand, rtol=1e-4, atol=1e-3)
    # fp32 states as input: the same keys, and the caller's states left as they were
    k32 = k.astype(np.float32)
    scope_keys = query.chunk_keys(k32)
    np.testing.assert_array_equal(k32, k.astype(np.float32))
    np.testing.assert_allclose(query.score_keys(q.numpy(), scope_keys), by_hand, rtol=1e-4, atol=1e-3)


def test_split_readout_equals_full_pass(tiny_engine):
    """Training runs the prefix once into a KV cache and only the retrieval tokens with grad."""
    backbone = tiny_engine.backbone
    query = unreal.UnrealQuery(backbone, _adapter(backbone))
    ids = query.prefix_ids("where is the key", [_text(7, 10)])
    full = query.readout(ids)
    split = query.readout(ids, grad=True, split=True)
    np.testing.assert_allclose(split.detach().numpy(), full.numpy(), rtol=1e-4, atol=1e-4)
    assert split.requires_grad


def test_adapter_round_trip(tiny_engine, tmp_path):
    adapter = _adapter(tiny_engine.backbone, tau=0.5)
    with torch.no_grad():
        adapter.alpha.copy_(torch.tensor([0.3, 0.7]))
    adapter.save(tmp_path / "a", metrics={"dev": {"recall@5": 0.5}}, command="evsel train unreal --out x")
    loaded = unreal.load_adapter(tmp_path / "a")
    assert loaded.config == adapter.config
    for name in ("soft_prompt", "rho", "alpha", "stats"):
        assert torch.equal(getattr(loaded, name), getattr(adapter, name).float())
    assert json.loads((tmp_path / "a" / "metrics.json").read_text())["dev"]["recall@5"] == 0.5
    assert (tmp_path / "a" / "command.txt").read_text().startswith("evsel train unreal")
    assert loaded.n_trainable() == unreal.param_count(adapter.config, 32) == 9 * 32 + 2


def test_missing_adapter_says_how_to_get_one(tiny_engine, tmp_path):
    from evsel.errors import ModelError

    with pytest.raises(ModelError) as err:
        unreal.default_adapter(tiny_engine.backbone)
    assert "evsel train unreal" in err.value.hint
    with pytest.raises(ModelError):
        unreal.load_adapter(tmp_path)


def test_cache_hits_skip_encoding(tiny_engine, monkeypatch):
    from evsel.store.store import ChunkRecord

    calls = []
    original = unreal.ChunkEncoder.encode

    def counting(self, texts):
        calls.append(list(texts))
        return original(self, texts)

    monkeypatch.setattr(unreal.ChunkEncoder, "encode", counting)
    texts = [_text(i, 6 + i) for i in range(5)] + [_text(0, 6)]  # the last repeats the first
    chunks = [ChunkRecord(id=i, doc_id=1, seq=i, text=t, content_hash=f"h{t}", n_tokens=0, char_start=0,
                          char_end=0) for i, t in enumerate(texts)]
    backbone, states = tiny_engine.backbone, tiny_engine.states
    first = unreal.chunk_states(backbone, states, chunks, 2, 3)
    assert sum(len(c) for c in calls) == 5  # the duplicate text encoded once
    assert np.array_equal(first[0], first[5])
    second = unreal.chunk_states(backbone, states, chunks, 2, 3)
    assert sum(len(c) for c in calls) == 5  # all cached: nothing encoded
    assert np.array_equal(first, second)
    assert tiny_engine.store.count_states(tiny_engine.backbone.fingerprint, "unreal") == 5
    unreal.chunk_states(backbone, states, chunks, 1, 3)  # another layer is another key
    assert sum(len(c) for c in calls) == 10


def test_intrinsic_scores_by_hand(tiny_engine):
    backbone = tiny_engine.backbone
    encoder = unreal.IntrinsicEncoder(backbone, [1, 2])
    texts = [_text(10, 7), _text(11, 4)]
    keys = encoder.keys(texts).astype(np.float32)  # (2, 2 layers, 2 kv heads * 8)
    query = encoder.queries(["the storm at night"])[0]  # (2 layers, 4 heads * 8)
    scores = encoder.layer_scores(query, keys)
    for n in range(2):
        for layer in range(2):
            q = query[layer].reshape(4, 8)
            k = keys[n, layer].reshape(2, 8)
            by_hand = np.mean([q[h] @ k[h // 2] for h in range(4)])  # query head h reads KV head h // 2
            assert scores[n, layer] == pytest.approx(by_hand, rel=1e-3, abs=1e-4)
    # mean of k_proj over the chunk's tokens (sink left out)
    ids = [backbone.bos_id()] + backbone.tokenizer(texts[1], add_special_tokens=False)["input_ids"]
    seen = {}
    hook = backbone.model.model.layers[0].self_attn.k_proj.register_forward_hook(
        lambda _m, _i, out: seen.setdefault("k", out))
    with torch.no_grad():
        backbone.model(torch.tensor([ids]))
    hook.remove()
    np.testing.assert_allclose(keys[1, 0], seen["k"][0, 1:].mean(0).numpy(), rtol=2e-3, atol=2e-3)


def _training_folder(folder: Path) -> Path:
    """8 chunks in 2 documents, 4 questions (the common format, written by hand)."""
    import hashlib

    folder.mkdir(parents=True, exist_ok=True)
    chunks = []
    for i in range(8):
        text = _text(100 + i, 10)
        chunks.append({"id": i, "doc": f"d{i // 4}", "seq": i % 4, "text": text,
                       "hash": hashlib.sha256(text.encode()).hexdigest(), "n_tokens": 10})
    queries = [
        {"id": f"q{n}", "source": "hand", "doc": f"d{n // 2}", "question": chunks[2 * n]["text"][:30],
         "units": [[2 * n]], "answers": [], "c0": [2 * n, 2 * n + 1], "negatives": [(2 * n + 3) % 8]}
        for n in range(4)
    ]
    (folder / "chunks.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chunks))
    (folder / "train.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    (folder / "dev.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries[:2]))
    return folder


def test_three_training_steps_lower_the_loss_on_a_fixed_batch(tiny_engine, tmp_path):
    from evsel.recipes.unreal import RunParts, TrainConfig, Trainer, load_data

    data = _training_folder(tmp_path / "data")
    config = TrainConfig(data=str(data), out=str(tmp_path / "run"), layer=2, pool=3, retrieval_tokens=8, groups=2,
                         c0=2, readout=[1, 2], batch=4, steps=3, lr=2e-3, warmup=1, dev_every=0, dev_queries=2,
                         calibrate_chunks=8, device="cpu")
    trainer = Trainer(config, RunParts(lambda: tiny_engine.backbone, lambda: tiny_engine.states, "cpu"))
    trainer.setup(*load_data(data))
    batch = trainer.train[:4]
    before = trainer.batch_loss(batch, backward=False)
    frozen = [p.clone() for p in tiny_engine.backbone.model.parameters()]
    rho = trainer.adapter.rho.detach().clone()
    summary = trainer.run()
    after = trainer.batch_loss(batch, backward=False)
    assert summary["steps"] == 3
    assert after < before
    assert not torch.equal(trainer.adapter.rho, rho)  # rho trained
    assert all(torch.equal(a, b) for a, b in zip(frozen, tiny_engine.backbone.model.parameters()))  # backbone frozen
    run = tmp_path / "run"
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "loss" in r] == [1, 2, 3]
    assert "dev_recall@5" in log[0] and "dev_recall@5" in log[-1]
    assert json.loads((run / "config.json").read_text())["steps"] == 3
    assert (run / "checkpoint" / "optimizer.pt").is_file() and (run / "best" / "adapter.safetensors").is_file()
    assert unreal.load_adapter(run / "best").config.layer == 2


def test_train_cli_resumes_from_its_checkpoint(tiny_model_dir, tmp_path):
    from evsel.cli import main

    data = _training_folder(tmp_path / "data")
    run = tmp_path / "run"
    args = ["--model", str(tiny_model_dir), "--device", "cpu", "train", "unreal", "--data", str(data),
            "--out", str(run), "--layer", "2", "--pool", "3", "--retrieval-tokens", "8", "--groups", "2",
            "--c0", "2", "--readout", "1-2", "--batch", "2", "--dev-every", "0", "--dev-queries", "2", "--json"]
    assert main(args + ["--steps", "2"]) == 0
    assert json.loads((run / "checkpoint" / "trainer.json").read_text())["step"] == 2
    assert main(args + ["--steps", "4"]) == 0  # the same run, longer: continues at step 3
    steps = [json.loads(line)["step"] for line in (run / "log.jsonl").read_text().splitlines()
             if "loss" in json.loads(line)]
    assert steps == [1, 2, 3, 4]


def test_train_cli_starts_from_another_adapter(tiny_model_dir, tmp_path, capsys):
    from evsel.cli import main

    data = _training_folder(tmp_path / "data")
    common = ["--model", str(tiny_model_dir), "--device", "cpu", "train", "unreal", "--data", str(data),
              "--pool", "3", "--retrieval-tokens", "8", "--groups", "2", "--c0", "2", "--batch", "2",
              "--dev-every", "0", "--dev-queries", "2", "--json"]
    first = tmp_path / "first"
    assert main(common + ["--out", str(first), "--layer", "2", "--readout", "1-2", "--steps", "2"]) == 0
    start = unreal.load_adapter(first / "checkpoint")
    second = tmp_path / "second"
    assert main(common + ["--out", str(second), "--layer", "2", "--readout", "1-2", "--steps", "1",
                          "--init", str(first / "checkpoint")]) == 0
    # the step-0 adapter of the second run is the first run's last one, temperature included
    step0 = unreal.load_adapter(second / "best")
    assert torch.equal(step0.rho, start.rho) and step0.config.tau == start.config.tau
    assert not torch.equal(unreal.load_adapter(second / "checkpoint").rho, start.rho)
    capsys.readouterr()
    assert main(common + ["--out", str(tmp_path / "third"), "--layer", "3", "--steps", "1",
                          "--init", str(first / "checkpoint")]) == 1
    err = capsys.readouterr().err
    assert "--init adapter has layer 2" in err and len(err.strip().splitlines()) == 1


def test_evaluation_sets_are_refused_for_training(capsys):
    from evsel.cli import main

    for source in ("locomo", "fairytaleqa-val"):
        assert main(["train", "convert", "--out", "x", "--source", source]) == 1
        err = capsys.readouterr().err
        assert "refusing to train" in err and len(err.strip().splitlines()) == 1


def test_batched_readout_equals_one_query_at_a_time(tiny_engine):
    """Queries of different lengths share one padded batch, in both the plain and the split pass."""
    backbone = tiny_engine.backbone
    query = unreal.UnrealQuery(backbone, _adapter(backbone))
    batch = [query.prefix_ids("where is the key", [_text(7, 10)]),
             query.prefix_ids("who rang the bell in the tower at night", [_text(8, 3), _text(9, 14)])]
    alone = [query.readout_batch([ids])[0] for ids in batch]
    together = query.readout_batch(batch)
    split = query.readout_batch(batch, grad=True, split=True)
    for i in range(2):
        np.testing.assert_allclose(together[i].numpy(), alone[i].numpy(), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(split[i].detach().numpy(), alone[i].numpy(), rtol=1e-4, atol=1e-4)
    vectors = query.encode_questions([("where is the key", [_text(7, 10)])])
    assert vectors.shape == (1, 2, 32)


def test_ingest_computes_states_for_the_adapter_in_use(tiny_engine, tmp_path):
    story = tmp_path / "story.txt"
    story.write_text("\n\n".join(_text(200 + i, 40) + "." for i in range(6)), encoding="utf-8")
    fingerprint = tiny_engine.backbone.fingerprint
    # no adapter for this backbone: nothing to compute, and the file is still ingested
    result = tiny_engine.ingest([str(story)], encode=True)
    assert result[0]["status"] == "ingested"
    assert tiny_engine.store.count_states(fingerprint, "unreal") == 0
    _adapter(tiny_engine.backbone, layer=1, readout=[1]).save(tmp_path / "adapter")
    tiny_engine.settings = tiny_engine.settings.with_(  # EVSEL_UNREAL_ADAPTER; a book default that reads UNREAL
        unreal_adapter=str(tmp_path / "adapter"), hybrid_weights=plant_defaults(tmp_path / "weights", book="unreal"))
    story.write_text(story.read_text(encoding="utf-8") + "\n\nthe end.", encoding="utf-8")
    events = []
    result = tiny_engine.ingest([str(story)], encode=True, on_event=events.append)
    n_chunks = result[0]["chunks"]
    hashes = {c.content_hash for c in tiny_engine.store.chunks()}
    assert tiny_engine.store.count_states(fingerprint, "unreal") == len(hashes) > 0 and n_chunks >= len(hashes)
    assert any(e.get("task") == "encode" for e in events)  # a progress bar for the encoding
    assert tiny_engine.store.get_states(fingerprint, "unreal", unreal.state_key(1, 3), hashes).keys() == hashes
    story.write_text(story.read_text(encoding="utf-8") + " again", encoding="utf-8")
    tiny_engine.ingest([str(story)], encode=False)  # --no-encode: the new last chunk gets no state
    now = {c.content_hash for c in tiny_engine.store.chunks()}
    kept = tiny_engine.store.get_states(fingerprint, "unreal", unreal.state_key(1, 3), now).keys()
    assert len(now - kept) == 1
    assert tiny_engine.store.count_states(fingerprint, "unreal") == len(kept)  # the replaced chunk's state went with it


def test_recipes_name_only_known_settings():
    from dataclasses import fields

    from evsel.recipes.unreal import DataConfig, TrainConfig, recipe

    known = {f.name for f in fields(TrainConfig)} | {f.name for f in fields(DataConfig)}
    for name in ("smoke", "full"):
        assert set(recipe(name)) <= known, set(recipe(name)) - known
    assert recipe("full")["layer"] == unreal.load_adapter(unreal.shipped_adapter_dir(
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53")).config.layer


def test_smoke_recipe_converts_and_trains(tiny_model_dir, tmp_path, capsys):
    """`evsel train unreal --recipe smoke` from nothing: FairytaleQA train converted, trained, adapter written."""
    from helpers import shared_data

    from evsel.cli import main

    shared_data("fairytaleqa")
    run = tmp_path / "smoke"
    smoke = ["--model", str(tiny_model_dir), "--device", "cpu", "train", "unreal", "--recipe", "smoke",
             "--out", str(run), "--json"]
    assert main(smoke) == 1  # the recipe's layer 6 is beyond the tiny model's 2: one clear line
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "within the model's 1..2" in err[0] and "unexpected" not in err[0]
    assert main(smoke + ["--layer", "2", "--pool", "3"]) == 0
    meta = json.loads((run / "data" / "meta.json").read_text())
    assert meta["config"]["sources"] == ["fairytaleqa-train"] and meta["counts"]["fairytaleqa-train"]["documents"] == 5
    assert json.loads((run / "checkpoint" / "trainer.json").read_text())["step"] == 6
    assert unreal.load_adapter(run / "best").config.layer == 2


def test_compiled_chunk_states_match_eager_within_bf16_rounding(tiny_model_dir):
    """torch.compile of the decoder layers (ChunkEncoder(compiled=True)) fuses norms, RoPE and
    activations, so bf16 results round differently: pooled states stay within 2% relative L2 of
    eager ones per chunk, and rank the chunks the same by MaxSim against a query."""
    from evsel.engine import Engine

    backbone = Engine(model=str(tiny_model_dir), device="cpu").backbone
    texts = [_text(40 + i, 5 + 3 * i) for i in range(8)]
    before = [layer.forward for layer in backbone.model.model.layers]
    eager = unreal.ChunkEncoder(backbone, [2], pool=3).encode(texts)[2].astype(np.float32)
    compiled = unreal.ChunkEncoder(backbone, [2], pool=3, compiled=True).encode(texts)[2].astype(np.float32)
    assert [layer.forward for layer in backbone.model.model.layers] == before  # swapped back
    error = np.linalg.norm(compiled - eager, axis=-1) / np.linalg.norm(eager, axis=-1)
    assert error.max() <= 0.02, error.max()
    query = eager[3, :2]  # (G=2, d): two of one chunk's own vectors
    want, got = unreal.maxsim(query, eager), unreal.maxsim(query, compiled)
    assert list(np.argsort(-want)[:3]) == list(np.argsort(-got)[:3])
