"""BlockSearch's trained code decoder (seed 001, Sec. 3.2, Appx. F, J) on the tiny random Llama of
tests/test_qrranker.py (6 query heads over 2 KV heads): our query pass against the model's own
forward over the same block-sparse context, with and without the LoRA merged into the weights; the
beam search's codes; the auxiliary loss's teachers by hand; three training steps lowering the loss;
resume; the CLI smoke run; and the real model end to end."""

from __future__ import annotations

import copy
import json
import random

import numpy as np
import pytest
import torch
from evsel.models.blocksearch import decoder as bd
from evsel.models.shared import blocksparse
from evsel.models.shared import lora
from evsel.models.qrranker import rerank as qr

from test_qrranker import QUESTION, _text, trained_looking

CUT_MARGIN_NATS = 0.1
TEXTS = [_text(11, 7), _text(12, 3), _text(13, 10), _text(14, 5), _text(15, 2), _text(16, 8)]


def _nonzero_adapter(model, seed=0):
    return trained_looking(bd.new_adapter(model, rank=4, alpha=8.0, seed=seed), seed, 0.3)


def _reference_logits(model, decoder, ctx, ids):
    """The model's own forward of `ids` after the context KV (a DynamicCache), digit logits."""
    cache = blocksparse.dynamic_cache([(k[None].clone(), v[None].clone()) for k, v in zip(ctx.keys, ctx.values)])
    positions = (torch.arange(len(ids)) + ctx.position)[None]
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), cache=cache, position_ids=positions)
    return out.logits[0][:, decoder.digit_ids].float()


def test_query_pass_equals_the_models_forward_over_the_context(tiny_backbone):
    decoder = bd.Decoder(tiny_backbone)
    codes = bd.scope_codes([f"h{i}" for i in range(len(TEXTS))])
    ctx = decoder.context(TEXTS, codes)
    ids = decoder.query_ids(QUESTION) + [decoder.digit_ids[3], decoder.digit_ids[1]]
    with torch.no_grad():
        hidden, _ = decoder.forward(ctx, torch.tensor([ids]), ctx.position)
        ours = decoder.digit_logits(hidden[0])
    torch.testing.assert_close(ours, _reference_logits(tiny_backbone.model, decoder, ctx, ids), atol=1e-4, rtol=1e-4)
    # the same, one token at a time through the past
    with torch.no_grad():
        hidden, past = decoder.forward(ctx, torch.tensor([ids[:-2]]), ctx.position)
        for j in (len(ids) - 2, len(ids) - 1):
            hidden, past = decoder.forward(ctx, torch.tensor([[ids[j]]]), ctx.position + j, past)
    torch.testing.assert_close(decoder.digit_logits(hidden[0, -1]), ours[-1], atol=1e-4, rtol=1e-4)


