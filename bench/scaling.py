"""Long-context scaling (LOFT / UNREAL Fig. 1 style): evidence recall, the gold's rank and time per
ask as the context grows from 8K to 1M tokens, against full-context reading.

    python bench/scaling.py                                  # 20 questions, 8K..1M, bm25,dense,random
    python bench/scaling.py --questions 5 --lengths 8000,32000 --methods bm25   # a smoke run
    python bench/scaling.py --methods dense,blocksearch --encode-only   # fill the caches, stage by stage

Questions: FairytaleQA val questions whose gold is one story section (a fixed-seed sample).

One shared, nested distractor pool: the passages of the data that belong to none of the questions'
stories (sections of the other FairytaleQA stories, train and val, and paragraphs of the NoCha
novels), shuffled once with a fixed seed. The distractors of length L are the shortest prefix of
that order with at least L tokens: the same for every question, and a prefix of every longer
length's. A question's context is those distractors with its own gold passage inserted at its
relative depth (drawn once per question, the same at every length). So the chunks any method
encodes are the 1M-token pool's plus the questions' gold passages, once for the whole run: the
BlockSearch keys go into eval's on-disk key cache (keyed by the router adapter's digest) and the
dense embeddings into eval's state cache, and a second run reads them back. (This replaces the
per-question distractor draws of earlier runs, which encoded ~20x each length's tokens.) Every
passage is chunked by evsel's chunker with the backbone tokenizer once, and a context is its
passages' chunks in order: the same chunks as chunking the joined text with a break at each passage.

Per method and length: the gold chunk's rank (its best-ranked chunk), recall@k, MRR, time per ask
(the selector over the whole context; index time, such as encoding, apart). Every method ranks
through the pipeline `evsel ask` uses. BlockSearch's per-chunk keys are read from the cache once
and kept in memory for the run (`KeyMemo`), so a question pays packing the scope and the routing
products, not file reads. Full-context reading: time-to-first-token (one prefill of the whole
prompt) measured where it fits SmolLM2's 8K window, projected beyond with the FLOP model of UNREAL
Appendix C (t(L) = t(L_cut) * FLOPs(L) / FLOPs(L_cut)), next to the selection pipelines' time to
first token (select + prefill of the top-n passages and the question) and the break-even length
N* of Appendix C eq. 10 for this backbone.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import data_dir, load_1m, peak_rss_mib, write_result  # noqa: E402

from evsel.ingest import chunker  # noqa: E402
from evsel.evaluation import metrics  # noqa: E402
from evsel.evaluation.report import run_info  # noqa: E402
from evsel.ingest.parsers.base import ParsedDocument, Segment  # noqa: E402
from evsel.store.store import ChunkRecord  # noqa: E402

DEFAULT_LENGTHS = [8_000, 32_000, 128_000, 512_000, 1_000_000]
SEED = 0


class Passage:
    def __init__(self, index: int, source: str, text: str):
        self.index = index
        self.source = source  # story or book it came from
        self.text = text.strip() + "\n\n"
        self.chunks: list = []  # evsel chunks of this passage alone
        self.tokens = 0


def load_passages() -> list[Passage]:
    root = data_dir()
    passages: list[Passage] = []
    for split in ("train", "val"):
        for path in sorted((root / "fairytaleqa" / "section-stories" / split).glob("*-story.csv")):
            story = path.name[: -len("-story.csv")]
            with open(path, newline="", encoding="utf-8") as handle:
                for row in csv.DictReader(handle):
                    passages.append(Passage(len(passages), story, row["text"]))
    # novels: paragraphs grouped to about 300 words, so their passages are section-sized
    for path in sorted((root / "nocha" / "books").glob("*.txt")):
        words, group = 0, []
        for para in path.read_text(encoding="utf-8").split("\n\n"):
            if not para.strip():
                continue
            group.append(para.strip())
            words += len(para.split())
            if words >= 300:
                passages.append(Passage(len(passages), path.stem, "\n\n".join(group)))
                words, group = 0, []
        if group:
            passages.append(Passage(len(passages), path.stem, "\n\n".join(group)))
    if not passages:
        raise SystemExit(f"no FairytaleQA or NoCha data under {root}; set EVSEL_DATA")
    return passages


def chunk_passages(passages: list[Passage], counter, budget: int) -> None:
    for p in passages:
        doc = ParsedDocument(text=p.text, kind="book", title="", segments=[Segment(0, len(p.text))])
        p.chunks = chunker.chunk_document(doc, counter, budget)
        p.tokens = sum(c.n_tokens for c in p.chunks)


def pick_questions(n: int) -> list[dict]:
    """Local FairytaleQA val questions citing exactly one section, a fixed-seed sample."""
    root = data_dir() / "fairytaleqa" / "questions" / "val"
    found = []
    for path in sorted(root.glob("*-questions.csv")):
        story = path.name[: -len("-questions.csv")]
        with open(path, newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                sections = [s for s in row["cor_section"].split(",") if s.strip()]
                if row["local-or-sum"] == "local" and len(sections) == 1:
                    found.append({"story": story, "section": sections[0].strip(), "question": row["question"],
                                  "qid": f"{story}/{row['question_id']}"})
    return random.Random(SEED).sample(found, min(n, len(found)))


def gold_passage(passages: list[Passage], question: dict) -> Passage:
    stories = data_dir() / "fairytaleqa" / "section-stories" / "val" / f"{question['story']}-story.csv"
    with open(stories, newline="", encoding="utf-8") as handle:
        text = next(r["text"] for r in csv.DictReader(handle) if r["section"].strip() == question["section"])
    return next(p for p in passages if p.source == question["story"] and p.text == text.strip() + "\n\n")


def distractor_pool(passages: list[Passage], questions: list[dict]) -> list[Passage]:
    """Every passage of none of the questions' stories, in one fixed-seed order."""
    stories = {q["story"] for q in questions}
    pool = [p for p in passages if p.source not in stories]
    random.Random(SEED).shuffle(pool)
    return pool


