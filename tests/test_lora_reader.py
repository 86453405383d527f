"""The LoRA reader (models/reader/lora.py, recipes/lora_reader.py) on the tiny random Llama: the
adapted upper pass from the cut layer equals the backbone's own pass with the deltas, only the
deltas and the head get gradients, the backbone is untouched afterwards, save/load keeps the
scores, and a stopped run resumes to the same weights as one that was not stopped. With the real
model: the shipped reader answers the quickstart's sample."""

from __future__ import annotations

import json

import pytest

QUESTION = "who killed the keeper ?"
PASSAGES = ["the storm came at night and the lamp went out", "the keeper was killed by the knife in the tower",
            "the gull sat on the rock by the sea"]


def _config(**over):
    from evsel.models.reader.lora import LoraReaderConfig

    return LoraReaderConfig(**{"cut": 1, "deepest": 3, "rank": 2, "max_tokens": 64, "max_span": 4, **over})


def _examples() -> list[dict]:
    return [{"id": "a", "question": QUESTION, "passages": PASSAGES, "spans": [(1, 29, 34)], "answers": ["knife"],
             "unanswerable": False},
            {"id": "b", "question": "where was the ship ?", "passages": PASSAGES[:1] + PASSAGES[2:], "spans": [],
             "answers": ["rock"], "unanswerable": True},
            {"id": "c", "question": "what went out ?", "passages": PASSAGES, "spans": [(0, 32, 36)],
             "answers": ["lamp"], "unanswerable": False}]


def test_the_adapted_pass_from_the_cut_equals_the_backbones_own_pass_with_the_deltas(tiny_backbone):
    import torch

    from evsel.models.runtime.backbone import run_layers
    from evsel.models.reader.lora import LoraReader, encode, run_upper

    model = tiny_backbone.model
    reader = LoraReader.for_model(model, _config())
    for name, value in reader.params.items():  # B is zero at the start: give the deltas something to do
        if name.endswith("lora_B"):
            value.normal_(0, 0.5)
    seq = encode(tiny_backbone.tokenizer, tiny_backbone.bos_id(), QUESTION, PASSAGES, reader.config)
    ids = torch.tensor([seq.ids])
    with torch.no_grad():
        plain = run_layers(model, [3], input_ids=ids)[3]
        layers = [model.model.layers[n - 1] for n in reader.config.adapted]
        with reader.applied(layers, reader.config.adapted):
            whole = run_layers(model, [3], input_ids=ids)[3]
            from_cut = run_upper(layers, model.model.rotary_emb, reader.lower_states(model, seq))
        after = run_layers(model, [3], input_ids=ids)[3]
    assert torch.allclose(whole, from_cut, atol=1e-5)
    assert not torch.allclose(whole, plain, atol=1e-3)  # the deltas change the pass...
    assert torch.equal(after, plain)  # ...only while the reader reads


def test_reading_with_the_deltas_merged_equals_the_hooked_pass_and_leaves_the_model_as_it_was(tiny_backbone):
    import torch

    from evsel.models.reader.lora import LoraReader, encode, span_mask

    model = tiny_backbone.model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    reader = LoraReader.for_model(model, _config())
    for name, value in reader.params.items():
        if name.endswith("lora_B"):
            value.normal_(0, 0.5)
    seq = encode(tiny_backbone.tokenizer, tiny_backbone.bos_id(), QUESTION, PASSAGES, reader.config)
    allowed = span_mask(seq, reader.config.max_span)
    layers = [model.model.layers[n - 1] for n in reader.config.adapted]
    with torch.no_grad():
        hooked, hooked_null = reader.upper_scores(layers, model.model.rotary_emb, reader.lower_states(model, seq),
                                                  allowed)
    read = reader.reading(tiny_backbone, QUESTION, PASSAGES)
    total = torch.logsumexp(torch.cat([hooked.reshape(-1), hooked_null[None]]), 0)
    finite = torch.isfinite(hooked)
    assert torch.allclose(read.logp_all[finite], (hooked - total)[finite], atol=1e-3)  # float32 rounding
    assert read.null_logp == pytest.approx(float(hooked_null - total), abs=1e-3)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert reader.merged_layers(model) is reader.merged_layers(model)  # merged once per model
    reader.trainable(True)  # deltas that may change are merged again when next read
    assert reader._merged is None


