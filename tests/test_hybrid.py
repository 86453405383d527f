"""The learned fusion (models/selectors/hybrid.py) and the `default` method (selectors/default.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from evsel.models.selectors import SelectorContext, get_selector
from evsel.errors import ModelError
from evsel.models.fusion import hybrid as hy
from evsel.store.store import ChunkRecord


def planted(n_questions: int, pool: int, seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Pools where qr_z is informative (the gold chunk scores +2 above the rest, with noise) and
    every other feature is noise; BM25 puts the gold chunk at a random place in the pool."""
    rng = np.random.default_rng(seed)
    xs, gs = [], []
    for _ in range(n_questions):
        x = rng.normal(size=(pool, len(hy.FEATURES)))
        gold = np.zeros(pool)
        gold[rng.integers(pool)] = 1
        x[:, hy.FEATURES.index("qr_z")] += 2.5 * gold
        xs.append(x)
        gs.append(gold)
    return xs, gs


def test_fusion_learns_the_planted_signal_and_is_never_worse_than_bm25():
    xs, gs = planted(80, 20, seed=0)
    test_x, test_g = planted(60, 20, seed=1)
    groups = list(hy.GROUPS)
    weights = hy.fit(xs, [g > 0 for g in gs], groups)
    ws = {"groups": groups, "weights": weights}
    fused = hy.evaluate([hy.score_pool(x, ws) for x in test_x], test_g)
    bm25 = hy.evaluate([x[:, hy.FEATURES.index("bm25_z")] for x in test_x], test_g)
    for key in ("recall@1", "recall@3", "recall@5", "mrr"):
        assert fused[key] >= bm25[key], key
    assert fused["recall@1"] > bm25["recall@1"] + 0.3  # it found the informative feature
    assert np.argmax(np.abs(weights)) == hy.columns(groups).index(hy.FEATURES.index("qr_z"))


def test_fusion_keeps_bm25_when_nothing_else_informs():
    """Every feature but BM25 is noise and BM25 is informative: the fit stays with BM25."""
    rng = np.random.default_rng(2)
    xs, gs = [], []
    for _ in range(80):
        x = rng.normal(size=(20, len(hy.FEATURES)))
        gold = np.zeros(20)
        gold[rng.integers(20)] = 1
        x[:, hy.FEATURES.index("bm25_z")] += 2.0 * gold
        xs.append(x)
        gs.append(gold)
    ws = {"groups": list(hy.GROUPS), "weights": hy.fit(xs[:50], [g > 0 for g in gs[:50]], list(hy.GROUPS))}
    fused = hy.evaluate([hy.score_pool(x, ws) for x in xs[50:]], gs[50:])
    bm25 = hy.evaluate([x[:, hy.FEATURES.index("bm25_z")] for x in xs[50:]], gs[50:])
    assert fused["mrr"] >= bm25["mrr"] - 0.05


def test_weights_round_trip_and_the_fallback_set(tmp_path):
    sets = [{"name": "all", "groups": list(hy.GROUPS), "weights": list(np.linspace(-1, 1, len(hy.FEATURES)))},
            {"name": "no-llm", "groups": ["bm25", "dense", "dialogue"], "weights": [1.0, 0.5, 0.2, 0.1, 0.3, -0.2]}]
    path = hy.save_weights(tmp_path, {"weight_sets": sets, "default": {"method": "bm25", "why": "test"}})
    back = hy.load_weights(tmp_path)
    assert path.name == hy.WEIGHTS_FILE and back["weight_sets"] == sets
    x = np.random.default_rng(0).normal(size=(7, len(hy.FEATURES)))
    assert np.allclose(hy.score_pool(x, back["weight_sets"][0]), x @ np.asarray(sets[0]["weights"]))
    assert hy.choose_set(back, {"bm25", "dense", "dialogue"})["name"] == "no-llm"
    assert hy.choose_set(back, set(hy.GROUPS))["name"] == "all"
    assert hy.choose_set(back, {"bm25"}) is None
    (tmp_path / hy.WEIGHTS_FILE).write_text(json.dumps({"format": hy.FORMAT, "weight_sets": [
        {"groups": ["bm25"], "weights": [1.0]}]}))
    with pytest.raises(Exception, match="has 1 weights"):
        hy.load_weights(tmp_path)


@pytest.mark.parametrize("bad", ["NaN", "Infinity", "-Infinity", '"nan"'])
def test_weights_that_are_not_finite_are_refused_in_one_line(tmp_path, bad):
    weights = ", ".join(["1.0"] * (len(hy.FEATURES) - 1) + [bad])
    (tmp_path / hy.WEIGHTS_FILE).write_text(
        f'{{"format": "{hy.FORMAT}", "weight_sets": [{{"groups": {json.dumps(list(hy.GROUPS))}, "weights": [{weights}]}}]}}')
    with pytest.raises(ModelError) as caught:
        hy.load_weights(tmp_path)
    line = str(caught.value)
    assert "not a finite number" in line and str(tmp_path / hy.WEIGHTS_FILE) in line and "\n" not in line


def turns() -> list[ChunkRecord]:
    texts = ["Ann: I went to the lake with my dog.", "Ben: The lake was cold.", "Ann: Painting is my hobby.",
             "Ben: I like the mountains and the lake.", "Cy: Nothing about water here."]
    speakers = [["Ann"], ["Ben"], ["Ann"], ["Ben"], ["Cy"]]
    return [ChunkRecord(id=i + 1, doc_id=1, seq=i, text=t, content_hash=str(i), n_tokens=10, char_start=0,
                        char_end=len(t), speakers=speakers[i]) for i, t in enumerate(texts)]