def test_the_adapter_acts_on_the_query_only_as_a_merged_lora_would(tiny_backbone):
    """Our pass with the adapter equals the model with the LoRA merged into q_proj / v_proj, run over
    the frozen backbone's context KV: the chunks' states never see the adapter."""
    model = tiny_backbone.model
    adapter = _nonzero_adapter(model)
    decoder = bd.Decoder(tiny_backbone, adapter)
    ctx = decoder.context(TEXTS, bd.scope_codes([f"h{i}" for i in range(len(TEXTS))]))
    merged = copy.deepcopy(model)
    with torch.no_grad():
        for layer in adapter.config.layers:
            attn = merged.model.layers[layer].self_attn
            for proj in ("q", "v"):
                a = adapter.params[adapter.name(layer, proj, "A")]
                b = adapter.params[adapter.name(layer, proj, "B")]
                getattr(attn, f"{proj}_proj").weight += adapter.config.scale * (b @ a)
    ids = decoder.query_ids(QUESTION)
    with torch.no_grad():
        hidden, _ = decoder.forward(ctx, torch.tensor([ids]), ctx.position)
        ours = decoder.digit_logits(hidden[0])
    reference = _reference_logits(merged, decoder, ctx, ids)
    torch.testing.assert_close(ours, reference, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(reference, _reference_logits(model, decoder, ctx, ids), atol=1e-3)


def test_codes_are_distinct_stable_and_bracket_their_chunk(tiny_backbone):
    hashes = [f"hash{i}" for i in range(3000)]
    codes = bd.scope_codes(hashes)
    assert len(set(codes)) == len(codes) and all(0 <= c < bd.CODES for c in codes)
    assert bd.scope_codes(hashes[:5]) == codes[:5]  # a chunk keeps its code
    decoder = bd.Decoder(tiny_backbone)
    block = decoder.block(42, "the keeper")
    tag = decoder.code_ids(42)
    assert block[: len(decoder.separator)] == decoder.separator
    assert block[len(decoder.separator) + 1: len(decoder.separator) + 5] == tag and block[-5:-1] == tag
    assert len(decoder.block(7, " ".join(["sea"] * 1000))) <= decoder.query_offset
    with pytest.raises(Exception, match="share a code"):
        decoder.context(TEXTS[:2], [5, 5])


def test_beam_search_returns_valid_codes_only_and_finds_the_best(tiny_backbone):
    decoder = bd.Decoder(tiny_backbone, _nonzero_adapter(tiny_backbone.model))
    rng = random.Random(3)
    codes = bd.random_codes(len(TEXTS), rng)
    ctx = decoder.context(TEXTS, codes)
    found = decoder.beam_search(ctx, QUESTION, width=25, per_step=5)
    assert {c for c, _ in found} <= set(codes) and len({c for c, _ in found}) == len(found)
    assert len(found) == len(codes)  # fewer codes than the beam: every one comes back
    assert [s for _, s in found] == sorted((s for _, s in found), reverse=True)
    # exhaustive: each code's log p under the digit softmax restricted to the codes present
    trie = bd.CodeTrie(codes)
    exact = {}
    for code in codes:
        digits = bd.digits_of(code)
        with torch.no_grad():
            logits = decoder.teacher_forced_logits(ctx, QUESTION, [digits])[0].double()
        exact[code] = sum(float(torch.log_softmax(logits[t], -1)[digits[t]]) for t in range(4))
        assert trie.allowed(digits[:3]) and digits[3] in trie.allowed(digits[:3])
    for code, score in found:
        assert score == pytest.approx(exact[code], abs=1e-4)
    assert found[0][0] == max(exact, key=exact.get)
    narrow = decoder.beam_search(ctx, QUESTION, width=2, per_step=1)
    assert len(narrow) <= 2 and {c for c, _ in narrow} <= set(codes)


def test_auxiliary_teachers_by_hand():
    codes = [1234, 1299, 5678]
    weights = np.array([0.5, 0.3, 0.2])
    q = bd.position_teachers(codes, weights, [1, 2, 9, 9])
    assert q[0][1] == pytest.approx(0.8) and q[0][5] == pytest.approx(0.2)
    assert q[1][2] == pytest.approx(1.0)  # both 1xxx codes have 2 next
    assert q[2][3] == pytest.approx(0.5 / 0.8) and q[2][9] == pytest.approx(0.3 / 0.8)
    assert q[3][9] == pytest.approx(1.0)  # only 1299 matches 129
    off = bd.position_teachers(codes, weights, [5, 0, 0, 0])
    assert off[1][6] == pytest.approx(1.0) and off[2].sum() == 0  # no code starts 50: no teacher there
    w = bd.teacher_weights(3, [2], {0: 1.0, 1: 0.0}, gold_margin=4.0)
    assert w.argmax() == 2 and w.sum() == pytest.approx(1.0) and w[0] > w[1]


def _groups(n_groups=2, per=3):
    out = []
    for g in range(n_groups):
        texts = [_text(100 + 10 * g + j, 3 + j % 4) for j in range(5)]
        questions = [{"id": f"g{g}q{i}", "question": QUESTION if i % 2 == 0 else "where is the lamp ?",
                      "candidates": list(range(5)), "rest": [], "units": [[(g + i) % 5]], "gold": [(g + i) % 5]}
                     for i in range(per)]
        out.append({"id": f"g{g}", "texts": texts, "questions": questions})
    return out


def _trainer(backbone, out, steps=3, **kwargs):
    from evsel.recipes import blocksearch as recipe

    config = recipe.TrainConfig(out=str(out), steps=steps, batch=3, lr=5e-2, warmup=1, rank=4, alpha=8.0,
                                dev_every=0, checkpoint_every=1, stories_per_context=2, aux_warmup=1, **kwargs)
    trainer = recipe.DecoderTrainer(config, backbone)
    groups = _groups()
    trainer.setup(groups, groups[:1])
    return trainer


def test_three_training_steps_lower_the_loss_on_a_fixed_batch(tiny_backbone, tmp_path):
    trainer = _trainer(tiny_backbone, tmp_path / "run", steps=3)
    trainer.schedule = [trainer.schedule[0]] * 3  # the same batch and codes every step
    before = trainer.fixed_loss(0)
    records = [trainer.train_step() for _ in range(3)]
    assert all(r["aux"] > 0 for r in records[1:])  # the on-policy term is on once λ ramps in
    assert trainer.fixed_loss(0) < before - 1e-3


def test_training_resumes_and_writes_an_adapter_the_selector_loads(tiny_backbone, tmp_path):
    out = tmp_path / "run"
    whole = _trainer(tiny_backbone, tmp_path / "whole", steps=4)
    whole.run()
    first = _trainer(tiny_backbone, out, steps=4)
    first.config.minutes = 0.0  # stops at once, checkpointing step 0
    first.run()
    part = _trainer(tiny_backbone, out, steps=2)
    part.run()
    resumed = _trainer(tiny_backbone, out, steps=4)
    assert resumed.step == 2
    resumed.run()
    a = [json.loads(x) for x in (tmp_path / "whole" / "log.jsonl").read_text().splitlines() if '"loss"' in x]
    b = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines() if '"loss"' in x]
    assert [r["loss"] for r in a] == pytest.approx([r["loss"] for r in b], abs=1e-4)
    loaded = bd.load_decoder_adapter(out, tiny_backbone.model)
    assert loaded.config.layers == list(range(tiny_backbone.model.config.num_hidden_layers))
    with pytest.raises(Exception, match="adapter"):
        qr.load_adapter(out, tiny_backbone.model)  # a decoder adapter is not a QRRanker one


