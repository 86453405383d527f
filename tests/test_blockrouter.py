"""BlockSearch's trained router (issue 22) on the tiny random Llama of tests/test_qrranker.py: the
training score is the router's own score with the adapter; the adapter changes the keys and keys
them apart; training lowers the loss and resumes; the CLI smoke recipe writes an adapter that
`blocksearch:router` loads."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from evsel.models.blocksearch import trained_router as br
from evsel.models.shared import lora
from evsel.models.blocksearch.routing import BlockSearch, BlockSearchConfig

from test_qrranker import QUESTION, _text, trained_looking

TEXTS = [_text(21, 7), _text(22, 3), _text(23, 10), _text(24, 5), _text(25, 2), _text(26, 8)]


def _adapter(model, seed=0):
    return trained_looking(br.new_router_adapter(model, [0, 1, 2], rank=4, alpha=8.0, seed=seed), seed, 0.3)


def test_the_training_score_is_the_routers_score_with_the_adapter(tiny_backbone):
    adapter = _adapter(tiny_backbone.model)
    router = BlockSearch(tiny_backbone, BlockSearchConfig(dtype="fp32"), adapter=adapter)  # keys stored exactly
    routed = router.route(QUESTION, router.scope(TEXTS)).scores
    with torch.no_grad():
        trained = br.routing_scores(BlockSearch(tiny_backbone), adapter, QUESTION, TEXTS)
    np.testing.assert_allclose(trained.numpy(), routed, rtol=1e-4, atol=1e-6)
    plain = BlockSearch(tiny_backbone).route(QUESTION, BlockSearch(tiny_backbone).scope(TEXTS)).scores
    assert not np.allclose(plain, routed, atol=1e-4)  # the adapter changes the routing


def test_trained_keys_are_keyed_apart_from_untrained_ones(tiny_backbone, tmp_path):
    plain = BlockSearch(tiny_backbone, store_dir=tmp_path)
    trained = BlockSearch(tiny_backbone, store_dir=tmp_path, adapter=_adapter(tiny_backbone.model))
    other = BlockSearch(tiny_backbone, store_dir=tmp_path, adapter=_adapter(tiny_backbone.model, seed=1))
    assert len({plain.digest, trained.digest, other.digest}) == 3
    a = plain.scope(TEXTS).packed.keys
    b = trained.scope(TEXTS).packed.keys
    assert not torch.allclose(torch.as_tensor(a).float(), torch.as_tensor(b).float(), atol=1e-3)
    folders = sorted(p.name for p in (tmp_path / "blocksearch" / tiny_backbone.fingerprint).iterdir())
    assert folders == sorted([plain.digest, trained.digest])
    again = BlockSearch(tiny_backbone, store_dir=tmp_path, adapter=trained.adapter)
    again.scope(TEXTS)
    assert again.encoded == 0  # read back from its own files


def _groups():
    texts = [_text(40 + i, 6 + i % 5) for i in range(8)]
    qs = [{"id": f"q{i}", "question": f"{QUESTION} {i}", "candidates": list(range(8)), "rest": [],
           "units": [[i]], "gold": [i]} for i in range(3)]
    return [{"id": "g0", "texts": texts, "questions": qs}]


def _trainer(backbone, out, steps=3, **kwargs):
    from evsel.recipes import blockrouter as recipe

    config = recipe.RouterConfig(out=str(out), steps=steps, batch=2, lr=5e-2, warmup=1, rank=4, alpha=8.0,
                                 negatives=3, hard_negatives=1, lora_layers=None, dev_every=0,
                                 checkpoint_every=1, **kwargs)
    trainer = recipe.RouterTrainer(config, backbone)
    groups = _groups()
    trainer.setup(groups, groups)
    return trainer


def test_training_steps_lower_the_loss_on_a_fixed_batch(tiny_backbone, tmp_path):
    trainer = _trainer(tiny_backbone, tmp_path / "run")
    assert trainer.adapter.config.layers == [0, 1, 2]
    trainer.schedule = trainer.schedule[:2] * 4  # the same two questions every step
    before = trainer.fixed_loss(0)
    for _ in range(3):
        trainer.train_step()
    assert trainer.fixed_loss(0) < before - 1e-3


def test_training_resumes_with_the_same_losses(tiny_backbone, tmp_path):
    whole = _trainer(tiny_backbone, tmp_path / "whole", steps=3)
    whole.run()
    out = tmp_path / "run"
    _trainer(tiny_backbone, out, steps=1).run()
    resumed = _trainer(tiny_backbone, out, steps=3)
    assert resumed.step == 1
    resumed.run()
    a = [json.loads(x) for x in (tmp_path / "whole" / "log.jsonl").read_text().splitlines() if '"loss"' in x]
    b = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines() if '"loss"' in x]
    assert [r["loss"] for r in a] == pytest.approx([r["loss"] for r in b], abs=1e-4)


def test_train_cli_router_smoke_and_the_selector_loads_it(gqa_model_dir, tmp_path, capsys, monkeypatch):
    import sys

    from helpers import shared_data
    from evsel.cli import main

    shared_data("fairytaleqa", "questions", "train")
    out = tmp_path / "router"
    args = ["--model", str(gqa_model_dir), "--device", "cpu", "train", "blocksearch", "--router", "--recipe",
            "smoke", "--out", str(out), "--json"]
    monkeypatch.setattr(sys, "argv", ["evsel", *args])
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 2 and "recall@5" in summary["best_dev"] and "recall@5" in summary["best_dev"]["bm25"]
    assert (out / lora.ADAPTER_FILE).is_file() and (out / "checkpoint" / lora.ADAPTER_FILE).is_file()
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [0, 1, 2] and all(np.isfinite(r["loss"]) for r in log[1:])
    meta = json.loads((out / lora.ADAPTER_CONFIG).read_text())
    assert meta["format"] == br.FORMAT and meta["layers"] == [1, 2]  # smoke: the top 2 layers up to L = 2
    assert main(args[:-1] + ["--source", "locomo"]) == 1
    assert "refusing" in capsys.readouterr().err
    assert main(args[:-1] + ["--aux-weight", "1"]) == 1  # a decoder option the router has no use for
    capsys.readouterr()

    from evsel.models.runtime.backbone import Backbone
    from evsel.models.selectors import SelectorContext, get_selector
    from evsel.settings import Settings

    backbone = Backbone(str(gqa_model_dir), "cpu")

    def context(router):  # EVSEL_BLOCKSEARCH_ROUTER=router
        return SelectorContext(load_backbone=lambda: backbone, states=None,
                               settings=Settings.resolve(env={"EVSEL_BLOCKSEARCH_ROUTER": str(router)}))

    selector = get_selector("blocksearch:router", context(out))
    assert selector.name == "blocksearch:router"
    assert selector.router.adapter is not None and selector.router.adapter.config.layers == [1, 2]
    missing = get_selector("blocksearch:router", context(tmp_path / "none"))
    with pytest.raises(Exception, match="no trained BlockSearch router"):
        missing.router


def test_the_default_uses_a_router_where_one_is_set_and_untrained_never(gqa_model_dir, tmp_path):
    from evsel.models.runtime.backbone import Backbone
    from evsel.models.selectors import SelectorContext, get_selector
    from evsel.settings import Settings

    backbone = Backbone(str(gqa_model_dir), "cpu")
    out = tmp_path / "router"
    _adapter(backbone.model).save(out)

    def selector(spec, router=None):  # EVSEL_BLOCKSEARCH_ROUTER=router
        env = {"EVSEL_BLOCKSEARCH_ROUTER": str(router)} if router else {}
        return get_selector(spec, SelectorContext(load_backbone=lambda: backbone, states=None,
                                                  settings=Settings.resolve(env=env)))

    assert selector("blocksearch").router.adapter is None  # none ships for the tiny model
    default = selector("blocksearch", out)
    assert default.name == "blocksearch" and default.router.adapter is not None
    untrained = selector("blocksearch:untrained", out)
    assert untrained.name == "blocksearch:untrained" and untrained.router.adapter is None
    assert untrained.router.digest != default.router.digest
    assert selector("blocksearch:seed", out).router.adapter is None  # not what the router was trained for
    assert selector("blocksearch:faithful", out).router.adapter is None
    with pytest.raises(Exception, match="contradict"):
        selector("blocksearch:router+untrained", out)
    with pytest.raises(Exception, match="no trained BlockSearch router"):
        selector("blocksearch", tmp_path / "none").router  # a folder named and missing is an error, not a silent fallback


def test_train_cli_router_on_a_locomo_fold_reads_that_fold_only(gqa_model_dir, tmp_path, capsys, monkeypatch):
    """`--source locomo --fold 1`: training and dev questions are all of fold 1's conversations,
    over whole-conversation chunk lists, dev from a held-out conversation of the same fold; with
    the fold ignored, most documents (and so questions) would be fold 2's."""
    import sys

    from helpers import shared_data
    from evsel.cli import main
    from evsel.evaluation.folds import LOCOMO_FOLDS

    shared_data("locomo", "locomo10.json")
    shared_data("fairytaleqa", "questions", "train")
    out = tmp_path / "router"
    args = ["--model", str(gqa_model_dir), "--device", "cpu", "train", "blocksearch", "--router", "--recipe",
            "smoke", "--source", "locomo", "--fold", "1", "--out", str(out), "--json"]
    monkeypatch.setattr(sys, "argv", ["evsel", *args])
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 2 and "recall@5" in summary["best_dev"]
    data = json.loads((out / "metrics.json").read_text())["data"]

    def conversation(qid: str) -> str:  # "locomo/conv-26/5"
        source, conv, _ = qid.split("/")
        assert source == "locomo"
        return conv

    fold, other = set(LOCOMO_FOLDS[1]), set(LOCOMO_FOLDS[2])
    trained = {conversation(q) for q in data["locomo"]["question_ids"]}
    dev = {conversation(q) for q in data["dev"]["question_ids"]}
    assert data["fold"] == 1 and "fairytaleqa-train" not in data
    assert trained and trained <= fold and not trained & other
    assert len(data["locomo"]["question_ids"]) >= 3  # spread over the fold's training conversations
    assert data["dev"]["documents"] == sorted(dev) and len(dev) == 1 and dev <= fold
    assert not dev & trained  # the held-out conversation is never trained on
    assert data["locomo"]["documents"] == len(fold) - 1
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [0, 1, 2] and all(np.isfinite(r["loss"]) for r in log[1:])
    assert main(args[:-1] + ["--fold", "3"]) == 1  # typer keeps the last --fold
    assert "does not exist" in capsys.readouterr().err