def test_hybrid_selector_orders_the_pool_by_its_weights_and_the_rest_by_bm25():
    context = SelectorContext(load_backbone=lambda: None, states=None)
    named = {"weight_sets": [{"groups": ["bm25", "dialogue"], "weights": [0.0, 0.0, 5.0, 0.0]}]}
    selector = get_selector("hybrid:bm25+dialogue", context, weights=named)
    assert not selector.needs_model and selector.name == "hybrid:bm25+dialogue"
    chunks = turns()
    ranked = selector.rank("Where did Ben go? the lake", chunks)
    assert [s.chunk.speakers for s in ranked[:2]] == [["Ben"], ["Ben"]]  # the named speaker's turns first
    # with the speaker feature weighted 0, the order is BM25's
    plain = get_selector("hybrid:bm25+dialogue", context,
                         weights={"weight_sets": [{"groups": ["bm25", "dialogue"], "weights": [1.0, 0.0, 0.0, 0.0]}]})
    bm25 = get_selector("bm25", context)
    question = "the lake"
    assert [s.chunk.id for s in plain.rank(question, chunks)] == [s.chunk.id for s in bm25.rank(question, chunks)]


def test_fused_scores_put_the_pool_first_then_bm25_order():
    bm25 = np.array([0.1, 3.0, 2.0, 0.5, 1.0])
    out = hy.fused_scores(np.array([-4.0, -5.0]), np.array([4, 0]), bm25)
    assert list(np.argsort(-out, kind="stable")) == [4, 0, 1, 2, 3]


def test_hybrid_refuses_groups_it_does_not_know():
    context = SelectorContext(load_backbone=lambda: None, states=None)
    with pytest.raises(Exception, match="bm25 among them"):
        get_selector("hybrid:dense", context)
    with pytest.raises(Exception, match="the groups are"):
        get_selector("hybrid:bm25+words", context)


class FakeBackbone:
    """A backbone without weights: whatever needs the model fails as a missing model does."""

    fingerprint = "0" * 64

    @property
    def model(self):
        from evsel.errors import ModelError

        raise ModelError("no model weights here")


def test_default_falls_back_to_bm25_once_when_the_trained_parts_are_missing(tmp_path):
    """A record naming hybrid whose weights need signals this backbone lacks: BM25, one warning."""
    from evsel.models.selectors.default import default_method
    from evsel.settings import Settings

    hy.save_weights(tmp_path, {"weight_sets": [{"groups": list(hy.GROUPS), "weights": [0.0] * len(hy.FEATURES)}],
                               "default": {"method": "hybrid", "why": "measured"}})
    events = []
    settings = Settings(hybrid_weights=str(tmp_path))
    context = SelectorContext(load_backbone=lambda: FakeBackbone(), states=None, settings=settings,
                              on_event=events.append)
    assert default_method(FakeBackbone(), settings) == ("hybrid", "measured")
    selector = get_selector("default", context)
    chunks = turns()
    ranked = selector.rank("the lake", chunks)
    ranked_again = selector.rank("the lake", chunks)
    assert [s.chunk.id for s in ranked] == [s.chunk.id for s in get_selector("bm25", context).rank("the lake", chunks)]
    assert ranked_again and selector.resolved == "bm25"
    warnings = [e for e in events if e["type"] == "warning"]
    assert len(warnings) == 1 and "using bm25" in warnings[0]["message"]
    # no record at all: BM25, and why
    assert default_method(FakeBackbone(), Settings(hybrid_weights=str(tmp_path / "none")))[0] == "bm25"


def test_the_shipped_record_names_the_tested_fusion_for_books_and_a_cheap_one_for_chats():
    """The fit chose the fusion for chats and books (the paired test on dev, every target met on
    the runs no fit looked at); the defaults record keeps it for books, tested on whole novels
    too; on chats' own warm asks it is too slow, and the fusion without the LLM, tested by the same
    rule on held-out LoCoMo questions, takes their place; PDFs, untested, stay on BM25."""
    from evsel.models.selectors.default import default_methods

    class Shipped(FakeBackbone):
        fingerprint = "b179c9523d0e6a0f" + "0" * 48

    data = hy.load_weights(hy.shipped_dir(Shipped.fingerprint))
    for kind, sets in (("dialogue", {"locomo-fold2"}), ("book", {"fairytaleqa-val", "musique-fold2", "hotpotqa-fold2"})):
        chosen = data["defaults"][kind]
        test = chosen["test"]
        assert chosen["method"] == "hybrid" and test["questions"] >= 200 and test["p"] <= test["alpha"]
        assert test["mrr"] >= test["bm25_mrr"] and test["warm_ask_ratio"] <= test["speed_limit"]
        assert sets <= {run["set"] for run in chosen["held_out"]} and all(run["met"] for run in chosen["held_out"])
    names = {ws["name"] for ws in data["weight_sets"]}
    assert {"bm25+dense", "bm25+dense@book", "bm25+dense@dialogue"} <= names  # the no-LLM ablation's weights
    # the defaults record (evsel train defaults) judged them again: books on whole novels too, and
    # each kind's warm ask on its own documents, where the chats' fusion was far over the limit
    from evsel.models.selectors.default import defaults_file, read_defaults

    record = read_defaults(defaults_file(hy.shipped_dir(Shipped.fingerprint), shipped=True))["defaults"]
    book = record["book"]
    assert book["method"] == "hybrid" and book["test"]["warm_ask_ratio"] <= book["test"]["speed_limit"]
    novels = next(run for run in book["held_out"] if run["set"] == "novels")
    assert novels["questions"] >= 40 and novels["met"] and novels["recall@3"] > novels["bm25_recall@3"]
    chats = record["dialogue"]  # the fit's fusions over the speed limit; the no-LLM one within it
    slow = [c for c in chats["candidates"] if c["candidate"] in ("hybrid", "hybrid:bm25+dense+unreal+dialogue")]
    assert len(slow) == 2 and all(c["test"]["warm_ask_ratio"] > c["test"]["speed_limit"] for c in slow)
    test = chats["test"]
    assert chats["method"] == "hybrid:bm25+dense+dialogue" and test["questions"] >= 200
    assert test["p"] <= test["alpha"] and test["mrr"] >= test["bm25_mrr"] and test["warm_ask_ratio"] <= 2.0
    assert all(run.get("candidate") == chats["candidate"] for run in chats.get("held_out", []))
    chosen = default_methods(Shipped(), None)
    assert chosen["book"][0] == "hybrid" and chosen["dialogue"][0] == "hybrid:bm25+dense+dialogue"
    assert chosen["pdf"][0] == "bm25"


