"""Cross-fold training sources: LoCoMo, MuSiQue and HotpotQA train only on one fixed fold, with
dev data from that same fold, so a fold-trained adapter never reads a question of the fold it is
evaluated on; without --fold they are refused."""

from __future__ import annotations

import json

import pytest
from helpers import DATA, shared_data

from evsel.cli import main
from evsel.evaluation.datasets import load_dataset
from test_qrranker import _trainer


def _fold_ids(name: str) -> dict[int, set[str]]:
    return {f: {f"{name}/{q.qid}" for q in load_dataset(name, DATA, fold=f).questions} for f in (1, 2)}


@pytest.mark.parametrize("name, fold", [("locomo", 1), ("musique", 2)])
def test_fold_training_questions_come_from_that_fold_only(backbone_tokenizer, name, fold):
    from evsel.recipes import qrranker as recipe
    from evsel.recipes.common import question_groups

    shared_data("locomo", "locomo10.json") if name == "locomo" else shared_data("hipporag_multihop", f"{name}_train.json")
    config = recipe.TrainConfig(sources=[name], fold=fold, **recipe.SMOKE)
    train, dev, described = question_groups(config, backbone_tokenizer, DATA)
    train_ids = {q["id"] for g in train for q in g["questions"]}
    dev_ids = {q["id"] for g in dev for q in g["questions"]}
    ids = _fold_ids(name)
    assert train_ids and dev_ids
    assert train_ids | dev_ids <= ids[fold]
    assert not (train_ids | dev_ids) & ids[3 - fold]
    assert not train_ids & dev_ids
    assert described["fold"] == fold and described["dev"]["source"].startswith(f"{name} fold {fold}")
    assert set(described[name]["question_ids"]) == train_ids and set(described["dev"]["question_ids"]) == dev_ids
    if name == "locomo":  # dev is a held-out conversation of the fold: no training group reads it
        held = described["dev"]["documents"]
        assert len(held) == 1 and not {g["id"] for g in train} & {f"locomo/{k}" for k in held}


def test_unreal_conversion_of_a_fold_holds_only_that_fold(backbone_tokenizer, tmp_path):
    from evsel.recipes import unreal as recipe

    shared_data("locomo", "locomo10.json")
    meta = recipe.convert(tmp_path, recipe.DataConfig(sources=["locomo"], fold=2, negatives=5), backbone_tokenizer,
                          DATA)
    ids = _fold_ids("locomo")
    split = {s: {json.loads(line)["id"] for line in (tmp_path / f"{s}.jsonl").read_text().splitlines()}
             for s in ("train", "dev")}
    assert split["train"] and split["dev"] and not split["train"] & split["dev"]
    assert split["train"] | split["dev"] <= ids[2] and not (split["train"] | split["dev"]) & ids[1]
    assert meta["config"]["fold"] == 2
    assert recipe.trained_on(tmp_path)["fold"] == 2 and recipe.trained_on(tmp_path)["sources"] == ["locomo"]


@pytest.mark.parametrize("args, message", [
    (["train", "qrranker", "--source", "locomo"], "refusing to train on 'locomo' without --fold"),
    (["train", "unreal", "--source", "musique", "--recipe", "smoke"], "refusing to train on 'musique' without --fold"),
    (["train", "qrranker", "--detect-heads", "--source", "hotpotqa"], "refusing to detect heads on 'hotpotqa' without --fold"),
    (["train", "qrranker", "--source", "fairytaleqa-val", "--fold", "1"], "refusing to train on 'fairytaleqa-val'"),
    (["train", "qrranker", "--fold", "1"], "--fold applies to the sources locomo, musique, hotpotqa"),
    (["train", "unreal", "--source", "locomo", "--fold", "3"], "--fold 3 does not exist"),
])
def test_an_evaluation_set_without_a_fold_is_refused_in_one_line(tmp_path, capsys, args, message):
    assert main([*args, "--out", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


@pytest.mark.model
def test_train_qrranker_on_a_locomo_fold_smoke(tmp_path, capsys, monkeypatch):
    import sys

    shared_data("locomo", "locomo10.json")
    out = tmp_path / "qr-locomo-fold1"
    args = ["train", "qrranker", "--source", "locomo", "--fold", "1", "--recipe", "smoke", "--steps", "2",
            "--out", str(out), "--json"]
    monkeypatch.setattr(sys, "argv", ["evsel", *args])  # the command recorded beside the adapter
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 2 and "recall@3" in summary["dev_bm25"]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["trained_on"]["sources"] == ["locomo"] and metrics["trained_on"]["fold"] == 1
    assert "fold 2" in metrics["trained_on"]["evaluate_on"]
    assert json.loads((out / "heads.json").read_text())["trained_on"]["fold"] == 1
    assert "--source locomo --fold 1" in (out / "command.txt").read_text()
    seen = set(metrics["data"]["locomo"]["question_ids"]) | set(metrics["data"]["dev"]["question_ids"])
    ids = _fold_ids("locomo")
    assert seen and seen <= ids[1] and not seen & ids[2]


def test_an_eval_record_names_the_adapter_setting_it_ran_with(monkeypatch, tmp_path):
    from evsel.evaluation.report import run_info

    monkeypatch.setenv("EVSEL_QRRANKER_HEADS", str(tmp_path / "qr fold1"))
    monkeypatch.delenv("EVSEL_THREADS", raising=False)
    command = run_info(["evsel", "eval", "locomo", "--fold", "2"])["command"]
    assert command == f"EVSEL_QRRANKER_HEADS='{tmp_path / 'qr fold1'}' evsel eval locomo --fold 2"


def test_a_run_stopped_by_minutes_checks_dev_on_its_last_step(tiny_backbone, tmp_path, monkeypatch):
    """A short --minutes budget may end before any --dev-every check: its steps are checked once
    more, so the adapter written can be a trained one (a fake clock: 20 s a reading)."""
    from evsel.recipes import common

    class Clock:
        now = 0.0

        @classmethod
        def perf_counter(cls) -> float:
            cls.now += 20.0
            return cls.now

    trainer = _trainer(tiny_backbone, tmp_path / "run", steps=50, minutes=1.0)
    monkeypatch.setattr(common, "time", Clock)
    summary = trainer.run()
    assert 0 < summary["steps"] < 50
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert log[-1]["step"] == summary["steps"] and "dev_recall@3" in log[-1] and "loss" not in log[-1]
    written = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert written["step"] in (0, summary["steps"]) and written["dev"] == summary["best_dev"]
