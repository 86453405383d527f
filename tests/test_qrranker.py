"""QRRanker (seed 003) on a tiny random Llama with SmolLM2's head grouping (6 query heads over 2 KV
heads, so query head h reads KV head h // 3; tests/fixtures_tiny.py), loaded through the real Backbone: head scores
against an explicit eager-attention computation (output_attentions) for both encodings, the
block-sparse encoder against an explicit masked full-attention pass, calibration and trimming by
hand, head detection writing a valid head list; and one end-to-end check with the real model."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from evsel.models.shared import blocksparse
from evsel.models.shared import lora
from evsel.models.qrranker import rerank as qr

from fixtures_tiny import WORDS


def _eager(backbone):
    ref = copy.deepcopy(backbone.model)
    ref.set_attn_implementation("eager")
    return ref


def _text(seed: int, n: int) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(rng.choice(WORDS[:24], size=n))


TEXTS = [_text(1, 9), _text(2, 4), _text(3, 13), _text(4, 6), _text(5, 1)]
QUESTION = "who killed the keeper ?"
HEADS = [(0, 4), (1, 0), (1, 5), (2, 2)]


def _reference_attention(ref, ids: list[int], rows: range, mask=None, positions=None) -> list:
    """Per layer (H, T) attention of `rows` averaged, from the eager model's own attention maps."""
    x = torch.tensor([ids])
    kwargs = {}
    if mask is not None:
        kwargs.update(attention_mask=mask, position_ids=positions)
    with torch.no_grad():
        out = ref(input_ids=x, output_attentions=True, **kwargs)
    return [a[0][:, list(rows)].mean(dim=1) for a in out.attentions], out


def _reference_scores(per_layer_real, per_layer_null, spans, heads):
    n = min(per_layer_real[0].shape[-1], per_layer_null[0].shape[-1])  # the shared context (QRHead aligns so)
    per_token = sum(per_layer_real[l][h][:n] - per_layer_null[l][h][:n] for l, h in heads)
    out = []
    for a, b in spans:
        v = per_token[a:b]
        keep = v > v.mean() - 2 * v.std()  # unbiased std
        out.append(float((v * keep).sum()))
    return np.array(out)


def _causal_pieces(prompt, texts, question):
    prefix = prompt.prefix()
    ids, spans = list(prefix), []
    for i, t in enumerate(texts):
        block, start = prompt.candidate(i + 1, t)
        spans.append((len(ids) + start, len(ids) + len(block)))
        ids += block
    suffix, s0 = prompt.suffix(question)
    return ids, spans, suffix, s0


def test_causal_head_scores_equal_eager_attention(tiny_backbone):
    scorer = qr.QRScorer(tiny_backbone, HEADS, qr.ScorerConfig(encoding="causal"))
    got = scorer.scores(QUESTION, TEXTS)

    ref = _eager(tiny_backbone)
    ctx, spans, suffix, s0 = _causal_pieces(scorer.prompt, TEXTS, QUESTION)
    null_suffix, n0 = scorer.prompt.suffix("N/A")
    real, _ = _reference_attention(ref, ctx + suffix, range(len(ctx) + s0, len(ctx) + len(suffix)))
    null, _ = _reference_attention(ref, ctx + null_suffix, range(len(ctx) + n0, len(ctx) + len(null_suffix)))
    want = _reference_scores(real, null, spans, HEADS)
    assert np.allclose(got, want, atol=1e-5, rtol=1e-4)
    # every head's own score (detection) agrees too
    per_head = scorer.all_head_scores(QUESTION, TEXTS)
    for layer, head in HEADS:
        assert np.allclose(per_head[:, layer, head], _reference_scores(real, null, spans, [(layer, head)]),
                           atol=1e-5, rtol=1e-4)