@pytest.mark.model
def test_the_default_is_what_models_info_names():
    from evsel.engine import Engine
    from evsel.models.selectors import DEFAULT, MethodSpec

    engine = Engine()
    info = engine.models_info(load=False)
    assert MethodSpec.of().first.selector == DEFAULT == "default"
    selector = get_selector(DEFAULT, engine.selector_context())
    assert set(info["default_by_kind"]) == {"dialogue", "book", "pdf"} and info["default_why"]
    for kind, (method, why) in selector.chosen.items():
        assert info["default_by_kind"][kind] == {"method": method, "why": why}
    if len({m for m, _ in selector.chosen.values()}) == 1:
        assert info["default_method"] == selector.chosen["book"][0]


@pytest.mark.model
def test_train_hybrid_smoke_writes_weights_the_selector_loads(tmp_path):
    """The recipe end to end on a few FairytaleQA train questions: features cached (a rerun reads
    them back), weight sets with dev metrics, the ablation and the default they imply."""
    from helpers import shared_data

    from evsel.engine import Engine

    shared_data("fairytaleqa")
    engine = Engine()
    out = tmp_path / "hybrid"
    summary = engine.train_hybrid(str(out), {"groups": "bm25+dense+qr+dialogue"}, "evsel train hybrid --recipe smoke",
                                  recipe_name="smoke")
    data = hy.load_weights(out)
    assert data["command"].startswith("evsel train hybrid")
    assert [ws["name"] for ws in data["weight_sets"]][:1] == ["all"] and summary["train_questions"] > 0
    assert "without qr" in data["ablation"]
    # a few dev questions cannot make the fusion the default for books, and the record says why
    assert data["defaults"]["book"]["method"] == "bm25" and "held-out questions" in data["defaults"]["book"]["why"]
    rows = (out / "features" / "fairytaleqa-train.jsonl").read_text().splitlines()
    again = engine.train_hybrid(str(out), {"groups": "bm25+dense+qr+dialogue"}, "", recipe_name="smoke")
    assert (out / "features" / "fairytaleqa-train.jsonl").read_text().splitlines() == rows  # nothing recomputed
    # an extraction stopped after its first question, then resumed, writes what an uninterrupted one did
    (out / "features" / "fairytaleqa-train.jsonl").write_text(rows[0] + "\n")
    engine.train_hybrid(str(out), {"groups": "bm25+dense+qr+dialogue"}, "", recipe_name="smoke")
    assert (out / "features" / "fairytaleqa-train.jsonl").read_text().splitlines() == rows
    assert again["weight_sets"][0]["weights"] == summary["weight_sets"][0]["weights"]
    selector = get_selector("hybrid", engine.selector_context(for_eval=True), weights=str(out))
    selector.load()
    assert set(selector.weight_set["groups"]) == {"bm25", "dense", "qr", "dialogue"}


def test_train_hybrid_trains_on_an_evaluation_set_only_by_fold():
    from evsel.errors import InputError
    from evsel.recipes import hybrid as recipe

    with pytest.raises(InputError, match="--fold"):
        recipe.questions_of("locomo", None, None, True)
    with pytest.raises(InputError, match="unknown hybrid training source"):
        recipe.questions_of("fairytaleqa-val", 1, None, True)
    assert recipe.weight_set_groups(["bm25", "dense", "dialogue"]) == {
        "all": ["bm25", "dense", "dialogue"], "no-llm": ["bm25", "dense", "dialogue"],
        "bm25+dense": ["bm25", "dense"], "bm25": ["bm25"]}
    # with every group: the LLM ablations, and `hybrid:bm25+dense` as the tables name it
    assert list(recipe.weight_set_groups(["bm25", "dense", "unreal", "qr", "dialogue"])) == [
        "all", "no-unreal", "no-qr", "no-llm", "bm25+dense", "bm25"]
    assert recipe.weight_set_groups(["bm25", "dense"]) == {
        "all": ["bm25", "dense"], "no-llm": ["bm25", "dense"], "bm25": ["bm25"]}