def distractors(pool: list[Passage], length: int) -> list[Passage]:
    """The shortest prefix of the pool with at least `length` tokens."""
    chosen, total = [], 0
    for p in pool:
        if total >= length:
            break
        chosen.append(p)
        total += p.tokens
    if total < length:
        raise SystemExit(f"the distractor pool has {total} tokens, fewer than {length}")
    return chosen


def records(sequence: list[Passage], gold: Passage | None = None) -> tuple[list[ChunkRecord], set[int]]:
    """The chunks of passages in order, and the ids of `gold`'s."""
    out, gold_ids, offset, seq = [], set(), 0, 0
    for p in sequence:
        for c in p.chunks:
            # ids stable per (passage, chunk): per-chunk caches hit across contexts, as after ingest
            cid = p.index * 1000 + c.seq + 1
            out.append(ChunkRecord(id=cid, doc_id=1, seq=seq, text=c.text, content_hash=c.record()["content_hash"],
                                   n_tokens=c.n_tokens, char_start=offset + c.start, char_end=offset + c.end,
                                   title="context"))
            if p is gold:
                gold_ids.add(cid)
            seq += 1
        offset += len(p.text)
    return out, gold_ids


def build_context(gold: Passage, chosen: list[Passage], depth: float) -> tuple[list[ChunkRecord], set[int], int]:
    """Chunks of the distractors `chosen` with the gold passage at relative `depth`."""
    at = round(depth * len(chosen))
    sequence = chosen[:at] + [gold] + chosen[at:]
    chunks, gold_ids = records(sequence, gold)
    return chunks, gold_ids, sum(p.tokens for p in sequence)