def _block_reference(scorer, texts, question, memory=None, labels="slot"):
    """The block-sparse prompt as one explicit sequence: hand-built mask and position ids. The
    prefix is causal; every block (the memory block first, when given; it is no candidate's span)
    sees the prefix and itself, positions restarting after the prefix; the suffix sees everything."""
    prompt = scorer.prompt
    prefix = prompt.prefix()
    p = len(prefix)
    blocks = [prompt.candidate(i + 1 if labels == "slot" else 1, t) for i, t in enumerate(texts)]
    lead = [(prompt.memory_block(memory), 0)] if memory else []
    suffix, s0 = prompt.suffix(question)
    ids, positions, owner, spans = list(prefix), list(range(p)), [-1] * p, []
    for i, (block, start) in enumerate(lead + blocks):
        if i >= len(lead):
            spans.append((len(ids) + start, len(ids) + len(block)))
        ids += block
        positions += list(range(p, p + len(block)))
        owner += [i] * len(block)
    q0 = p + max(len(b) for b, _ in lead + blocks)
    ctx_len = len(ids)
    ids += suffix
    positions += list(range(q0, q0 + len(suffix)))
    owner += [-2] * len(suffix)
    t = len(ids)
    allowed = torch.zeros(t, t, dtype=torch.bool)
    for r in range(t):
        for c in range(r + 1):
            if owner[r] == -1 or owner[r] == -2:  # prefix: causal; suffix: everything before it
                allowed[r, c] = True
            else:  # a block: the prefix and itself
                allowed[r, c] = owner[c] == -1 or owner[c] == owner[r]
    mask = torch.zeros(1, 1, t, t).masked_fill(~allowed, torch.finfo(torch.float32).min)
    return ids, torch.tensor([positions]), mask, spans, ctx_len, s0, p


def test_block_sparse_encoding_equals_masked_full_attention(tiny_backbone):
    scorer = qr.QRScorer(tiny_backbone, HEADS, qr.ScorerConfig(encoding="block", batch_tokens=24,  # several batches
                                                                block_labels="slot"))
    ref = _eager(tiny_backbone)
    ids, positions, mask, spans, ctx_len, s0, p = _block_reference(scorer, TEXTS, QUESTION)
    with torch.no_grad():
        out = ref(input_ids=torch.tensor([ids]), attention_mask=mask, position_ids=positions, use_cache=True,
                  output_attentions=True)
    # (b) each block's K/V equal the explicit computation's
    prefix_kv = blocksparse.encode_prefix(scorer.model, ids[:p], 3)
    blocks = [scorer.prompt.candidate(i + 1, t)[0] for i, t in enumerate(TEXTS)]
    states = blocksparse.encode_blocks(scorer.model, prefix_kv, blocks, batch_tokens=24)
    at = p
    for i, block in enumerate(blocks):
        for layer in range(3):
            k_ref = out.cache.layers[layer].keys[0, :, at:at + len(block)]
            v_ref = out.cache.layers[layer].values[0, :, at:at + len(block)]
            assert torch.allclose(states.blocks[i][layer][0], k_ref, atol=1e-5)
            assert torch.allclose(states.blocks[i][layer][1], v_ref, atol=1e-5)
        at += len(block)
    # ... and the head scores equal those read from the explicit pass's attention maps
    got = scorer.scores(QUESTION, TEXTS)
    real = [a[0][:, ctx_len + s0:].mean(dim=1) for a in out.attentions]
    null_ids, null_pos, null_mask, _, _, n0, _ = _block_reference(scorer, TEXTS, "N/A")
    null, _ = _reference_attention(ref, null_ids, range(ctx_len + n0, len(null_ids)), null_mask, null_pos)
    want = _reference_scores(real, null, spans, HEADS)
    assert np.allclose(got, want, atol=1e-5, rtol=1e-4)


def test_block_sparse_is_order_free_but_causal_is_not(tiny_backbone):
    block = qr.QRScorer(tiny_backbone, HEADS, qr.ScorerConfig(encoding="block"))  # every block labelled [1]
    slot = qr.QRScorer(tiny_backbone, HEADS, qr.ScorerConfig(encoding="block", block_labels="slot"))
    causal = qr.QRScorer(tiny_backbone, HEADS, qr.ScorerConfig(encoding="causal"))
    texts = [_text(10 + i, 5 + i % 4) for i in range(8)]
    # a block's states do not depend on the other blocks
    prompt = block.prompt
    kv = blocksparse.encode_prefix(block.model, prompt.prefix(), 3)
    one = blocksparse.encode_blocks(block.model, kv, [prompt.candidate(1, texts[0])[0]])
    many = blocksparse.encode_blocks(block.model, kv, [prompt.candidate(1, texts[0])[0]] +
                            [prompt.candidate(1, t)[0] for t in texts[1:]])
    assert torch.allclose(one.blocks[0][2][0], many.blocks[0][2][0], atol=1e-6)
    b = qr.order_correlation(block.scores, QUESTION, texts, seed=1)
    s = qr.order_correlation(slot.scores, QUESTION, texts, seed=1)
    c = qr.order_correlation(causal.scores, QUESTION, texts, seed=1)
    assert set(b) == {"pearson", "spearman"}
    assert b["pearson"] > 0.99999 and b["spearman"] == 1.0  # the same scores in any order
    assert c["pearson"] < 0.999 and -1 <= s["pearson"] <= 1  # causal (and slot labels) depend on the order
    # the second order reused every block's cached KV
    assert block.kv_cache.hits >= len(texts)