def test_training_questions_are_spread_over_each_document():
    """A document's questions come in story order: the sample takes them evenly, not its first ones."""
    from types import SimpleNamespace

    from evsel.recipes import hybrid as recipe

    questions = [SimpleNamespace(qid=f"{d}/{i}", docs=[d]) for d in ("a", "b") for i in range(12)]
    kept = recipe.spread(questions, limit=6, per_document=3)
    assert [q.qid for q in kept] == ["a/0", "a/4", "a/8", "b/0", "b/4", "b/8"]
    assert len(recipe.spread(questions, limit=4, per_document=3)) == 4
    # few documents: more of each, still spread, so the limit is reached
    more = recipe.spread(questions, limit=8, per_document=3)
    assert [q.qid for q in more] == ["a/0", "a/3", "a/6", "a/9", "b/0", "b/3", "b/6", "b/9"]


def test_recall_counts_the_gold_the_pool_missed():
    """With each question's gold total, a question whose gold missed the pool counts as 0 and a
    half-pooled gold as half: recall is over all gold chunks, as eval's chunk recall."""
    import numpy as np

    scores = [np.array([2.0, 1.0]), np.array([2.0, 1.0])]
    gold = [np.array([1.0, 0.0]), np.array([0.0, 0.0])]
    assert hy.evaluate(scores, gold, ks=(1,))["recall@1"] == 1.0  # pooled gold only: the 2nd is skipped
    both = hy.evaluate(scores, gold, ks=(1,), totals=[2, 1])
    assert both["questions"] == 2 and both["recall@1"] == 0.25 and both["mrr"] == 0.5


# the default per kind of document (models/fusion/paired.py): a paired test against BM25 on the same questions

def _pools(n: int, hybrid_rank, bm25_rank) -> tuple[list, list, list, list]:
    """n one-gold pools of 10 whose gold sits at the given (0-based, or None: not in the pool) rank
    of question i for each method: (hybrid scores, bm25 scores, gold, totals)."""
    hybrid, bm25, gold = [], [], []
    for i in range(n):
        g = np.zeros(10)
        g[0] = 1
        gold.append(g)
        for scores, rank in ((hybrid, hybrid_rank(i)), (bm25, bm25_rank(i))):
            s = np.linspace(1.0, 0.1, 10)
            if rank is None:
                s[0] = -1.0  # below every other chunk
            else:
                s = np.roll(np.linspace(1.0, 0.1, 10)[::-1], 0)
                order = [j for j in range(1, 10)]
                order.insert(rank, 0)
                s = np.empty(10)
                s[order] = np.linspace(1.0, 0.1, 10)
            scores.append(s)
    return hybrid, bm25, gold, [1] * n


def test_the_paired_rule_refuses_a_method_better_on_recall_at_3_but_worse_on_mrr():
    from evsel.models.fusion import paired

    # the fusion finds the gold in its top 3 for every question, but at rank 3; BM25 has it first
    # for 60% of them and beyond the top 3 for the rest
    hybrid, bm25, gold, totals = _pools(300, lambda i: 2, lambda i: 0 if i % 5 < 3 else 6)
    recall, rr = paired.per_question(hybrid, gold, totals)
    base_recall, base_rr = paired.per_question(bm25, gold, totals)
    assert recall.mean() == 1.0 and base_recall.mean() == 0.6 and rr.mean() < base_rr.mean()
    chosen = paired.decide("hybrid", recall, rr, base_recall, base_rr, warm_ask_ratio=1.2)
    assert chosen["method"] == "bm25" and "MRR" in chosen["why"] and chosen["test"]["p"] <= 0.05


def test_the_paired_rule_takes_a_method_only_with_enough_questions_a_test_and_speed():
    from evsel.models.fusion import paired

    # better on both: gold first for 70% of the questions against 50% for BM25 (else rank 5)
    hybrid, bm25, gold, totals = _pools(300, lambda i: 0 if i % 10 < 7 else 5, lambda i: 0 if i % 10 < 5 else 5)
    recall, rr = paired.per_question(hybrid, gold, totals)
    base_recall, base_rr = paired.per_question(bm25, gold, totals)
    chosen = paired.decide("hybrid", recall, rr, base_recall, base_rr, warm_ask_ratio=1.5)
    assert chosen["method"] == "hybrid" and chosen["test"]["p"] < 0.001 and chosen["test"]["questions"] == 300
    assert paired.decide("hybrid", recall, rr, base_recall, base_rr, warm_ask_ratio=2.5)["method"] == "bm25"
    assert "not measured" in paired.decide("hybrid", recall, rr, base_recall, base_rr, None)["why"]
    few = paired.decide("hybrid", recall[:150], rr[:150], base_recall[:150], base_rr[:150], warm_ask_ratio=1.5)
    assert few["method"] == "bm25" and "only 150 held-out questions" in few["why"]
    # a difference the test cannot tell from chance: 52% against 50% first
    hybrid, bm25, gold, totals = _pools(300, lambda i: 0 if i % 50 < 26 else 5, lambda i: 0 if i % 2 == 0 else 5)
    noise = paired.decide("hybrid", *paired.per_question(hybrid, gold, totals), *paired.per_question(bm25, gold, totals),
                          warm_ask_ratio=1.0)
    assert noise["method"] == "bm25" and noise["test"]["p"] > 0.05


def test_sign_flip_p_values():
    from evsel.models.fusion import paired

    ten_wins = paired.sign_flip_p(np.ones(10), np.zeros(10))
    assert abs(ten_wins - 1 / 1024) < 0.001  # only the all-positive flip is as extreme
    assert paired.sign_flip_p(np.zeros(50), np.zeros(50)) == 1.0
    assert paired.sign_flip_p(np.zeros(10), np.ones(10)) == 1.0


