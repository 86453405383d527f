"""`evsel train hybrid`: the learned fusion's weights (models/selectors/hybrid.py).

Two steps. Extraction runs the signals once per (source, question): the hybrid selector's pool
and features with every group the backbone has, appended to OUT/features/<source>.jsonl (a rerun
skips the questions already there; the features do not depend on the weights). Fitting is then
seconds: one weight set per group of signals (all of them, and fallbacks without the LLM's parts),
the ablation (each group left out), dev metrics of the pool's order beside BM25's, and the method
`default` should run for the source's kind of document (hybrid only when it passes
models/fusion/paired.py's rule on the dev questions, with and without the position prior, else bm25), all
in OUT/hybrid.json with the command that made it.

Sources are training splits only: FairytaleQA train (dev: every DEV_EVERY-th story, held out), or
one fold of LoCoMo / MuSiQue / HotpotQA (dev: the other fold; evaluate on it with
`evsel eval DATASET --fold M`)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np

from evsel.ingest.chunker import DEFAULT_CHUNK_TOKENS
from evsel.errors import InputError
from evsel.models.selectors import SelectorContext, get_selector
from evsel.models.fusion import hybrid as hy
from evsel.models.fusion import paired

from .common import ignore_event, pick_recipe

SOURCES = ("fairytaleqa-train", "locomo", "musique", "hotpotqa")
DEV_EVERY = 5  # FairytaleQA train: every 5th story (sorted) is dev
SMOKE = {"questions": 3, "dev_questions": 2, "per_document": 1}
FULL = {"questions": 240, "dev_questions": 120, "per_document": 6}


def weight_set_groups(available: list[str]) -> dict[str, list[str]]:
    """The weight sets trained (name -> groups): all available signals, without each LLM group,
    without both (the fallback a backbone lacking its trained parts uses), BM25 with dense alone
    (`hybrid:bm25+dense`, the plainest fusion)."""
    full = [g for g in hy.GROUPS if g in available]
    sets = {"all": full}
    for drop in hy.LLM_GROUPS:
        if drop in full:
            sets[f"no-{drop}"] = [g for g in full if g != drop]
    sets["no-llm"] = [g for g in full if g not in hy.LLM_GROUPS]
    if "dense" in full and sets["no-llm"] != ["bm25", "dense"]:
        sets["bm25+dense"] = ["bm25", "dense"]  # the no-LLM ablation without the dialogue cues
    sets["bm25"] = ["bm25"]
    return sets


def questions_of(source: str, fold: int | None, data_dir, split_dev: bool):
    """(dataset, train questions, dev questions) of a source; only questions with gold."""
    from evsel.evaluation.datasets import load_dataset
    from evsel.evaluation.folds import other_fold

    if source == "fairytaleqa-train":
        if fold is not None:
            raise InputError("--fold applies to locomo, musique and hotpotqa", "leave --fold out for fairytaleqa-train")
        data = load_dataset("fairytaleqa", data_dir, split="train")
        stories = sorted(data.loaders)
        dev_keys = set(stories[::DEV_EVERY])
        qs = [q for q in data.questions if q.gold and q.docs]
        return data, data, [q for q in qs if q.docs[0] not in dev_keys], [q for q in qs if q.docs[0] in dev_keys]
    if source not in SOURCES:
        raise InputError(f"unknown hybrid training source {source!r}", f"use one of: {', '.join(SOURCES)}")
    if fold is None:
        raise InputError(f"{source} is an evaluation set: train on one fold of it", "add --fold 1 or --fold 2")
    train = load_dataset(source, data_dir, fold=fold)
    dev = load_dataset(source, data_dir, fold=other_fold(fold))
    return train, dev, [q for q in train.questions if q.gold and q.docs], [q for q in dev.questions if q.gold and q.docs]


def spread(questions: list, limit: int, per_document: int) -> list:
    """At most `per_document` questions a document, evenly spaced over its questions (the datasets
    list a document's questions in story or session order: the first few would all ask about its
    start), then `limit` of them evenly spaced."""
    by_doc: dict[str, list] = {}
    for q in questions:
        by_doc.setdefault(q.docs[0], []).append(q)
    if len(by_doc) == 1:  # MuSiQue / HotpotQA: one shared corpus
        kept = list(questions)
    else:
        kept = []
        # few documents (a LoCoMo fold has five): take more of each, so `limit` can be reached
        per_document = max(per_document, -(-limit // len(by_doc)))
        for qs in by_doc.values():
            n = min(per_document, len(qs))
            kept += [qs[(i * len(qs)) // n] for i in range(n)]
    if len(kept) <= limit:
        return kept
    return [kept[(i * len(kept)) // limit] for i in range(limit)]


def extract(engine, dataset, questions: list, path: Path, selector, groups: list[str], on_event=ignore_event) -> list[dict]:
    """Each question's pool features, from `path` where already there, else computed and appended."""
    from evsel.evaluation.runner import build_corpus, gold_units

    done: dict[str, dict] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if row.get("groups") == groups:
                done[row["id"]] = row
    todo = [q for q in questions if q.qid not in done]
    if todo:
        # every question's documents, not only those left: chunk ids, which the rows keep, are the
        # same in a resumed run as in one that never stopped
        keys = list(dict.fromkeys(k for q in questions for k in q.docs))
        corpus = build_corpus(dataset, keys, engine.backbone, DEFAULT_CHUNK_TOKENS, on_event)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as handle:
            for n, q in enumerate(todo):
                on_event({"type": "progress", "task": "features", "label": f"features {q.qid[-30:]}",
                          "done": n, "total": len(todo)})
                chunks = corpus.scope(list(q.docs))
                units = gold_units(q, corpus, {})
                gold_ids = set().union(*units) if units else set()
                if not gold_ids:
                    continue
                pool, x, _ = selector.features(q.question, chunks, groups)
                row = {"id": q.qid, "groups": groups, "pool": [chunks[i].id for i in pool.tolist()],
                       "x": np.round(x, 5).tolist(), "gold": [int(chunks[i].id in gold_ids) for i in pool.tolist()],
                       "gold_total": len(gold_ids)}
                handle.write(json.dumps(row) + "\n")
                handle.flush()
                done[q.qid] = row
    return [done[q.qid] for q in questions if q.qid in done]