def test_block_kv_cache_bounds_its_bytes():
    cache = blocksparse.BlockStateCache(max_bytes=3 * 64)
    kv = [(torch.zeros(4, 4), torch.zeros(4, 4))]  # 2 x 16 floats = 128 bytes
    small = [(torch.zeros(2, 2), torch.zeros(2, 2))]  # 32 bytes
    cache.put("a", small)
    cache.put("b", kv)
    assert len(cache) == 2 and cache.bytes == 160
    cache.put("c", small)  # 192: still fits
    cache.get("a")  # a is now the most recent
    cache.put("d", small)  # over: b (least recently used) goes
    assert cache.get("b") is None and cache.get("a") is not None and cache.bytes <= 3 * 64


def test_truncation_changes_cost_not_scores(tiny_backbone):
    heads = [(0, 1), (1, 3)]  # deepest layer 1: the pass stops after two of three layers
    short = qr.QRScorer(tiny_backbone, heads, qr.ScorerConfig(encoding="block"))
    full = qr.QRScorer(tiny_backbone, heads, qr.ScorerConfig(encoding="block", truncate=False))
    assert short.depth == 2 and full.depth == 3
    assert np.allclose(short.scores(QUESTION, TEXTS), full.scores(QUESTION, TEXTS), atol=1e-6)
    ctx = short.contexts(TEXTS)[0][1]
    assert len(ctx.kv) == 2


@pytest.mark.parametrize("adapted", [False, True], ids=["heads", "adapter"])
def test_shared_suffix_tokens_run_once_and_score_as_one_padded_batch(tiny_backbone, monkeypatch, adapted):
    """The question's and the null query's suffixes share their leading tokens (separator, closing
    instruction, label): run once, then each suffix's rest, with SDPA reading the KV heads as they
    are and only the selected heads' rows built, they score as the padded batch of whole suffixes
    over copied KV heads with every head's rows does."""
    adapter = _adapter(tiny_backbone) if adapted else None
    scorer = qr.QRScorer(tiny_backbone, HEADS, qr.ScorerConfig(encoding="block"), adapter=adapter)
    suffixes = scorer.suffixes(QUESTION)
    shared = blocksparse.leading_shared(suffixes)
    assert shared >= 2 and suffixes[0][0][:shared] == suffixes[1][0][:shared]
    assert suffixes[0][0][shared] != suffixes[1][0][shared]
    once = scorer.scores(QUESTION, TEXTS)
    monkeypatch.setattr(blocksparse, "SHARE_LEADING", False)
    monkeypatch.setattr(blocksparse, "GQA_SDPA", False)
    monkeypatch.setattr(qr, "READ_HEADS_ONLY", False)
    batch = qr.QRScorer(tiny_backbone, HEADS, qr.ScorerConfig(encoding="block"), adapter=adapter)
    assert np.allclose(once, batch.scores(QUESTION, TEXTS), atol=1e-6, rtol=1e-5)


def test_calibration_and_trimming_by_hand():
    # one layer, two heads, 8 context tokens; candidates at tokens 1..5 and 5..8
    real = {0: torch.tensor([[0.50, 0.10, 0.12, 0.11, 0.09, 0.02, 0.03, 0.03],
                             [0.40, 0.05, 0.05, 0.05, 0.05, 0.10, 0.20, 0.10]])}
    null = {0: torch.tensor([[0.60, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.10],
                             [0.50, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.20]])}
    cal = qr.calibrated(real, null)
    assert torch.allclose(cal[0][0], torch.tensor([-0.10, 0.05, 0.07, 0.06, 0.04, -0.03, -0.02, -0.07]))
    spans = [(1, 5), (5, 8)]
    # head 0 alone: [0.05, 0.07, 0.06, 0.04] mean 0.055, std 0.0129 -> nothing below 0.029: 0.22;
    # [-0.03, -0.02, -0.07] all kept (threshold -0.083): -0.12
    assert np.allclose(qr.chunk_scores(cal, spans, [(0, 0)]), [0.22, -0.12])
    # both heads: per token [0.05, 0.07, 0.06, 0.04] and [0.02, 0.13, -0.17]
    assert np.allclose(qr.chunk_scores(cal, spans, [(0, 0), (0, 1)]), [0.22, -0.02])
    # an outlier is dropped: 9 tokens of 1.0 and one of -5 -> mean 0.4, std 1.897, threshold -3.39
    values = torch.tensor([1.0] * 9 + [-5.0])
    assert float(qr.trimmed_sum(values)) == pytest.approx(9.0)
    assert float(qr.trimmed_sum(torch.tensor([-5.0]))) == -5.0  # a single token is kept
    per_head = qr.head_scores(cal, spans)
    assert per_head.shape == (2, 1, 2) and np.allclose(per_head[:, 0, 0], [0.22, -0.12])