def book_chunks() -> list[ChunkRecord]:
    texts = ["The lake froze in the winter of that year.", "Nobody spoke of the mountains.",
             "The dog ran to the lake again."]
    return [ChunkRecord(id=10 + i, doc_id=2, seq=i, text=t, content_hash=f"b{i}", n_tokens=10, char_start=0,
                        char_end=len(t), kind="book") for i, t in enumerate(texts)]


def test_the_default_runs_each_kinds_method_and_says_which(tmp_path):
    """A record choosing the fusion for chats and BM25 for books: a chat scope runs the fusion, a
    book scope BM25, a scope of both ranks each kind by its own method; models info says so."""
    from dataclasses import replace

    from evsel.models.selectors.default import default_method, default_methods
    from evsel.settings import Settings

    speaker_first = {"groups": ["bm25", "dialogue"], "weights": [0.0, 0.0, 5.0, 0.0]}
    hy.save_weights(tmp_path, {"weight_sets": [speaker_first], "defaults": {
        "dialogue": {"method": "hybrid:bm25+dialogue", "why": "planted"},
        "book": {"method": "bm25", "why": "planted too"}}})
    settings = Settings(hybrid_weights=str(tmp_path))
    methods = default_methods(FakeBackbone(), settings)
    assert methods["dialogue"][0] == "hybrid:bm25+dialogue" and methods["book"][0] == "bm25"
    assert methods["pdf"][0] == "bm25" and "not measured on pdf documents" in methods["pdf"][1]
    assert default_method(FakeBackbone(), settings)[0] == "by kind"
    context = SelectorContext(load_backbone=lambda: FakeBackbone(), states=None, settings=settings)
    chat = [replace(c, kind="dialogue") for c in turns()]
    question = "Where did Ben go? the lake"
    fused = get_selector("hybrid:bm25+dialogue", context, weights={"weight_sets": [speaker_first]})
    bm25 = get_selector("bm25", context)

    selector = get_selector("default", context)
    assert not selector.needs_model
    assert [s.chunk.id for s in selector.rank(question, chat)] == [s.chunk.id for s in fused.rank(question, chat)]
    assert selector.resolved == "hybrid:bm25+dialogue"
    books = book_chunks()
    assert [s.chunk.id for s in selector.rank(question, books)] == [s.chunk.id for s in bm25.rank(question, books)]
    assert selector.resolved == "bm25"
    mixed = selector.rank(question, chat + books)
    assert selector.resolved == "hybrid:bm25+dialogue (dialogue) + bm25 (book)"
    # each kind in its own method's order, merged on BM25's scale over the whole scope
    assert [s.chunk.id for s in mixed if s.chunk.kind == "dialogue"] == [s.chunk.id for s in fused.rank(question, chat)]
    assert [s.chunk.id for s in mixed if s.chunk.kind == "book"] == [s.chunk.id for s in bm25.rank(question, books)]
    whole = {s.chunk.id: s.score for s in bm25.rank(question, chat + books)}
    assert sorted(s.score for s in mixed) == sorted(whole.values())  # the scores shown are BM25's
    # a kind without the question's words gets no share of the top: a question only the chat answers
    painting = "Which hobby is painting?"
    top = selector.rank(painting, chat + books, 3)
    assert top[0].chunk.kind == "dialogue" and top[0].score > 0
    assert all(s.chunk.kind == "dialogue" for s in top if s.score > 0)
    assert [s.chunk.kind for s in selector.rank("the lake froze in winter", chat + books, 1)] == ["book"]


def _rows(n: int, kind_sign: float, seed: int) -> list[dict]:
    """Feature rows of n pools of 8 whose gold is the chunk with the highest (kind_sign = 1) or
    lowest (-1) dense z-score, BM25 uninformative: the two kinds want opposite dense weights."""
    rng = np.random.default_rng(seed)
    rows = []
    for q in range(n):
        x = np.zeros((8, len(hy.FEATURES)))
        x[:, hy.FEATURES.index("bm25_z")] = rng.normal(size=8)
        dense = rng.normal(size=8)
        x[:, hy.FEATURES.index("dense_z")] = dense
        gold = np.zeros(8)
        gold[int(np.argmax(kind_sign * dense))] = 1
        rows.append({"id": f"q{seed}-{q}", "x": x.tolist(), "gold": gold.tolist(), "gold_total": 1})
    return rows


def test_one_model_per_kind_is_kept_where_it_beats_the_pooled_one_and_scores_that_kind(tmp_path):
    from evsel.recipes import hybrid as recipe

    runs = [{"name": "chats", "dev_name": "chats-dev", "kind": "dialogue", "train": _rows(60, 1.0, 1),
             "dev": _rows(40, 1.0, 2)},
            {"name": "books", "dev_name": "books-dev", "kind": "book", "train": _rows(60, -1.0, 3),
             "dev": _rows(40, -1.0, 4)}]
    fitted = recipe.fit_by_kind(runs, ["bm25", "dense"], warm_ask_ratio=1.0)
    for kind in ("dialogue", "book"):
        compared = fitted["per_kind"][kind]
        assert compared["kept"] == "own" and compared["own"]["recall@3"] > compared["pooled"]["recall@3"] + 0.2
        # 40 dev questions: too few for the default, whatever the gain
        assert fitted["defaults"][kind]["method"] == "bm25" and "only 40" in fitted["defaults"][kind]["why"]
    dense_weight = hy.columns(["bm25", "dense"]).index(hy.FEATURES.index("dense_z"))
    by_kind = {ws.get("kind"): ws for ws in fitted["weight_sets"] if ws["name"].startswith("all")}
    assert by_kind["dialogue"]["weights"][dense_weight] > 0 > by_kind["book"]["weights"][dense_weight]
    # the selector scores each kind's scope with that kind's set, a mixed one with the pooled set
    data = {"weight_sets": fitted["weight_sets"]}
    assert hy.choose_set(data, {"bm25", "dense"}, "book") is by_kind["book"]
    assert hy.choose_set(data, {"bm25", "dense"}, "pdf") is by_kind[None]
    assert hy.choose_set(data, {"bm25", "dense"}) is by_kind[None]
    # one source, one kind: no per-kind sets
    single = recipe.fit_by_kind(runs[:1], ["bm25", "dense"], warm_ask_ratio=1.0)
    assert single["per_kind"] == {} and all("kind" not in ws for ws in single["weight_sets"])