class KeyMemo:
    """BlockSearch's key cache with the arrays read kept in memory for the run (shared by the
    routers of one key digest): each chunk's file is read once, not once per question."""

    def __init__(self, inner):
        self.inner = inner
        self.arrays: dict = {}

    def get(self, name, shape=None, dtype=None):
        array = self.arrays.get(name)
        if array is None or not self.inner.fits(array, shape, dtype):
            array = self.inner.get(name, shape, dtype)
            if array is not None:
                self.arrays[name] = array
        return array

    def put_many(self, arrays: dict) -> None:
        self.inner.put_many(arrays)
        self.arrays.update(arrays)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def wait_for_keys(router, chunks: list[ChunkRecord]) -> None:
    """Sleep until every chunk's key file is in the router's cache folder (an --encode-only run is
    writing them), so two processes never encode the same keys."""
    cache = router.keys.inner if isinstance(router.keys, KeyMemo) else router.keys
    if not cache.on_disk:
        return
    hashes = list(dict.fromkeys(c.content_hash for c in chunks))
    while True:
        missing = sum(not cache.path(h).exists() for h in hashes)
        if not missing:
            return
        print(f"waiting for {missing} of {len(hashes)} key files in {cache.folder}", file=sys.stderr, flush=True)
        time.sleep(60)


def routers(methods) -> dict:
    """{method spec: its BlockSearch router} for the BlockSearch methods."""
    out = {}
    for m in methods:
        selector = getattr(m.pipeline, "first", None)
        if getattr(selector, "name", "").startswith("blocksearch"):
            out[m.spec] = selector.router
    return out


def share_keys(methods, memos: dict) -> None:
    """Route every BlockSearch method's key reads through one KeyMemo per key digest, and let the
    routers of one digest (and query rows) share their query passes: the SSMax variants' query block
    is the plain one's, SSMax only rescales the routing layer's logits."""
    for router in routers(methods).values():
        if not isinstance(router.keys, KeyMemo):
            router.keys = memos.setdefault(router.digest, KeyMemo(router.keys))
        shared = memos.setdefault(("queries", router.digest, router.config.query_tokens), router.prefix_queries)
        router.prefix_queries = shared


# full-context reading -----------------------------------------------------------------------------

def prefill_seconds(backbone, n_tokens: int, ids_source: list[int]) -> float:
    """One prefill of n_tokens through the whole model, logits for the last position only: the
    time to the first generated token."""
    import torch

    ids = torch.tensor([ids_source[:n_tokens]])
    with torch.inference_mode():
        t = time.perf_counter()
        backbone.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True, logits_to_keep=1)
        return time.perf_counter() - t


def flop_model(config, l_c: int, n: int, chunk: int, c0: int, r: int, t_q: int) -> dict:
    """UNREAL Appendix C for this backbone: Theta (matrix params active per token, no embeddings or
    LM head), kappa = Theta / (L_a d_a), lambda = 1 - l_c / L, |x_ret| = C0*T + T_q + R, and the
    break-even length N* of eq. 10 above which selection costs fewer FLOPs than full reading."""
    d = config.hidden_size
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or d // heads
    layers = config.num_hidden_layers
    per_layer = d * heads * head_dim * 2 + 2 * d * kv * head_dim + 3 * d * config.intermediate_size
    theta = layers * per_layer
    d_a = heads * head_dim
    kappa = theta / (layers * d_a)
    lam = 1 - l_c / layers
    x_ret = c0 * chunk + t_q + r
    q = n * chunk + x_ret
    n_star = 0.5 * (-lam * kappa + math.sqrt(lam**2 * kappa**2 + 4 * kappa * q))
    return {"theta": theta, "layers": layers, "d_attn": d_a, "kappa": kappa, "lambda": lam, "l_c": l_c,
            "n": n, "T": chunk, "C0": c0, "R": r, "T_q": t_q, "x_ret": x_ret, "n_star_tokens": n_star}