def test_groups_share_the_prefix_and_fit_the_window(tiny_backbone):
    assert qr.groups_for([10, 10, 10, 10], fixed=5, window=100) == [[0, 1, 2, 3]]
    assert qr.groups_for([10, 10, 10, 10, 10], fixed=5, window=30) == [[0, 1], [2, 3], [4]]
    texts = [_text(20 + i, 12) for i in range(6)]
    for encoding in qr.ENCODINGS:
        small = qr.QRScorer(tiny_backbone, HEADS, qr.ScorerConfig(encoding=encoding, window=160))
        groups = small.contexts(texts)
        assert len(groups) > 1 and sorted(i for g, _ in groups for i in g) == list(range(6))
        assert np.isfinite(small.scores(QUESTION, texts)).all()


def test_head_lists(tmp_path):
    assert qr.parse_heads("14-3, 17-0") == [(14, 3), (17, 0)]
    assert qr.format_heads([(14, 3), (17, 0)]) == "14-3,17-0"
    from evsel.errors import ModelError

    with pytest.raises(ModelError):
        qr.parse_heads("14:3")


# ---------------------------------------------------------------------------------------------
# head detection


def _valid_head_list(data: dict, n_layers: int, n_heads: int, keep: int) -> None:
    assert data["format"] == qr.HEADS_FORMAT
    for encoding, heads in data["by_encoding"].items():
        assert encoding in qr.ENCODINGS and len(heads) == keep
        pairs = [(h["layer"], h["head"]) for h in heads]
        assert len(set(pairs)) == keep
        assert all(0 <= l < n_layers and 0 <= h < n_heads for l, h in pairs)
        scores = [h["score"] for h in heads]
        assert scores == sorted(scores, reverse=True)
        full = np.array(data["scores"][encoding])
        assert full.shape == (n_layers, n_heads)
        assert scores[0] == pytest.approx(full.max())  # the best head of all is kept first
    assert data["heads"] == data["by_encoding"][data["encoding"]]
    assert qr.heads_of(data, "causal") == [(h["layer"], h["head"]) for h in data["by_encoding"]["causal"]]


def test_detection_scores_heads_by_gold_mass(tiny_backbone):
    from evsel.recipes import qrranker as recipe

    items = [{"id": f"q{i}", "question": QUESTION if i % 2 else "where is the lamp ?",
              "texts": [_text(30 + i * 5 + j, 4 + j) for j in range(5)], "gold": [i % 5]} for i in range(4)]
    config = recipe.DetectConfig(keep=5)
    data = recipe.detect(config, tiny_backbone, items=items)
    _valid_head_list(data, 3, 6, 5)
    assert data["seed_set"]["questions"] == 4
    # the QR score of a head is its mean calibrated mass on the gold candidates
    scorer = qr.QRScorer(tiny_backbone, None, qr.ScorerConfig(encoding="block", truncate=False))
    mass = np.mean([scorer.all_head_scores(it["question"], it["texts"])[it["gold"]].sum(axis=0) for it in items], axis=0)
    assert np.allclose(np.array(data["scores"]["block"]), mass, atol=1e-6)