def test_the_hybrid_scores_a_scope_with_the_set_fitted_for_its_kind():
    from dataclasses import replace

    context = SelectorContext(load_backbone=lambda: None, states=None)
    pooled = {"name": "all", "groups": ["bm25", "dialogue"], "weights": [1.0, 0.0, 0.0, 0.0]}
    chats = {"name": "all@dialogue", "kind": "dialogue", "groups": ["bm25", "dialogue"], "weights": [0.0, 0.0, 5.0, 0.0]}
    selector = get_selector("hybrid:bm25+dialogue", context, weights={"weight_sets": [pooled, chats]})
    question = "Where did Ben go? the lake"
    as_chat = [replace(c, kind="dialogue") for c in turns()]
    assert [s.chunk.speakers for s in selector.rank(question, as_chat)[:2]] == [["Ben"], ["Ben"]]
    as_book = [replace(c, kind="book") for c in turns()]
    bm25 = get_selector("bm25", context)
    assert [s.chunk.id for s in selector.rank(question, as_book)] == [s.chunk.id for s in bm25.rank(question, as_book)]


def _unreal_rows(n: int, seed: int) -> list[dict]:
    """Pools of 8 whose gold is the chunk UNREAL ranks first, BM25 right only half the time."""
    rng = np.random.default_rng(seed)
    rows = []
    for q in range(n):
        x = np.zeros((8, len(hy.FEATURES)))
        unreal = rng.normal(size=8)
        gold_at = int(np.argmax(unreal))
        bm25 = rng.normal(size=8)
        if q % 2:
            bm25[gold_at] = bm25.max() + 1.0
        for name, values in (("bm25_z", bm25), ("unreal_z", unreal), ("dense_z", rng.normal(size=8)),
                             ("qr_z", rng.normal(size=8))):
            x[:, hy.FEATURES.index(name)] = values
        gold = np.zeros(8)
        gold[gold_at] = 1
        rows.append({"id": f"u{seed}-{q}", "x": x.tolist(), "gold": gold.tolist(), "gold_total": 1})
    return rows


def test_the_default_is_the_best_candidate_that_passes_with_its_own_speed():
    from evsel.recipes import hybrid as recipe

    runs = [{"name": "chats", "dev_name": "chats-dev", "kind": "dialogue", "train": _unreal_rows(200, 1),
             "dev": _unreal_rows(240, 2)}]
    available = ["bm25", "dense", "unreal", "qr"]
    sets = recipe.fit_sets(runs[0]["train"], runs[0]["dev"], available)[0]
    # a set without UNREAL would rank a smaller pool (no UNREAL top chunks) than its dev metrics
    # assume: only the sets holding every pooling signal are candidates
    assert [recipe.method_of(ws, sets) for ws in recipe.candidates(sets)] == ["hybrid", "hybrid:bm25+dense+unreal"]
    slow_full = recipe.fit_by_kind(runs, available, {"hybrid": 2.3, "hybrid:bm25+dense+unreal": 1.5})
    chosen = slow_full["defaults"]["dialogue"]
    assert chosen["method"] == "hybrid:bm25+dense+unreal" and "1.50x" in chosen["why"]
    verdicts = {c["candidate"]: c for c in chosen["candidates"]}
    assert verdicts["hybrid"]["method"] == "bm25" and "2.30x" in verdicts["hybrid"]["why"]
    # two candidates tested: each at half the level
    assert all(c["test"]["alpha"] == 0.025 for c in chosen["candidates"])
    # a number alone is the full fusion's; the other candidate, unmeasured, cannot pass
    only_full = recipe.fit_by_kind(runs, available, 1.2)["defaults"]["dialogue"]
    assert only_full["method"] == "hybrid"
    assert "not measured" in {c["candidate"]: c for c in only_full["candidates"]}["hybrid:bm25+dense+unreal"]["why"]
    none = recipe.fit_by_kind(runs, available, None)["defaults"]["dialogue"]
    assert none["method"] == "bm25" and none["why"].startswith("hybrid is not the default")