def test_only_the_deltas_and_the_head_learn_and_save_load_keeps_the_scores(tiny_backbone, tmp_path):
    import torch

    from evsel.models.reader.lora import LoraReader, encode, gold_mask, span_mask

    model = tiny_backbone.model
    reader = LoraReader.for_model(model, _config())
    reader.trainable(True)
    seq = encode(tiny_backbone.tokenizer, tiny_backbone.bos_id(), QUESTION, PASSAGES, reader.config)
    assert [tiny_backbone.tokenizer.decode(seq.ids[s:s + 1]) for s in seq.starts] == ["the", "the", "the"]
    allowed = span_mask(seq, reader.config.max_span)
    target = gold_mask(seq, [(1, 29, 34)], reader.config.max_span)
    assert target.sum() == 1 and (target & allowed).any()
    layers = [model.model.layers[n - 1] for n in reader.config.adapted]
    spans, null = reader.upper_scores(layers, model.model.rotary_emb, reader.lower_states(model, seq), allowed)
    loss = torch.logsumexp(torch.cat([spans.reshape(-1), null[None]]), 0) - torch.logsumexp(spans[target], 0)
    loss.backward()
    assert all(p.grad is None for p in model.parameters())
    assert any(v.grad is not None and v.grad.abs().sum() > 0 for k, v in reader.params.items() if k.endswith("lora_B"))
    assert reader.params["head.start"].grad.abs().sum() > 0

    reader.meta["abstention"] = {"margin": 1.5}
    reader.save(tmp_path / "r")
    again = LoraReader.load(tmp_path / "r", model)
    assert again.margin == 1.5 and again.config.adapted == [2, 3]
    assert again.margin_for(True) == 1.5 and again.margin_for(False) == float("inf")  # no prose margin: always answer
    reader.meta["prose_abstention"] = {"margin": 0.5}
    reader.save(tmp_path / "r")
    assert LoraReader.load(tmp_path / "r", model).margin_for(False) == 0.5
    first = reader.reading(tiny_backbone, QUESTION, PASSAGES)
    second = again.reading(tiny_backbone, QUESTION, PASSAGES)
    assert torch.allclose(first.logp_all, second.logp_all) and first.null_logp == second.null_logp
    best = second.top(3)
    assert len(best) == 3 and all(PASSAGES[f.passage][f.start:f.end] == f.text for f in best)
    assert second.logp_of(best[0].passage, best[0].start, best[0].end) == pytest.approx(
        torch.log(torch.tensor(best[0].probability)).item(), abs=1e-4)


def test_a_reader_for_another_backbone_shape_is_refused(tiny_backbone, tmp_path):
    from evsel.errors import ModelError
    from evsel.models.reader.lora import LoraReader

    reader = LoraReader.for_model(tiny_backbone.model, _config())
    reader.save(tmp_path)
    meta = json.loads((tmp_path / "reader.json").read_text())
    meta["d_model"] = 576
    (tmp_path / "reader.json").write_text(json.dumps(meta))
    with pytest.raises(ModelError, match="another backbone shape"):
        LoraReader.load(tmp_path, tiny_backbone.model)


class _Engine:
    def __init__(self, backbone):
        self.backbone = backbone


def _run(tiny_backbone, out, **options):
    from evsel.recipes.lora_reader import run_training

    return run_training(_Engine(tiny_backbone), str(out), "smoke", dict(options))