def test_detect_cli_writes_a_head_list_and_refuses_eval_sets(gqa_model_dir, tmp_path, capsys, monkeypatch):
    import sys

    from helpers import shared_data
    from evsel.cli import main

    shared_data("fairytaleqa", "questions", "train")
    out = tmp_path / "heads"
    args = ["--model", str(gqa_model_dir), "--device", "cpu", "train", "qrranker", "--detect-heads",
            "--out", str(out), "--documents", "1", "--questions-per-document", "2", "--keep", "4", "--json"]
    monkeypatch.setattr(sys, "argv", ["evsel", *args])  # the command recorded in heads.json
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    data = json.loads((out / "heads.json").read_text())
    _valid_head_list(data, 3, 6, 4)
    assert summary["questions"] == data["seed_set"]["questions"] >= 1
    assert data["seed_set"]["sources"]["fairytaleqa-train"]["documents"] == 1
    assert "train qrranker --detect-heads" in data["command"]
    for source in ("locomo", "fairytaleqa-val"):
        assert main(args[:-1] + ["--source", source]) == 1
        assert "refusing" in capsys.readouterr().err
    # the selector reads a heads.json given by EVSEL_QRRANKER_HEADS
    from evsel.models.runtime.backbone import Backbone

    backbone = Backbone(str(gqa_model_dir), "cpu")
    heads, where = qr.resolve_heads(backbone, str(out), "block")
    assert heads == [(h["layer"], h["head"]) for h in data["by_encoding"]["block"]] and where == str(out)
    assert qr.resolve_heads(backbone, "0-1,2-5")[0] == [(0, 1), (2, 5)]


def test_selector_reranks_with_heads_from_the_settings(gqa_model_dir):
    from evsel.models.runtime.backbone import Backbone
    from evsel.models.selectors import SelectorContext, get_selector
    from evsel.settings import Settings
    from evsel.store.store import ChunkRecord

    backbone = Backbone(str(gqa_model_dir), "cpu")
    context = SelectorContext(load_backbone=lambda: backbone, states=None,
                              settings=Settings(qrranker_heads="0-4,1-0,1-5,2-2"))
    selector = get_selector("qrranker", context)
    assert selector.needs_model and selector.heads == HEADS
    chunks = [ChunkRecord(id=i + 1, doc_id=1, seq=i, text=t, content_hash=str(i), n_tokens=len(t.split()),
                          char_start=0, char_end=len(t)) for i, t in enumerate(TEXTS)]
    ranked = selector.rank(QUESTION, chunks)
    assert sorted(s.chunk.id for s in ranked) == [1, 2, 3, 4, 5]
    want = qr.QRScorer(backbone, HEADS).scores(QUESTION, TEXTS)
    assert [s.chunk.id for s in ranked] == [int(i) + 1 for i in np.argsort(-want, kind="stable")]
    # a second selector of the same engine shares the per-block KV: nothing is encoded again
    again = get_selector("qrranker", context)
    before = again.scorer.kv_cache.misses
    again.rank(QUESTION, chunks)
    assert again.scorer.kv_cache.misses == before


def test_settings_read_the_head_list(tmp_path):
    from evsel.settings import Settings

    assert Settings.resolve(env={"EVSEL_QRRANKER_HEADS": "14-3, 17-0"}, cwd=tmp_path).qrranker_heads == "14-3, 17-0"
    assert Settings.resolve(env={"EVSEL_QRRANKER_HEADS": "run/heads"}, cwd=tmp_path).qrranker_heads == \
        str(tmp_path / "run" / "heads")


# ---------------------------------------------------------------------------------------------
# training: the LoRA adapter on the read layers' q/k, applied inside scoring only


def trained_looking(adapter, seed: int, scale: float):
    """`adapter` with random B matrices (B starts at zero, which changes nothing)."""
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in adapter.params.items():
            if name.endswith("lora_B"):
                p.copy_(torch.randn(p.shape, generator=g) * scale)
    return adapter


def _adapter(backbone, heads=HEADS, seed=0, nonzero=True):
    adapter = qr.new_adapter(backbone.model, heads, rank=4, alpha=8.0, seed=seed)
    return trained_looking(adapter, seed, 0.5) if nonzero else adapter


def _items(n=3):
    return [{"id": f"q{i}", "question": QUESTION if i % 2 == 0 else "where is the lamp ?",
             "texts": [_text(50 + 7 * i + j, 3 + (i + j) % 5) for j in range(6)], "gold": [i % 6]} for i in range(n)]


def _groups(items):
    return [{"id": it["id"], "texts": it["texts"], "questions": [{
        "id": it["id"], "question": it["question"], "candidates": list(range(len(it["texts"]))), "rest": [],
        "units": [[g] for g in it["gold"]], "gold": it["gold"]}]} for it in items]