def test_training_refuses_evaluation_sets(tmp_path):
    from evsel.errors import InputError
    from evsel.recipes import blocksearch as recipe

    with pytest.raises(InputError, match="refusing"):
        recipe.training_groups(recipe.TrainConfig(out=str(tmp_path), sources=["locomo"]), None, None)


def test_the_training_pass_shares_the_query_and_matches_teacher_forcing(tiny_backbone):
    """train_logits runs the query block once and both rows (gold, rollout) over its KV: each row
    equals a separate teacher-forced pass of its own digits; the rollout is a code present."""
    decoder = bd.Decoder(tiny_backbone, _nonzero_adapter(tiny_backbone.model))
    codes = bd.random_codes(len(TEXTS), random.Random(5))
    ctx = decoder.context(TEXTS, codes).trainable()
    gold = bd.digits_of(codes[2])
    forced, replay, rollout = decoder.train_logits(ctx, QUESTION, gold, np.random.default_rng(0))
    assert int("".join(map(str, rollout))) in codes
    with torch.no_grad():
        both = decoder.teacher_forced_logits(ctx, QUESTION, [gold, rollout])
    torch.testing.assert_close(forced.detach(), both[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(replay.detach(), both[1], atol=1e-4, rtol=1e-4)
    loss, parts, _ = bd.decoder_loss(decoder, ctx, QUESTION, codes[2], bd.teacher_weights(len(codes), [2]), 1.0,
                                     np.random.default_rng(0))
    loss.backward()
    assert parts["aux"] > 0 and all(p.grad is not None for p in decoder.adapter.parameters())


def test_train_cli_smoke_on_a_tiny_model(gqa_model_dir, tmp_path, capsys, monkeypatch):
    import sys

    from helpers import shared_data
    from evsel.cli import main

    shared_data("fairytaleqa", "questions", "train")
    out = tmp_path / "bs"
    args = ["--model", str(gqa_model_dir), "--device", "cpu", "train", "blocksearch", "--recipe", "smoke",
            "--out", str(out), "--stories", "2", "--steps", "2", "--json"]
    monkeypatch.setattr(sys, "argv", ["evsel", *args])
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 2 and "recall@1" in summary["best_dev"]["bm25"]
    assert (out / lora.ADAPTER_FILE).is_file() and (out / "checkpoint" / lora.ADAPTER_FILE).is_file()
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [0, 1, 2] and all(np.isfinite(r["loss"]) for r in log[1:])
    assert "train blocksearch --recipe smoke" in json.loads((out / "metrics.json").read_text())["command"]
    assert main(args[:-1] + ["--source", "locomo"]) == 1
    assert "refusing" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# the real model


@pytest.mark.model
def test_ask_select_blocksearch_trained_decodes_codes_of_the_sample(capsys):
    """The shipped decoder end to end: the routing's top 64 of the sample story decoded by beam
    search; every decoded code names one of those chunks, and they lead the evidence."""
    from evsel.cli import main
    from evsel.models.runtime.backbone import Backbone
    from evsel.paths import sample_story_path

    backbone = Backbone()
    assert (bd.shipped_adapter_dir(backbone.fingerprint) / lora.ADAPTER_FILE).is_file()
    assert main(["ingest", "--json", str(sample_story_path())]) == 0
    capsys.readouterr()
    question = "Who killed Ambrose Tenterden?"
    assert main(["ask", "--select", "blocksearch:trained+top64", "--evidence-only", "--json", "--top-n", "8",
                 question]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["method"]["select"] == "blocksearch:trained+top64"
    assert len(result["evidence"]) == 8 and all(e["text"] and e["doc_id"] for e in result["evidence"])
    # the same decode by hand: the beam's codes, in order, are the evidence's leading chunks
    from evsel.ingest.chunker import chunk_document
    from evsel.models.blocksearch.routing import BlockSearch, BlockSearchConfig
    from evsel.ingest.parsers import parse_file

    [doc] = parse_file(sample_story_path())
    records = [c.record() for c in chunk_document(doc, backbone)]
    texts, hashes = [r["text"] for r in records], [r["content_hash"] for r in records]
    router = BlockSearch(backbone, BlockSearchConfig(top_b=64))
    routing = router.route(question, router.scope(texts, hashes))
    routed = sorted(int(i) for i in routing.top)
    decoder = bd.Decoder(backbone, bd.load_decoder_adapter(bd.shipped_adapter_dir(backbone.fingerprint),
                                                           backbone.model))
    found = decoder.rank(question, [texts[i] for i in routed], [hashes[i] for i in routed])
    assert 0 < len(found) <= bd.BEAM_WIDTH and len({j for j, _ in found}) == len(found)
    # the ask reads stored routing keys and a shared KV cache, whose last float bits differ from
    # this fresh pass by machine, so codes within a hair of the cut may trade places: every
    # evidence chunk is a decoded code, and every code clearly above the 8th (0.1 nat) is shown
    decoded = {texts[routed[j]]: logp for j, logp in found}
    shown = [e["text"] for e in result["evidence"]]
    assert all(text in decoded for text in shown), (found, result["evidence"])
    cut = found[min(8, len(found)) - 1][1]
    clear = [texts[routed[j]] for j, logp in found if logp > cut + CUT_MARGIN_NATS]
    assert len(clear) >= 4 and set(clear) <= set(shown), (found, result["evidence"])