def test_shipped_names_the_shipped_router_even_where_another_is_set(gqa_model_dir, tmp_path, monkeypatch):
    from evsel.models.runtime.backbone import Backbone
    from evsel.models.selectors import SelectorContext, get_selector
    from evsel.settings import Settings

    backbone = Backbone(str(gqa_model_dir), "cpu")
    shipped, other = tmp_path / "shipped", tmp_path / "other"
    br.new_router_adapter(backbone.model, [1, 2], rank=4).save(shipped)
    br.new_router_adapter(backbone.model, [0, 1, 2], rank=4).save(other)
    monkeypatch.setattr(br, "shipped_router_dir", lambda fingerprint: shipped)
    settings = Settings.resolve(env={"EVSEL_BLOCKSEARCH_ROUTER": str(other)})

    def selector(spec):
        return get_selector(spec, SelectorContext(load_backbone=lambda: backbone, states=None, settings=settings))

    assert selector("blocksearch").router.adapter.config.layers == [0, 1, 2]  # the one set
    assert selector("blocksearch:router").router.adapter.config.layers == [0, 1, 2]
    chosen = selector("blocksearch:shipped")
    assert chosen.name == "blocksearch:shipped" and chosen.router.adapter.config.layers == [1, 2]
    with pytest.raises(Exception, match="contradict"):
        selector("blocksearch:shipped+untrained")