def _trainer(backbone, out, steps=3, lr=5e-2, **kwargs):
    from evsel.recipes import qrranker as recipe

    config = recipe.TrainConfig(out=str(out), steps=steps, batch=3, lr=lr, warmup=1, rank=4, alpha=8.0, dev_every=0,
                                checkpoint_every=1, **kwargs)
    trainer = recipe.ListwiseTrainer(config, backbone)
    groups = _groups(_items())
    trainer.setup(groups, groups[:1], HEADS, None)
    return trainer


def test_adapter_scores_equal_a_scorer_with_the_lora_in_the_read_projections(tiny_backbone):
    """The adapter's scores equal an explicit computation: eager attention maps of a model whose
    read layers' q_proj / k_proj carry the LoRA delta, in those layers only (the layers above
    still get the frozen model's hidden states, so the explicit pass reads each layer's maps from
    a model patched at that layer alone)."""
    adapter = _adapter(tiny_backbone)
    got = qr.QRScorer(tiny_backbone, HEADS, qr.ScorerConfig(encoding="causal"), adapter=adapter).scores(QUESTION, TEXTS)
    plain = qr.QRScorer(tiny_backbone, HEADS, qr.ScorerConfig(encoding="causal")).scores(QUESTION, TEXTS)
    assert not np.allclose(got, plain, atol=1e-4)
    prompt = blocksparse.Prompt(tiny_backbone.tokenizer)
    ctx, spans, suffix, s0 = _causal_pieces(prompt, TEXTS, QUESTION)
    null_suffix, n0 = prompt.suffix("N/A")
    real, null = [None] * 3, [None] * 3
    for layer in sorted({l for l, _ in HEADS}):
        ref = _eager(tiny_backbone)
        attn = ref.model.layers[layer].self_attn
        for proj in ("q", "k"):
            module = getattr(attn, f"{proj}_proj")
            module.register_forward_hook(lambda _m, args, out, proj=proj, layer=layer:
                                         out + adapter.delta(layer, proj, args[0]).to(out.dtype))
        with torch.no_grad():
            r, _ = _reference_attention(ref, ctx + suffix, range(len(ctx) + s0, len(ctx) + len(suffix)))
            n, _ = _reference_attention(ref, ctx + null_suffix, range(len(ctx) + n0, len(ctx) + len(null_suffix)))
        real[layer], null[layer] = r[layer], n[layer]
    want = _reference_scores(real, null, spans, HEADS)
    assert np.allclose(got, want, atol=1e-5, rtol=1e-4)
    # block encoding: the training path (features read once, the adapter applied on top) gives
    # the scorer's scores
    block = qr.QRScorer(tiny_backbone, HEADS, qr.ScorerConfig(encoding="block"), adapter=adapter)
    states, starts = block.block_states(TEXTS)
    read = blocksparse.read_states(states.context(spans=starts), block.layers).detached()
    ((_, context),) = block.contexts(TEXTS)
    suffix_states = [s.detached() for s in block.suffix_states(QUESTION, context)]
    cal = qr.calibrated(*blocksparse.head_attention(tiny_backbone.model, read, suffix_states, block.layers, adapter))
    assert np.allclose(qr.chunk_score_tensor(cal, context.spans, HEADS).detach().numpy(),
                       block.scores(QUESTION, TEXTS), atol=1e-6)


def test_listwise_loss_is_the_seeds():
    scores = torch.tensor([0.1, 0.5, 0.3, -0.2])
    s = (scores - scores.min()) / (scores.max() - scores.min()) * 8  # [2.67, 8, 5.33, 0]
    neg = torch.exp(s[[0, 3]]).sum()
    want = -0.5 * (torch.log(torch.exp(s[1]) / (torch.exp(s[1]) + neg)) +
                   torch.log(torch.exp(s[2]) / (torch.exp(s[2]) + neg)))
    assert float(qr.listwise_loss(scores, [1, 2])) == pytest.approx(float(want), rel=1e-5)
    assert float(qr.listwise_loss(scores * 10, [1, 2])) == pytest.approx(float(want), rel=1e-5)  # scale-free