def arrays(rows: list[dict]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    return [np.asarray(r["x"], dtype=np.float64) for r in rows], [np.asarray(r["gold"], dtype=np.float64) for r in rows]


def fit_sets(train_rows: list[dict], dev_rows: list[dict], available: list[str]) -> tuple[list[dict], dict]:
    """The weight sets and the ablation (dev metrics of the full set without each group)."""
    xs, gs = arrays(train_rows)
    dxs, dgs = arrays(dev_rows)
    # recall over every gold chunk of the scope, those the pool missed too (eval's chunk recall)
    totals, dev_totals = [r["gold_total"] for r in train_rows], [r["gold_total"] for r in dev_rows]
    sets = []
    for name, groups in weight_set_groups(available).items():
        weights = [1.0] + [0.0] * (len(hy.columns(groups)) - 1) if name == "bm25" else hy.fit(xs, [g > 0 for g in gs], groups)
        ws = {"name": name, "groups": groups, "weights": weights}
        ws["dev"] = hy.evaluate([hy.score_pool(x, ws) for x in dxs], dgs, totals=dev_totals)
        ws["train"] = hy.evaluate([hy.score_pool(x, ws) for x in xs], gs, totals=totals)
        sets.append(ws)
    full = sets[0]["groups"]
    ablation = {}
    for drop in full:
        if drop == "bm25":
            continue
        groups = [g for g in full if g != drop]
        ws = {"groups": groups, "weights": hy.fit(xs, [g > 0 for g in gs], groups)}
        ablation[f"without {drop}"] = hy.evaluate([hy.score_pool(x, ws) for x in dxs], dgs, totals=dev_totals)
    at = hy.FEATURES.index("position")

    def zeroed(rows):
        return [np.where(np.arange(x.shape[1]) == at, 0.0, x) for x in rows]

    # the position prior apart from the speaker cue: each default candidate fitted with it zeroed
    for ws in candidates(sets):
        if "dialogue" in ws["groups"]:
            plain = {"groups": ws["groups"], "weights": hy.fit(zeroed(xs), [g > 0 for g in gs], ws["groups"])}
            key = "without position" if ws is sets[0] else f"{ws['name']} without position"
            ablation[key] = hy.evaluate([hy.score_pool(x, plain) for x in zeroed(dxs)], dgs, totals=dev_totals)
    for group in full:  # each signal alone (its z-score), on the pool
        cols = hy.columns([group])
        ablation[f"{group} alone"] = hy.evaluate([x[:, cols[0]] for x in dxs], dgs, totals=dev_totals)
    return sets, ablation


def candidates(sets: list[dict]) -> list[dict]:
    """The weight sets that may become a default: those whose dev metrics are exactly what `ask`
    runs. The pool is the union of the top chunks of BM25 and of every pooling signal the features
    hold (dense, UNREAL), so a set without one of them would rank a smaller pool at ask time than
    its dev metrics assume."""
    pooling = {g for g in sets[0]["groups"] if g in hy.POOLING_GROUPS}
    return [ws for ws in sets if ws["name"] != "bm25" and pooling <= set(ws["groups"])]


def method_of(ws: dict, sets: list[dict]) -> str:
    """How `--select` names a weight set: `hybrid` for the one with every signal (what plain
    `hybrid` loads), `hybrid:GROUPS` for another."""
    return "hybrid" if ws is sets[0] else "hybrid:" + "+".join(ws["groups"])


def warm_ask_ratios(given) -> dict[str, float]:
    """--warm-ask-ratio's figures by method: a number alone is the hybrid's (all signals)."""
    if given is None:
        return {}
    if isinstance(given, (int, float)):
        return {"hybrid": float(given)}
    return {str(k): float(v) for k, v in dict(given).items()}


def choose_default(sets: list[dict], ablation: dict, dev_rows: list[dict], dev_name: str,
                   warm_ask_ratio) -> dict:
    """The default for the dev questions' kind of document: each candidate weight set (`candidates`)
    against BM25 on the same pools by models/fusion/paired.py's rule, at a level divided among the
    candidates (Bonferroni: several are tested), and the passing one with the best dev recall@3.
    A prior on where the gold sits in a document is a property of the training set's questions, not
    evidence: a candidate must also beat BM25 on recall@3 with that prior left out.
    `warm_ask_ratio`: {method: its warm ask over BM25's} (a number alone: the hybrid's)."""
    dxs, dgs = arrays(dev_rows)
    totals = [r["gold_total"] for r in dev_rows]
    bm25_set = next(s for s in sets if s["name"] == "bm25")
    base_recall, base_rr = paired.per_question([hy.score_pool(x, bm25_set) for x in dxs], dgs, totals)
    ratios = warm_ask_ratios(warm_ask_ratio)
    tried = candidates(sets)
    alpha = paired.ALPHA / max(1, len(tried))
    decisions = []
    for ws in tried:
        method = method_of(ws, sets)
        recall, rr = paired.per_question([hy.score_pool(x, ws) for x in dxs], dgs, totals)
        decision = paired.decide(method, recall, rr, base_recall, base_rr, ratios.get(method), alpha=alpha)
        plain = ablation.get("without position" if ws is sets[0] else f"{ws['name']} without position")
        if decision["method"] == method and plain and plain["recall@3"] <= bm25_set["dev"]["recall@3"]:
            decision.update(method=paired.FALLBACK, why=(
                f"{method} is not the default: without the position prior its recall@3 {plain['recall@3']:.3f} "
                f"does not beat BM25's {bm25_set['dev']['recall@3']:.3f}"))
        decision["candidate"] = method
        decisions.append(decision)
    passing = [d for d in decisions if d["method"] != paired.FALLBACK]
    if passing:
        chosen = dict(max(passing, key=lambda d: (d["test"]["recall@3"], -d["test"]["warm_ask_ratio"])))
    elif decisions:  # BM25 stays; the record says why for the first candidate (the full fusion) and keeps the rest
        chosen = dict(decisions[0])
    else:
        chosen = {"method": paired.FALLBACK, "why": "no weight set ranks the whole pool", "test": {}}
    chosen["dev"] = dev_name
    chosen["candidates"] = [{k: d[k] for k in ("candidate", "method", "why", "test")} for d in decisions]
    return chosen


def apply_held_out(defaults: dict, held_out: list[dict]) -> dict:
    """The last word on each kind: where its candidate missed a target on a run no fit looked at
    (`evsel train defaults --held-out`'s entries, docs/FUSION.md), the kind stays on BM25; the
    record keeps the candidate, its test and every such run, met or not."""
    for kind, chosen in defaults.items():
        runs = [entry for entry in held_out if entry.get("kind") == kind]
        if not runs:
            continue
        chosen["held_out"] = runs
        missed = [entry for entry in runs if not entry["met"]]
        if not missed and chosen["method"] != paired.FALLBACK:
            chosen["why"] += "; and it met every target where no fit looked (recall@3: " + ", ".join(
                f"{entry['set']} {entry['recall@3']:.3f}, target {entry['target'].removeprefix('recall@3 >= ')}"
                for entry in runs) + ")"
        if missed and chosen["method"] != paired.FALLBACK:
            candidate, test = chosen["method"], chosen.get("test", {})
            chosen.update(method=paired.FALLBACK, why=(
                f"{candidate} passed the paired test on {test.get('questions')} held-out {chosen.get('dev')} questions "
                f"(recall@3 {test.get('recall@3', 0):.3f} vs BM25's {test.get('bm25_recall@3', 0):.3f}, "
                f"p = {test.get('p')}) but missed the target where no fit looked: " + "; ".join(
                    f"{entry['set']} ({entry['questions']} questions) recall@3 {entry['recall@3']:.3f}, target "
                    f"{entry['target']}, missed by {100 * entry['missed_by']:.1f} points" for entry in missed)
                + f": {kind} stays on BM25"))
    return defaults


def eval_candidate(method: str, record: dict, warm_ask_ratio: float | None, alpha: float) -> dict:
    """A candidate the fit did not propose, judged by models/fusion/paired.py's rule on an `evsel eval
    --per-question` result holding it and BM25 (held-out questions of one kind, the dataset's
    separately reported groups left out, as eval's headline does)."""
    separate = set(record["dataset"].get("separate_groups") or [])
    per_question = record.get("per_question", {})
    if method not in per_question or "bm25" not in per_question:
        raise InputError(f"the result for --candidate {method} holds no per-question rows of {method} and bm25",
                         f"run: evsel eval DATASET --methods bm25,{method} --json --per-question")
    rows = {m: [q for q in per_question[m] if q.get("group") not in separate and q.get("gold")] for m in (method, "bm25")}
    if [q["qid"] for q in rows[method]] != [q["qid"] for q in rows["bm25"]]:
        raise InputError(f"{method} and bm25 were not scored on the same questions", "rerun evsel eval with both methods")
    column = {m: {k: np.array([q["ranking"][k] for q in rows[m]], dtype=np.float64) for k in ("recall@3", "mrr")}
              for m in rows}
    decision = paired.decide(method, column[method]["recall@3"], column[method]["mrr"], column["bm25"]["recall@3"],
                             column["bm25"]["mrr"], warm_ask_ratio, alpha=alpha)
    return {"candidate": method, **decision, "dev": f"{record['dataset']['name']} (evsel eval, held out)"}


def rejudge_speed(fitted: dict, ratios: dict[str, float]) -> dict:
    """The fit's choice for one kind again, with warm ask ratios measured on that kind's documents
    ({method: its warm ask over BM25's}): a candidate over the speed limit drops out, and the best
    of the rest by dev recall@3 is chosen (BM25 when none is left). Candidates not measured keep
    the ratio the fit used."""
    candidates = []
    for candidate in fitted.get("candidates", []):
        candidate = dict(candidate, test=dict(candidate["test"]))
        ratio = ratios.get(candidate["candidate"])
        if ratio is not None:
            candidate["test"]["warm_ask_ratio"] = ratio
            limit = candidate["test"].get("speed_limit", paired.SPEED_LIMIT)
            if ratio > limit and candidate["method"] != paired.FALLBACK:
                candidate.update(method=paired.FALLBACK, why=(
                    f"{candidate['candidate']} is not the default: measured on this kind's documents, its warm ask "
                    f"takes {ratio:.2f}x a BM25 one (limit {limit}x)"))
            elif candidate["method"] != paired.FALLBACK:
                candidate["why"] = re.sub(r"warm ask [\d.]+x BM25's", f"warm ask {ratio:.2f}x BM25's on this kind's "
                                          "documents", candidate["why"])
        candidates.append(candidate)
    passing = [c for c in candidates if c["method"] != paired.FALLBACK]
    chosen = max(passing, key=lambda c: c["test"].get("recall@3", 0)) if passing else (
        candidates[0] if candidates else {"method": paired.FALLBACK, "why": "no candidate", "test": {}})
    if not passing and len(candidates) > 1:
        chosen = dict(chosen, why="; ".join(c["why"] for c in candidates))
    return dict(fitted, candidate=chosen.get("candidate", fitted.get("candidate")), method=chosen["method"],
                why=chosen["why"], test=chosen["test"], candidates=candidates)


def write_defaults(weights: Path, held_out: list[dict], out: Path, command: str,
                   warm_ask_ratios: dict[str, dict[str, float]] | None = None,
                   candidates: dict[str, list[tuple[str, dict]]] | None = None) -> dict:
    """`evsel train defaults`: each kind's default method, kept apart from the weights, in
    OUT/defaults.json. The fit's choice (hybrid.json's "defaults": the candidate that passed the
    paired test on its dev questions, before any held-out run) is judged again by every run no fit
    looked at: the runs the fit's record already holds, and `held_out` (--held-out's, docs/FUSION.md's
    entries; one of the same kind and set replaces the older). A kind whose candidate missed any
    stays on BM25, and the record says why. `warm_ask_ratios` ({kind: {method: ratio}}): warm asks
    measured on that kind's documents judge each candidate's speed again (`rejudge_speed`).
    `candidates` ({kind: [(method, an evsel eval --per-question result)]}): methods the fit did not
    propose, judged by the same rule on those held-out questions (`eval_candidate`), the level
    divided among all of the kind's candidates."""
    import copy

    from evsel.models.selectors.default import DEFAULTS_FILE, DEFAULTS_FORMAT

    data = hy.load_weights(weights)
    defaults = {}
    for kind, fitted in (data.get("defaults") or {}).items():
        fitted = copy.deepcopy(fitted)
        first = next((c for c in fitted.get("candidates", []) if c["candidate"] == fitted.get("candidate")), None)
        chosen = {k: v for k, v in fitted.items() if k not in ("held_out",)}
        if first is not None:  # the fit's own choice, before the held-out runs judged it
            chosen.update(method=first["method"], why=first["why"], test=first["test"])
        extra = (candidates or {}).get(kind, [])
        if extra:
            alpha = paired.ALPHA / (len(chosen.get("candidates", [])) + len(extra))
            chosen["candidates"] = chosen.get("candidates", []) + [
                eval_candidate(method, record, (warm_ask_ratios or {}).get(kind, {}).get(method), alpha)
                for method, record in extra]
        if (warm_ask_ratios or {}).get(kind) or extra:
            chosen = rejudge_speed(chosen, (warm_ask_ratios or {}).get(kind, {}))
        new = [e for e in held_out if e["kind"] == kind]
        named = {e["set"] for e in new}
        runs = [e for e in fitted.get("held_out", []) if e["set"] not in named] + new
        # a run judged one method (its `candidate`; without one, the fit's own): it says nothing of another
        judged = fitted.get("candidate")
        chosen["_runs"] = [e for e in runs if e.get("candidate", judged) == chosen.get("candidate")]
        defaults[kind] = chosen
    apply_held_out(defaults, [e for chosen in defaults.values() for e in chosen.pop("_runs")])
    record = {"format": DEFAULTS_FORMAT, "command": command, "weights": str(weights), "defaults": defaults}
    out.mkdir(parents=True, exist_ok=True)
    path = out / DEFAULTS_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(path)
    return record


def fit_by_kind(runs: list[dict], available: list[str], warm_ask_ratio) -> dict:
    """Weight sets and defaults over one or more sources: one pooled model over every source's
    training questions, and where the sources hold several kinds of document, one model per kind,
    kept for a kind only when it beats the pooled one on that kind's dev recall@3. Then each kind's
    default by models/fusion/paired.py's rule, with the kind's chosen sets on its dev questions."""
    train_all = [r for run in runs for r in run["train"]]
    dev_all = [r for run in runs for r in run["dev"]]
    sets, ablation = fit_sets(train_all, dev_all, available)
    kinds: dict[str, list[dict]] = {}
    for run in runs:
        kinds.setdefault(run["kind"], []).append(run)
    per_kind, defaults, kept_sets = {}, {}, []
    for kind, kind_runs in kinds.items():
        train_k = [r for run in kind_runs for r in run["train"]]
        dev_k = [r for run in kind_runs for r in run["dev"]]
        dev_name = "+".join(run["dev_name"] for run in kind_runs)
        chosen_sets, chosen_ablation = sets, ablation
        if len(kinds) > 1:
            own_sets, own_ablation = fit_sets(train_k, dev_k, available)
            dxs, dgs = arrays(dev_k)
            totals = [r["gold_total"] for r in dev_k]
            pooled = hy.evaluate([hy.score_pool(x, sets[0]) for x in dxs], dgs, totals=totals)
            own = own_sets[0]["dev"]
            keep_own = own["recall@3"] > pooled["recall@3"]
            per_kind[kind] = {"dev": dev_name, "pooled": pooled, "own": own, "kept": "own" if keep_own else "pooled"}
            if keep_own:
                chosen_sets, chosen_ablation = own_sets, own_ablation
                kept_sets += [{**ws, "name": f"{ws['name']}@{kind}", "kind": kind} for ws in own_sets]
        defaults[kind] = choose_default(chosen_sets, chosen_ablation, dev_k, dev_name, warm_ask_ratio)
    return {"weight_sets": sets + kept_sets, "ablation": ablation, "per_kind": per_kind, "defaults": defaults}


def run_training(engine, out: str, recipe_name: str, options: dict, command: str | None, data_dir,
                 on_event=ignore_event) -> dict:
    started = time.perf_counter()
    settings = pick_recipe(recipe_name, SMOKE, FULL)
    settings.update({k: v for k, v in options.items() if v is not None and k in settings})
    sources = list(dict.fromkeys(options.get("sources") or [options.get("source") or "fairytaleqa-train"]))
    fold = options.get("fold")
    out_dir = Path(out)
    context = engine.selector_context(on_event, for_eval=True)
    selector = get_selector("hybrid", context, weights={"weight_sets": [{"groups": ["bm25"], "weights": [1.0, 0.0]}]})
    wanted = hy.parse_groups(options.get("groups")) or list(hy.GROUPS)
    selector.parts = selector.available_parts(wanted)
    available = [g for g in wanted if g in ("bm25", "dialogue") or g in selector.parts]
    for group, why in selector.missing.items():
        on_event({"type": "log", "message": f"hybrid: no {group} signal ({why})"})
    features_dir = Path(options.get("features") or out_dir / "features")
    runs = []
    for source in sources:
        # with several sources, --fold is the folded sources' (FairytaleQA train has its own dev stories)
        source_fold = None if len(sources) > 1 and source == "fairytaleqa-train" else fold
        data, dev_data, train_qs, dev_qs = questions_of(source, source_fold, Path(data_dir) if data_dir else None, True)
        train_qs = spread(train_qs, settings["questions"], settings["per_document"])
        dev_qs = spread(dev_qs, settings["dev_questions"], settings["per_document"])
        name = source + (f"-fold{source_fold}" if source_fold else "")
        other = source + (f"-fold{2 if source_fold == 1 else 1}" if source_fold else "-dev")
        runs.append({"name": name, "dev_name": other, "kind": paired.SOURCE_KINDS[source],
                     "train": extract(engine, data, train_qs, features_dir / f"{name}.jsonl", selector, available,
                                      on_event),
                     "dev": extract(engine, dev_data, dev_qs, features_dir / f"{other}.jsonl", selector, available,
                                    on_event)})
    fitted = fit_by_kind(runs, available, options.get("warm_ask_ratio"))
    summary = {"source": "+".join(run["name"] for run in runs), "dev": "+".join(run["dev_name"] for run in runs),
               "train_questions": sum(len(run["train"]) for run in runs),
               "dev_questions": sum(len(run["dev"]) for run in runs),
               "available": available, "missing": selector.missing, "pool_each": hy.POOL_EACH,
               **fitted, "command": command or "", "recipe": recipe_name,
               "seconds": round(time.perf_counter() - started, 1)}
    hy.save_weights(out_dir / hy.WEIGHTS_FILE, summary)
    (out_dir / "command.txt").write_text((command or "") + "\n")
    summary["out"] = str(out_dir)
    return summary