def full_flops(fm: dict, length: int) -> float:
    """Prefill FLOPs of full-context reading: 2*Theta per token plus 2*L_a*d_a*N(N+1) for attention."""
    return 2 * fm["theta"] * length + 2 * fm["layers"] * fm["d_attn"] * length * (length + 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=20, help="questions (default 20)")
    parser.add_argument("--lengths", default=",".join(map(str, DEFAULT_LENGTHS)), help="context tokens, comma-separated")
    parser.add_argument("--methods", default="bm25,dense,random", help="selectors by name, comma-separated")
    parser.add_argument("--k", default="1,5,10", help="recall cut-offs")
    parser.add_argument("--top-n", type=int, default=5, help="passages read after selection (for TTFT)")
    parser.add_argument("--ttft-lengths", default="1000,2000,4000,7900",
                        help="full-context prefill lengths to measure (must fit the 8K window); none: skip")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "scaling.json")
    parser.add_argument("--wait-for-keys", action="store_true",
                        help="wait until another run (--encode-only) has written the BlockSearch keys of each length")
    parser.add_argument("--first", type=int, default=None,
                        help="rank only the first N questions (the pool is still the --questions' one): a smoke run")
    parser.add_argument("--encode-only", action="store_true",
                        help="only encode the pool (BlockSearch keys, dense embeddings) into the caches, "
                             "length by length, and exit")
    args = parser.parse_args(argv)
    lengths = sorted(int(x) for x in args.lengths.split(","))
    ks = [int(x) for x in args.k.split(",")]
    specs = [m.strip() for m in args.methods.split(",") if m.strip()]

    from evsel.engine import Engine
    from evsel.evaluation.runner import EvalConfig, Method, method_specs

    info = run_info(["python", "bench/scaling.py", *(argv if argv is not None else sys.argv[1:])])
    started = time.perf_counter()
    engine = Engine()
    backbone = engine.backbone
    passages = load_passages()
    t = time.perf_counter()
    chunk_passages(passages, backbone, chunker.DEFAULT_CHUNK_TOKENS)
    chunk_s = time.perf_counter() - t
    questions = pick_questions(args.questions)
    golds = [gold_passage(passages, q) for q in questions]
    pool = distractor_pool(passages, questions)
    pool_tokens = sum(p.tokens for p in pool)
    chosen = {L: distractors(pool, L) for L in lengths}
    print(f"{len(passages)} passages chunked in {chunk_s:.0f} s; distractor pool {len(pool)} passages, "
          f"{pool_tokens} tokens; longest context {len(chosen[lengths[-1]])} distractor passages", file=sys.stderr)
    context = engine.selector_context(for_eval=True)
    config = EvalConfig(methods=specs)
    methods = [Method(name, spec, context, config) for name, spec in method_specs(specs, False)]
    memos: dict = {}

    # index time: every method's per-chunk state of the golds and the pool, once, shortest length
    # first (what is cached already is read back)
    index_s: dict[str, float] = {m.spec: 0.0 for m in methods}
    gold_chunks, _ = records(golds)

    def index(L: int) -> None:
        scope = gold_chunks + records(chosen[L])[0]
        for m in methods:
            share_keys([m], memos)
            if args.wait_for_keys and m.spec in routers([m]):
                wait_for_keys(routers([m])[m.spec], scope)
            t = time.perf_counter()
            m.prepare(scope)
            index_s[m.spec] += time.perf_counter() - t
            print(f"index {m.spec} up to {L} tokens ({len(scope)} chunks): {index_s[m.spec]:.0f} s so far "
                  f"({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)

    if args.encode_only:
        for L in lengths:
            index(L)
        print(f"encoded; index seconds {index_s}", file=sys.stderr)
        return 0

    # full-context time to first token, measured where it fits, projected beyond (--ttft-lengths none:
    # not measured; the prefills are the slowest part of a run at 8K-128K on a loaded machine)
    full_context, fm, read_s = None, None, None
    if args.ttft_lengths != "none":
        text = "".join(p.text for p in passages[:200])
        ids = [backbone.bos_id()] + backbone.tokenizer(text, add_special_tokens=False)["input_ids"]
        window = backbone.model.config.max_position_embeddings
        ttft_lengths = [n for n in (int(x) for x in args.ttft_lengths.split(",")) if n <= window]
        # best of two: the first pass at a new length pays one-off kernel set-up
        measured = {n: min(prefill_seconds(backbone, n, ids) for _ in range(2)) for n in ttft_lengths}
        read_tokens = args.top_n * chunker.DEFAULT_CHUNK_TOKENS + 60  # top-n passages + question and template
        read_s = min(prefill_seconds(backbone, read_tokens, ids) for _ in range(2))
        fm = flop_model(backbone.model.config, l_c=20, n=args.top_n, chunk=chunker.DEFAULT_CHUNK_TOKENS, c0=5,
                        r=64, t_q=60)
        cut = max(measured)
        projection = {L: measured[cut] * full_flops(fm, L) / full_flops(fm, cut) for L in lengths}
        full_context = {
            "window": window,
            "ttft_measured_s": measured,
            "ttft_projected_s": {L: (measured[L] if L in measured else projection[L]) for L in lengths},
            "projected_from": cut,
            "read_top_n_prefill_s": read_s,
            "read_top_n_tokens": read_tokens,
        }

    rows: dict[str, dict[int, list[dict]]] = {m.spec: {L: [] for L in lengths} for m in methods}
    prepare_s: dict[str, float] = {m.spec: 0.0 for m in methods}
    actual_tokens: dict[int, list[int]] = {L: [] for L in lengths}
    def write(complete: bool) -> dict:
        """The summary of the questions done so far, written to --out (after each question)."""
        summary = {}
        for spec, by_length in rows.items():
            summary[spec] = {}
            for L, items in by_length.items():
                if not items:
                    continue
                entry = {k: metrics.mean([r[k] for r in items]) for k in [f"recall@{k}" for k in ks] + ["mrr"]}
                times = [r["select_s"] for r in items]
                entry["select_s_median"] = metrics.median(times)
                entry["select_s_p95"] = metrics.percentile(times, 95)
                if read_s is not None:
                    entry["ttft_s"] = entry["select_s_median"] + read_s  # select, then read the top-n
                entry["chunks_mean"] = metrics.mean([r["chunks"] for r in items])
                ranks = [r["rank"] for r in items if r["rank"] is not None]
                entry["rank_median"] = metrics.median(ranks) if ranks else None
                entry["ranks"] = [r["rank"] for r in items]
                summary[spec][L] = entry
        result = {
            "benchmark": "scaling",
            "run": info,
            "config": {"questions": len(asked), "pool_of_questions": len(questions), "lengths": lengths,
                       "methods": specs, "k": ks, "top_n": args.top_n,
                       "seed": SEED, "chunk_tokens": chunker.DEFAULT_CHUNK_TOKENS, "backbone": backbone.name,
                       "dtype": backbone.plan.dtype, "passages": len(passages),
                       "pool": "shared, nested: one fixed-seed order of the passages of no question's story; "
                               "each question's gold inserted at its depth",
                       "pool_passages": len(pool), "pool_tokens": pool_tokens,
                       "distractor_passages": {L: len(chosen[L]) for L in lengths},
                       "threads": os.environ.get("EVSEL_THREADS")},
            "context_tokens_mean": {L: statistics.mean(v) for L, v in actual_tokens.items() if v},
            "methods": summary,
            "index_s_total": index_s,
            "prepare_s_total": prepare_s,
            "load_1m_end": load_1m(),
            "full_context": full_context,
            "flop_model": fm,
            "per_question": rows,
            "peak_rss_mib": peak_rss_mib(),
            "seconds": time.perf_counter() - started,
            "complete": complete,
            "questions_done": {L: len(v) for L, v in next(iter(rows.values())).items()} if rows else {},
        }
        write_result(args.out, result)
        return result

    asked = list(zip(questions, golds))[: args.first]
    query_s: dict[str, dict[str, float]] = {}  # question id -> method -> its query pass's seconds
    # lengths outer: a length's questions run as soon as its keys are there (an --encode-only run may
    # still be writing the longer lengths')
    for L in lengths:
        index(L)
        for qi, (q, gold) in enumerate(asked):
            depth = random.Random(f"{SEED}:{q['qid']}").uniform(0.05, 0.95)
            if q["qid"] not in query_s:
                # the question's query pass, once per router adapter (shared by its variants), timed
                # apart and added to each of their selection times below, as each ask pays it
                took, by_digest = {}, {}
                for spec, router in routers(methods).items():
                    t = time.perf_counter()
                    router.prefix_query(q["question"])
                    took[spec] = time.perf_counter() - t
                    by_digest[router.digest] = max(by_digest.get(router.digest, 0.0), took[spec])
                query_s[q["qid"]] = {spec: by_digest[router.digest] for spec, router in routers(methods).items()}
            passes = query_s[q["qid"]]
            chunks, gold_ids, total = build_context(gold, chosen[L], depth)
            actual_tokens[L].append(total)
            for m in methods:
                t = time.perf_counter()
                m.prepare(chunks)  # cached state read back and packed for this scope
                prepare_s[m.spec] += time.perf_counter() - t
                ranked, timings = m.rank(q["question"], chunks)
                ids = [s.chunk.id for s in ranked]
                scores = metrics.ranking_metrics(ids, [gold_ids], ks)
                rank = min((i for i, c in enumerate(ids, 1) if c in gold_ids), default=None)
                rows[m.spec][L].append({"qid": q["qid"], "depth": depth, "chunks": len(chunks), "rank": rank,
                                        **scores, "select_s": timings["select_s"] + passes.get(m.spec, 0.0),
                                        "query_pass_s": passes.get(m.spec)})
            print(f"{L} tokens: question {qi + 1}/{len(asked)} done ({time.perf_counter() - started:.0f} s; ranks: "
                  + ", ".join(f"{m.spec} {rows[m.spec][L][-1]['rank']}" for m in methods) + ")",
                  file=sys.stderr, flush=True)
            write(complete=False)

    result = write(complete=True)
    plot(result, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}", file=sys.stderr)
    return 0


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = [int(L) for L in result["config"]["lengths"]]
    k = 5 if 5 in result["config"]["k"] else result["config"]["k"][0]
    fig, (ranks, recall, ttft) = plt.subplots(1, 3, figsize=(16, 4.8), dpi=120)
    n = result["config"]["questions"]
    full = result["full_context"]
    for i, (spec, by_length) in enumerate(result["methods"].items()):
        by_length = {int(L): v for L, v in by_length.items()}
        lengths = [L for L in lengths if L in by_length]
        kw = {"color": f"C{i % 10}", "marker": "os^v<>Dph*"[i % 10], "linestyle": "--" if spec == "random" else "-"}
        ranks.plot(lengths, [by_length[L]["rank_median"] for L in lengths], label=spec, **kw)
        recall.plot(lengths, [by_length[L][f"recall@{k}"] for L in lengths], label=spec, **kw)
        if spec == "random":
            continue
        if full is None:
            ttft.plot(lengths, [by_length[L]["select_s_median"] for L in lengths], label=spec, **kw)
        else:
            ttft.plot(lengths, [by_length[L]["ttft_s"] for L in lengths], label=f"{spec} + read top-n", **kw)
    if full is not None:
        measured = {int(n_): s for n_, s in full["ttft_measured_s"].items()}
        projected = {int(L): s for L, s in full["ttft_projected_s"].items()}
        ttft.plot(sorted(measured), [measured[x] for x in sorted(measured)], "k-o", label="full context (measured)")
        beyond = [L for L in lengths if L >= full["projected_from"]]
        ttft.plot([full["projected_from"]] + beyond,
                  [measured[full["projected_from"]]] + [projected[L] for L in beyond], "k--",
                  label="full context (FLOP projection)")
    ranks.set(xscale="log", yscale="log", xlabel="context tokens", ylabel="gold chunk's median rank (1 = first)",
              title=f"gold's median rank ({n} FairytaleQA questions)")
    recall.set(xscale="log", ylim=(-0.02, 1.02), xlabel="context tokens", ylabel=f"recall@{k}",
               title=f"evidence recall@{k}, one shared distractor pool")
    ttft.set(xscale="log", yscale="log", xlabel="context tokens", ylabel="seconds",
             title="time to first token" if full is not None else "median selection time per question")
    for ax in (ranks, recall, ttft):
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