def test_three_training_steps_lower_the_loss_on_a_fixed_batch(tiny_backbone, tmp_path):
    trainer = _trainer(tiny_backbone, tmp_path / "run")
    batch = [q for _, q in trainer.train]

    def loss() -> float:
        with torch.no_grad():
            return float(sum(trainer.loss(q) for q in batch)) / len(batch)

    before = loss()
    for _ in range(3):
        trainer.optimizer.zero_grad()
        for q in batch:
            (trainer.loss(q) / len(batch)).backward()
        trainer.optimizer.step()
    assert loss() < before
    # only the adapter moved: the backbone's weights have no gradient
    assert all(p.grad is None for p in tiny_backbone.model.parameters())


def test_training_resumes_from_its_checkpoint_and_writes_an_adapter(tiny_backbone, tmp_path):
    out = tmp_path / "run"
    whole = _trainer(tiny_backbone, tmp_path / "whole", steps=4).run()
    first = _trainer(tiny_backbone, out, steps=4, minutes=0.0)  # stops at once: a checkpoint at step 0
    first.run()
    assert json.loads((out / "checkpoint" / "trainer.json").read_text())["step"] == 0
    second = _trainer(tiny_backbone, out, steps=4)
    second.config.checkpoint_every = 2
    save = second.save_checkpoint

    def killed_after_saving() -> None:  # the process dies right after the step-2 checkpoint
        save()
        raise KeyboardInterrupt

    second.save_checkpoint = killed_after_saving
    with pytest.raises(KeyboardInterrupt):
        second.run()
    third = _trainer(tiny_backbone, out, steps=4)
    assert third.step == 2  # resumed
    third.run()
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "loss" in r] == [1, 2, 3, 4]
    wlog = [json.loads(line) for line in (tmp_path / "whole" / "log.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in log if "loss" in r] == pytest.approx([r["loss"] for r in wlog if "loss" in r], rel=1e-4)
    assert whole["steps"] == 4
    for name in (lora.ADAPTER_FILE, lora.ADAPTER_CONFIG, qr.HEADS_FILE, "metrics.json"):
        assert (out / name).is_file()
    assert "dev_recall@3" in log[0] and "bm25_dev" in log[0]
    adapter = qr.load_adapter(out, tiny_backbone.model)
    assert adapter.config.heads == [list(h) for h in HEADS] and not adapter.parameters()[0].requires_grad
    assert qr.heads_of(qr.load_head_file(out)) == HEADS


def test_an_adapter_leaves_the_answering_backbone_untouched(gqa_model_dir, tmp_path):
    from evsel.models.runtime.backbone import Backbone
    from evsel.models.selectors import SelectorContext, get_selector
    from evsel.settings import Settings
    from evsel.store.store import ChunkRecord

    backbone = Backbone(str(gqa_model_dir), "cpu")
    backbone.model.float()
    folder = tmp_path / "trained"
    _adapter(backbone).save(folder)
    (folder / qr.HEADS_FILE).write_text(json.dumps({"format": qr.HEADS_FORMAT, "encoding": "block",
                                                    "heads": [{"layer": l, "head": h} for l, h in HEADS]}))
    ids = torch.tensor([[1, 5, 6, 7, 8, 9, 10]])
    with torch.no_grad():
        before = backbone.model(input_ids=ids).logits.clone()
        generated = backbone.model.generate(ids, max_new_tokens=5, do_sample=False)
    weights = {k: v.clone() for k, v in backbone.model.state_dict().items()}
    context = SelectorContext(load_backbone=lambda: backbone, states=None,
                              settings=Settings(qrranker_heads=str(folder / qr.HEADS_FILE)))
    selector = get_selector("qrranker", context)
    assert selector.adapter is not None and selector.adapter_from == str(folder)
    chunks = [ChunkRecord(id=i + 1, doc_id=1, seq=i, text=t, content_hash=str(i), n_tokens=len(t.split()),
                          char_start=0, char_end=len(t)) for i, t in enumerate(TEXTS)]
    trained = [s.score for s in selector.rank(QUESTION, chunks)]
    untrained = get_selector("qrranker", SelectorContext(load_backbone=lambda: backbone, states=None,
                                                         settings=Settings(qrranker_heads="0-4,1-0,1-5,2-2")))
    assert untrained.adapter is None
    assert sorted(trained) != pytest.approx(sorted(s.score for s in untrained.rank(QUESTION, chunks)))
    with torch.no_grad():
        after = backbone.model(input_ids=ids).logits
        assert torch.equal(before, after)
        assert torch.equal(generated, backbone.model.generate(ids, max_new_tokens=5, do_sample=False))
    assert all(torch.equal(v, weights[k]) for k, v in backbone.model.state_dict().items())
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in backbone.model.modules())


def test_building_a_pipeline_loads_nothing_and_load_loads_the_model_and_adapter(gqa_model_dir, tmp_path,
                                                                                monkeypatch):
    """ask times `Pipeline.load()` as "loading the model": the reranker's backbone weights and
    adapter are read there, once, not when the pipeline is built."""
    from evsel.models.runtime.backbone import Backbone
    from evsel.models.selectors import SelectorContext
    from evsel.pipeline import Pipeline, PipelineSpec
    from evsel.settings import Settings

    folder = tmp_path / "trained"
    _adapter(Backbone(str(gqa_model_dir), "cpu")).save(folder)
    (folder / qr.HEADS_FILE).write_text(json.dumps({"format": qr.HEADS_FORMAT, "encoding": "block",
                                                    "heads": [{"layer": l, "head": h} for l, h in HEADS]}))
    backbone = Backbone(str(gqa_model_dir), "cpu")
    read = []
    real = qr.load_adapter
    monkeypatch.setattr(qr, "load_adapter", lambda where, model: read.append(where) or real(where, model))
    context = SelectorContext(load_backbone=lambda: backbone, states=None,
                              settings=Settings(qrranker_heads=str(folder / qr.HEADS_FILE)))
    pipeline = Pipeline(PipelineSpec.parse("bm25>qrranker"), context)
    assert pipeline.needs_model and not backbone.loaded and read == []
    pipeline.load()
    assert backbone.loaded and read == [folder]
    assert pipeline.reranker.adapter_from == str(folder) and pipeline.reranker.heads == HEADS
    pipeline.load()
    assert read == [folder]  # once


def test_train_cli_smoke_on_a_tiny_model(gqa_model_dir, tmp_path, capsys, monkeypatch):
    import sys

    from helpers import shared_data
    from evsel.cli import main

    shared_data("fairytaleqa", "questions", "train")
    out = tmp_path / "qr"
    args = ["--model", str(gqa_model_dir), "--device", "cpu", "train", "qrranker", "--recipe", "smoke",
            "--out", str(out), "--heads", "0-4,1-0,1-5,2-2", "--stories", "1", "--steps", "2", "--json"]
    monkeypatch.setattr(sys, "argv", ["evsel", *args])
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 2 and "recall@3" in summary["dev_bm25"]
    assert (out / lora.ADAPTER_FILE).is_file() and (out / "checkpoint" / lora.ADAPTER_FILE).is_file()
    assert "train qrranker --recipe smoke" in (out / "command.txt").read_text()
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [0, 1, 2] and all(np.isfinite(r["loss"]) for r in log[1:])
    assert main(args[:-1] + ["--source", "locomo"]) == 1
    assert "refusing" in capsys.readouterr().err


def test_training_runs_on_cuda_with_the_backbone(gqa_model_dir, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: torch.cuda.is_available() is False on this machine, so GPU training "
                    "cannot run here")
    from evsel.models.runtime.backbone import Backbone

    backbone = Backbone(str(gqa_model_dir), "cuda")
    trainer = _trainer(backbone, tmp_path / "gpu", steps=2)
    assert all(p.device.type == "cuda" for p in trainer.adapter.parameters())
    read, _ = trainer.features[trainer.train[0][1]["id"]]
    assert read.positions.device.type == "cuda"
    summary = trainer.run()
    assert summary["steps"] == 2
    cpu = Backbone(str(gqa_model_dir), "cpu")
    assert qr.load_adapter(tmp_path / "gpu" / "checkpoint", cpu.model).parameters()[0].device.type == "cpu"


# ---------------------------------------------------------------------------------------------
# the real model


@pytest.mark.model
def test_ask_rerank_qrranker_finds_the_killer(capsys):
    from evsel.cli import main
    from evsel.paths import sample_story_path

    assert main(["ingest", "--json", str(sample_story_path())]) == 0
    capsys.readouterr()
    assert main(["ask", "--rerank", "qrranker", "--evidence-only", "--json", "Who killed Ambrose Tenterden?"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["method"]["rerank"] == "qrranker" and result["method"]["rerank_top"] == 50
    assert "rerank_s" in result["timings"]
    top3 = [e for e in result["evidence"] if e["rank"] <= 3]
    assert any("Roland Pryce killed Ambrose Tenterden" in e["text"] for e in top3), \
        [(e["rank"], e["text"][:80]) for e in result["evidence"]]