def test_a_stopped_run_resumes_to_the_same_weights_as_one_that_was_not(tiny_backbone, tmp_path):
    from safetensors.torch import load_file

    from evsel.errors import InputError
    from evsel.recipes.lora_reader import LoraTrainConfig

    data = {"train": _examples(), "dev": _examples()[:1], "calibration": [], "described": {}}
    settings = {"steps": 4, "batch": 2, "dev_every": 2, "warmup": 1, "cut": 1, "deepest": 3, "rank": 2,
                "max_tokens": 64, "threads": None}
    for name in ("straight", "stopped"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "examples.json").write_text(json.dumps(data))
        config = {**LoraTrainConfig().__dict__, **settings, "out": str(tmp_path / name)}
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    whole = _run(tiny_backbone, tmp_path / "straight", resume=True)
    assert whole["steps"] == 4 and (tmp_path / "straight" / "reader.json").is_file()
    assert any((tmp_path / "straight" / "states").iterdir())  # the frozen layers' output, cached

    half = _run(tiny_backbone, tmp_path / "stopped", resume=True, steps=2)
    assert half["steps"] == 2
    trainer = json.loads((tmp_path / "stopped" / "checkpoint" / "trainer.json").read_text())
    assert trainer["step"] == 2 and trainer["seen"] == 4
    done = _run(tiny_backbone, tmp_path / "stopped", resume=True, steps=4)
    assert done["steps"] == 4
    a = load_file(str(tmp_path / "straight" / "checkpoint" / "adapter.safetensors"))
    b = load_file(str(tmp_path / "stopped" / "checkpoint" / "adapter.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        assert (a[key] - b[key]).abs().max() < 1e-5, key

    with pytest.raises(InputError, match="already holds"):
        _run(tiny_backbone, tmp_path / "stopped", lora=True)
    with pytest.raises(InputError, match="no config.json"):
        _run(tiny_backbone, tmp_path / "nothing", resume=True)


def test_a_precached_run_trains_when_resumed_and_a_run_may_start_from_a_trained_reader(tiny_backbone, tmp_path):
    from safetensors.torch import load_file

    from evsel.errors import InputError
    from evsel.recipes.lora_reader import LoraTrainConfig, _shaped_as

    data = {"train": _examples(), "dev": _examples()[:1], "calibration": [], "described": {}}
    settings = {"steps": 2, "batch": 2, "dev_every": 2, "warmup": 1, "cut": 1, "deepest": 3, "rank": 2,
                "max_tokens": 64, "threads": None, "precache_only": True}
    (tmp_path / "first").mkdir()
    (tmp_path / "first" / "examples.json").write_text(json.dumps(data))
    (tmp_path / "first" / "config.json").write_text(json.dumps({**LoraTrainConfig().__dict__, **settings,
                                                                  "out": str(tmp_path / "first")}))
    cached = _run(tiny_backbone, tmp_path / "first", resume=True, precache_only=True)
    assert cached["cached"] == 4 and cached["steps"] == 0
    trained = _run(tiny_backbone, tmp_path / "first", resume=True)  # no --precache-only: it trains
    assert trained["steps"] == 2 and (tmp_path / "first" / "adapter.safetensors").is_file()

    # --init-from: the run takes the trained reader's shape, and its deltas and head to start from
    shaped = _shaped_as(LoraTrainConfig(out=str(tmp_path / "second")), tmp_path / "first")
    assert (shaped.cut, shaped.deepest, shaped.rank, shaped.max_tokens) == (1, 3, 2, 64)
    (tmp_path / "second").mkdir()
    (tmp_path / "second" / "examples.json").write_text(json.dumps(data))
    (tmp_path / "second" / "config.json").write_text(json.dumps({**shaped.__dict__, "steps": 0, "threads": None}))
    assert _run(tiny_backbone, tmp_path / "second", resume=True)["steps"] == 0
    a = load_file(str(tmp_path / "first" / "adapter.safetensors"))
    b = load_file(str(tmp_path / "second" / "adapter.safetensors"))
    assert a.keys() == b.keys() and all(torch_equal(a[k], b[k]) for k in a)
    with pytest.raises(InputError, match="holds no LoRA reader"):
        _shaped_as(shaped, tmp_path / "nothing")


def torch_equal(a, b) -> bool:
    import torch

    return torch.equal(a, b)


@pytest.mark.model
def test_the_shipped_reader_answers_the_sample(capsys):
    """The quickstart, with the real model and the reader it ships."""
    from evsel.cli import main
    from evsel.paths import sample_story_path

    assert main(["ingest", str(sample_story_path())]) == 0
    capsys.readouterr()
    assert main(["ask", "Who killed Ambrose Tenterden?", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["answer"] == "Roland Pryce", result["answer"]
