"""The fixed cross-fold split of LoCoMo, MuSiQue and HotpotQA: disjoint, complete, and refused
where it does not apply."""

from __future__ import annotations

import pytest
from helpers import DATA, shared_data

from evsel.cli import main
from evsel.evaluation.datasets import load_dataset
from evsel.evaluation.folds import LOCOMO_FOLDS, other_fold


def test_no_conversation_is_in_both_folds():
    assert not set(LOCOMO_FOLDS[1]) & set(LOCOMO_FOLDS[2])
    assert len(LOCOMO_FOLDS[1]) == len(LOCOMO_FOLDS[2]) == 5
    assert other_fold(1) == 2 and other_fold(2) == 1


def test_locomo_folds_split_the_published_file():
    shared_data("locomo", "locomo10.json")
    whole = load_dataset("locomo", DATA)
    folds = {f: load_dataset("locomo", DATA, fold=f) for f in (1, 2)}
    assert set(folds[1].loaders) | set(folds[2].loaders) == set(whole.loaders)
    assert not set(folds[1].loaders) & set(folds[2].loaders)
    ids = {f: {q.qid for q in d.questions} for f, d in folds.items()}
    assert not ids[1] & ids[2]
    assert ids[1] | ids[2] == {q.qid for q in whole.questions}
    for f, d in folds.items():  # a question only searches its own fold's conversations
        assert all(q.docs[0] in d.loaders for q in d.questions)
        assert d.name == f"locomo-fold{f}"
    assert min(len(ids[1]), len(ids[2])) > 0.45 * len(whole.questions)


@pytest.mark.parametrize("name", ["musique", "hotpotqa"])
def test_multihop_folds_split_the_questions(name):
    shared_data("hipporag_multihop", f"{name}_train.json")
    whole = load_dataset(name, DATA)
    folds = [load_dataset(name, DATA, fold=f) for f in (1, 2)]
    ids = [{q.qid for q in d.questions} for d in folds]
    assert not ids[0] & ids[1]
    assert ids[0] | ids[1] == {q.qid for q in whole.questions}
    assert abs(len(ids[0]) - len(ids[1])) <= 1


@pytest.mark.parametrize("args, message", [
    (["eval", "fairytaleqa", "--fold", "1"], "--fold applies to locomo, musique, hotpotqa"),
    (["eval", "locomo", "--fold", "3"], "--fold 3 does not exist"),
])
def test_a_wrong_fold_is_one_line(capsys, args, message):
    assert main(args) != 0
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