def test_a_kind_whose_candidate_missed_a_held_out_target_stays_on_bm25():
    """The paired test on dev passes the candidate; a run no fit looked at that misses its target
    keeps the kind on BM25, with the candidate, its test and every run kept; a met run changes nothing."""
    from evsel.recipes import hybrid as recipe

    runs = [{"name": "chats", "dev_name": "chats-dev", "kind": "dialogue", "train": _unreal_rows(200, 1),
             "dev": _unreal_rows(240, 2)}]
    available = ["bm25", "dense", "unreal", "qr"]
    passed = recipe.fit_by_kind(runs, available, 1.2)["defaults"]
    assert passed["dialogue"]["method"] == "hybrid"
    met = {"kind": "dialogue", "set": "chats-a", "questions": 230, "recall@3": 0.70, "target": "recall@3 >= bm25's + 0.04 (0.66)",
           "met": True, "missed_by": 0.0}
    missed = dict(met, set="chats-b", **{"recall@3": 0.62}, met=False, missed_by=0.012)
    book = dict(missed, kind="book", set="stories")  # another kind's run leaves chats alone
    kept = recipe.apply_held_out(recipe.fit_by_kind(runs, available, 1.2)["defaults"], [met, book])["dialogue"]
    assert kept["method"] == "hybrid" and kept["held_out"] == [met] and "met every target" in kept["why"]
    assert "chats-a 0.700, target bm25's + 0.04 (0.66)" in kept["why"]
    stayed = recipe.apply_held_out(recipe.fit_by_kind(runs, available, 1.2)["defaults"], [met, missed])["dialogue"]
    assert stayed["method"] == "bm25" and stayed["candidate"] == "hybrid" and stayed["held_out"] == [met, missed]
    assert "chats-b (230 questions)" in stayed["why"] and "missed by 1.2 points" in stayed["why"]
    assert stayed["test"] == passed["dialogue"]["test"]


def test_held_out_entries_are_checked_before_training(tmp_path, capsys, evsel_home):
    from daemon_helpers import run_cli

    bad = tmp_path / "held.json"
    for text in ('[{"kind": "book"}]', "not json"):
        bad.write_text(text)
        code, _, err = run_cli(capsys, "--no-daemon", "train", "defaults", "--out", str(tmp_path / "out"),
                               "--held-out", str(bad))
        assert code == 1 and "docs/FUSION.md" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_an_ask_needs_the_model_only_for_the_kinds_in_its_scope(tmp_path):
    """The fusion for chats needs the model; an evidence-only ask about books (BM25) does not, so
    the daemon answers it beside background work instead of queueing it behind the model."""
    from dataclasses import replace

    from evsel.models.selectors.default import resolve
    from evsel.pipeline import needs_model
    from evsel.settings import Settings

    speaker_first = {"groups": ["bm25", "unreal", "dialogue"], "weights": [0.0, 0.0, 0.0, 0.0, 5.0, 0.0]}
    hy.save_weights(tmp_path, {"weight_sets": [speaker_first], "defaults": {
        "dialogue": {"method": "hybrid:bm25+unreal+dialogue", "why": "planted"},
        "book": {"method": "bm25", "why": "planted too"}}})
    settings = Settings(hybrid_weights=str(tmp_path))
    assert not needs_model(None, settings, evidence_only=True, scope_kinds=lambda: {"book"})
    assert needs_model(None, settings, evidence_only=True, scope_kinds=lambda: {"dialogue", "book"})
    assert needs_model(None, settings, evidence_only=True)  # the scope unknown: any kind's method
    context = SelectorContext(load_backbone=lambda: FakeBackbone(), states=None, settings=settings)
    assert get_selector("default", context).needs_model
    selector = get_selector("default", context, resolution=resolve("default", settings, FakeBackbone, {"book"}))
    assert not selector.needs_model
    selector.load()  # only BM25's: the fusion's parts (and the model) are not loaded for books
    assert [s.chunk.id for s in selector.rank("Where did Ben go?", book_chunks())] == \
        [s.chunk.id for s in get_selector("bm25", context).rank("Where did Ben go?", book_chunks())]
    kinds = {c.kind for c in [replace(c, kind="dialogue") for c in turns()]}
    assert get_selector("default", context, resolution=resolve("default", settings, FakeBackbone, kinds)).needs_model


def test_the_fusion_ranks_with_what_is_ready_and_encodes_nothing_for_the_scope(tmp_path):
    """Dense embeddings not yet stored for the scope: the fusion ranks by BM25 alone, says dense
    is waiting, and stores nothing; once the ingest hook has embedded the chunks, dense joins."""
    from dataclasses import replace

    from evsel.models.selectors import IngestWork
    from evsel.models.selectors.dense import DenseSelector
    from evsel.models.shared.statecache import StateCache
    from evsel.store.store import Store, connect

    store = Store(connect(tmp_path / "evsel.db"))
    context = SelectorContext(load_backbone=lambda: None, states=StateCache(store), store=store)
    weights = {"weight_sets": [{"name": "bm25", "groups": ["bm25"], "weights": [1.0, 0.0]},
                               {"name": "bm25+dense", "groups": ["bm25", "dense"], "weights": [0.0, 0.0, 5.0, 0.0]}]}
    chunks = [replace(c, kind="dialogue") for c in turns()]
    question = "Which hobby does Ann have?"
    bm25 = get_selector("bm25", context)

    cold = get_selector("hybrid:bm25+dense", context, weights=weights)
    cold.only_ready = True  # as the default runs it
    ranked = cold.ranking(question, chunks)
    assert ranked.extras["signals"] == {"ran": ["bm25"], "waiting": {"dense": "0 of 5 chunks encoded"}}
    assert [s.chunk.id for s in ranked.scored] == [s.chunk.id for s in bm25.rank(question, chunks)]
    assert store.db.execute("select count(*) from chunk_states").fetchone()[0] == 0  # nothing encoded now

    assert DenseSelector.ingest_work(chunks, IngestWork(context, None))["dense_encoded"] == 5
    warm = get_selector("hybrid:bm25+dense", context, weights=weights)
    warm.only_ready = True
    ranked = warm.ranking(question, chunks)
    assert ranked.extras["signals"] == {"ran": ["bm25", "dense"], "waiting": {}}
    dense = get_selector("dense", context)
    assert [s.chunk.id for s in ranked.scored][:1] == [s.chunk.id for s in dense.rank(question, chunks)][:1]

    # asked for by name (--select hybrid), it encodes what it lacks and ranks with every signal
    others = [replace(c, content_hash="new" + c.content_hash) for c in chunks]
    named = get_selector("hybrid:bm25+dense", context, weights=weights)
    assert named.ranking(question, others).extras["signals"] == {"ran": ["bm25", "dense"], "waiting": {}}
    assert store.db.execute("select count(*) from chunk_states").fetchone()[0] == 10


