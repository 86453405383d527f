"""Two fixed folds for the benchmarks that have no training split (LoCoMo, and the HippoRAG
MuSiQue / HotpotQA samples, whose questions are all "train"). Train on one fold, evaluate on the
other, then swap: that is how in-domain training is measured without ever scoring a question the
adapter saw. The folds are fixed here, not drawn, so every run and every engineer gets the same."""

from __future__ import annotations

from dataclasses import replace

from evsel.errors import InputError

from .records import EvalDataset

FOLDS = (1, 2)
# LoCoMo by conversation (a conversation's questions share its people and events): 999 / 987 questions.
LOCOMO_FOLDS = {
    1: ("conv-26", "conv-30", "conv-41", "conv-42", "conv-43"),
    2: ("conv-44", "conv-47", "conv-48", "conv-49", "conv-50"),
}
# MuSiQue / HotpotQA search one shared corpus, so they split by question: fold 1 holds the
# questions at even positions of the file, fold 2 the odd ones.
BY_POSITION = ("musique", "hotpotqa")
FOLDED = ("locomo", *BY_POSITION)


def check_fold(dataset: str, fold: int | None) -> None:
    if fold is None:
        return
    if dataset not in FOLDED:
        raise InputError(f"--fold applies to {', '.join(FOLDED)}, not {dataset!r}",
                         "leave --fold out for this dataset")
    if fold not in FOLDS:
        raise InputError(f"--fold {fold} does not exist", "use --fold 1 or --fold 2")


def other_fold(fold: int) -> int:
    return 2 if fold == 1 else 1


def select_fold(data: EvalDataset, fold: int) -> EvalDataset:
    """The dataset with only fold `fold`'s documents and questions."""
    name = data.name.split("-")[0]
    check_fold(name, fold)
    if name == "locomo":
        keys = set(LOCOMO_FOLDS[fold])
        unknown = set(data.loaders) - set(LOCOMO_FOLDS[1]) - set(LOCOMO_FOLDS[2])
        if unknown:
            raise InputError(f"LoCoMo conversation(s) {', '.join(sorted(unknown))} belong to no fold",
                             "the folds are fixed for the published locomo10.json")
        loaders = {k: v for k, v in data.loaders.items() if k in keys}
        questions = [q for q in data.questions if q.docs and q.docs[0] in keys]
        note = f"fold {fold}: conversations {', '.join(LOCOMO_FOLDS[fold])}"
    else:
        loaders = dict(data.loaders)
        questions = [q for i, q in enumerate(data.questions) if i % 2 == fold - 1]
        note = f"fold {fold}: the questions at {'even' if fold == 1 else 'odd'} positions of the file"
    return replace(data, name=f"{data.name}-fold{fold}", loaders=loaders, questions=questions,
                   notes=[*data.notes, f"{note} ({len(questions)} questions)"])