def test_train_defaults_judges_the_fits_candidate_again_and_the_default_reads_its_record(tmp_path, capsys, evsel_home):
    """`evsel train defaults`: the fit chose the fusion for chats and books; a novel run no fit
    looked at misses its target, so books go to BM25 and say why; chats keep the fusion with the
    fit's own held-out run; the default reads the record, kept apart from the weights."""
    from daemon_helpers import run_cli
    from evsel.models.selectors.default import default_methods
    from evsel.recipes import hybrid as recipe
    from evsel.settings import Settings

    runs = [{"name": "chats", "dev_name": "chats-dev", "kind": "dialogue", "train": _unreal_rows(200, 1),
             "dev": _unreal_rows(240, 2)}]
    fitted = recipe.fit_by_kind(runs, ["bm25", "dense", "unreal", "qr"], 1.2)
    old = {"kind": "dialogue", "set": "chats-a", "questions": 230, "recall@3": 0.70, "met": True, "missed_by": 0.0,
           "target": "recall@3 >= bm25's + 0.04 (0.66)"}
    defaults = recipe.apply_held_out(fitted["defaults"], [old])
    defaults["book"] = json.loads(json.dumps(defaults["dialogue"]))
    defaults["book"]["held_out"] = []
    weights = tmp_path / "weights"
    hy.save_weights(weights, {"weight_sets": fitted["weight_sets"], "defaults": defaults})
    novels = dict(old, kind="book", set="novels", questions=52, **{"recall@3": 0.31}, met=False, missed_by=0.03,
                  target="recall@3 >= bm25's + 0.03 (0.34)")
    held = tmp_path / "held.json"
    held.write_text(json.dumps([novels]))
    assert default_methods(FakeBackbone(), Settings(hybrid_weights=str(weights)))["book"][0] == "hybrid"

    code, out, err = run_cli(capsys, "train", "defaults", "--weights", str(weights), "--held-out", str(held),
                             "--out", str(weights), "--json")
    assert code == 0, err
    record = json.loads(out)["defaults"]
    assert record["book"]["method"] == "bm25" and "novels (52 questions)" in record["book"]["why"]
    assert record["dialogue"]["method"] == "hybrid" and record["dialogue"]["held_out"] == [old]
    assert record["dialogue"]["why"].count("met every target") == 1  # judged once, not once per run of the step
    chosen = default_methods(FakeBackbone(), Settings(hybrid_weights=str(weights)))
    assert chosen["book"][0] == "bm25" and "novels" in chosen["book"][1] and chosen["dialogue"][0] == "hybrid"
    assert json.loads((weights / "hybrid.json").read_text())["defaults"]["book"]["method"] == "hybrid"  # weights untouched

    # warm asks measured on chats: the full fusion over the speed limit drops out, the next passing
    # candidate (or BM25) takes its place, and the record keeps why
    code, out, err = run_cli(capsys, "train", "defaults", "--weights", str(weights), "--held-out", str(held),
                             "--out", str(tmp_path / "slow"), "--json", "--warm-ask-ratio", "dialogue:hybrid=4.0")
    assert code == 0, err
    chats = json.loads(out)["defaults"]["dialogue"]
    assert chats["method"] != "hybrid"
    dropped = next(c for c in chats["candidates"] if c["candidate"] == "hybrid")
    assert dropped["method"] == "bm25" and "4.00x a BM25 one (limit 2.0x)" in dropped["why"]
    code, _, err = run_cli(capsys, "train", "defaults", "--weights", str(weights), "--held-out", str(held),
                           "--out", str(tmp_path / "bad"), "--warm-ask-ratio", "novel:hybrid=1.2")
    assert code != 0 and "dialogue, book or pdf" in err

    # a cheaper method the fit did not propose, judged by the same rule on held-out eval rows and
    # its own warm ask: it takes the chats' place when it passes
    rng = np.random.default_rng(0)
    base = (rng.random(240) < 0.6).astype(float)
    better = np.maximum(base, (rng.random(240) < 0.2).astype(float))

    def rows(values):
        return [{"qid": str(i), "gold": [1], "ranking": {"recall@3": v, "mrr": v}} for i, v in enumerate(values)]

    run = tmp_path / "run.json"
    run.write_text(json.dumps({"dataset": {"name": "chats-held-out", "separate_groups": []},
                               "per_question": {"bm25": rows(base), "hybrid:bm25+dense": rows(better)}}))
    code, out, err = run_cli(capsys, "train", "defaults", "--weights", str(weights), "--held-out", str(held),
                             "--out", str(tmp_path / "cheap"), "--json", "--warm-ask-ratio", "dialogue:hybrid=4.0",
                             "--warm-ask-ratio", "dialogue:hybrid:bm25+dense=1.1",
                             "--candidate", f"dialogue:hybrid:bm25+dense={run}")
    assert code == 0, err
    chats = json.loads(out)["defaults"]["dialogue"]
    assert chats["method"] == "hybrid:bm25+dense" and "chats-held-out" in chats["candidates"][-1]["dev"]
    assert chats["test"]["warm_ask_ratio"] == 1.1 and chats["test"]["questions"] == 240
