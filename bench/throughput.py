"""Throughput on this machine: chunk encoding against a matmul roofline, selector latency vs corpus size.

    python bench/throughput.py                      # writes bench/results/throughput.json
    python bench/throughput.py --quick              # smaller sizes, fewer repeats (a smoke run)
    python bench/throughput.py --only bm25-store    # BM25 persisted vs rebuilt, into bench/results/bm25.json

1. Chunk encoding: the default backbone (bf16 where the CPU supports it, as evsel runs it) encodes
   batches of 16 chunks x 140 tokens through `Backbone.hidden_states_at` to layer 20 and to layer 30
   (the forward stops there). Tokens/s, achieved FLOP/s (FLOPs per token from the model config and
   the layers actually run) and that as a share of a bf16 and an fp32 matmul roofline measured in
   the same run with the same threads.
2. Selector latency vs number of chunks (10^3 .. 10^6, capped by --max-gib of memory):
   BM25 with its index built per ask (as `evsel eval` does) and prebuilt, on synthetic
   chunks whose words follow the word frequencies of real text; MaxSim (UNREAL scoring) over
   synthetic chunk states, 7 vectors x 576 dims per chunk in bf16, 4 query vectors.
3. BM25 per in-process ask on a store (`--only bm25-store` runs just this, into bench/results/bm25.json):
   today's rebuild (BM25Okapi from the chunk texts) against the index persisted at ingest (m004), in
   the same run, with identical scores; 10^3 .. 10^5 chunks.
4. Peak RSS after each part.
5. `--only encode-variants` (into bench/results/encode_variants.json): ways of running the encoding
   forward pass alternated in rounds against the bf16 roofline of each round, at --threads: today's
   (SDPA, 16x140), eager attention, 8x140 and 64x140 batches, torch.compile per decoder layer (its
   compile time), the other dtype (fp32 where evsel runs bf16), int8 dynamic quantisation of the
   linear layers; today's at 2 threads too; each one's deviation from today's states. The real
   ChunkEncoder path on the Sherlock Holmes book's chunks at three batch budgets (padding share);
   the same path at torch's default thread count against the one models/runtime/cpu_threads.py measures per
   machine; and a profile of where the time goes.
"""

from __future__ import annotations

import argparse
import copy
import gc
import re
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import data_dir, peak_rss_mib, write_result  # noqa: E402

from evsel.evaluation.report import run_info  # noqa: E402

BATCH, TOKENS = 16, 140
L_P, DIM, QUERY_VECTORS = 7, 576, 4


# 1. encoding vs roofline --------------------------------------------------------------------------

def matmul_flops(dtype: torch.dtype, m: int, k: int, n: int, seconds: float = 2.0) -> float:
    """Best sustained FLOP/s of an (m x k) @ (k x n) product over `seconds`."""
    a = torch.randn(m, k, dtype=torch.float32).to(dtype)
    b = torch.randn(k, n, dtype=torch.float32).to(dtype)
    for _ in range(3):
        torch.matmul(a, b)
    best = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        t = time.perf_counter()
        torch.matmul(a, b)
        best = max(best, 2 * m * k * n / (time.perf_counter() - t))
    return best


def roofline(quick: bool) -> dict:
    """Peak matmul FLOP/s: a large square product and the model's own widest projection shape
    (16*140 tokens x 576 -> 1536, the MLP up-projection); the roofline is the better of the two."""
    shapes = {"square_2048": (2048, 2048, 2048), "mlp_up_2240x576x1536": (BATCH * TOKENS, 576, 1536)}
    out = {}
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        per_shape = {s: matmul_flops(dtype, *dims, seconds=0.5 if quick else 2.0) for s, dims in shapes.items()}
        out[name] = {"flops": max(per_shape.values()), "by_shape": per_shape}
    return out


def flops_per_token(config, layers: int, context: int) -> dict:
    """Forward FLOPs per token through `layers` decoder layers (2 per multiply-add), from the config.
    Weights: q, k, v, o and the gated MLP (gate, up, down); the embedding lookup is not a product
    and the LM head does not run (the forward stops at the layer). Attention: a causal sequence of
    `context` tokens has context*(context+1)/2 query-key pairs, each 4*d_attn FLOPs (score + value),
    so 2*d_attn*(context+1) per token."""
    d = config.hidden_size
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or d // heads
    d_attn, d_kv = heads * head_dim, kv_heads * head_dim
    weights = d * d_attn + 2 * d * d_kv + d_attn * d + 3 * d * config.intermediate_size
    per_layer_weights = 2 * weights
    per_layer_attention = 2 * d_attn * (context + 1)
    return {
        "layers": layers,
        "weight_params_per_layer": weights,
        "flops_per_token": layers * (per_layer_weights + per_layer_attention),
        "attention_share": per_layer_attention / (per_layer_weights + per_layer_attention),
    }


def real_token_batches(backbone, n_batches: int) -> list[torch.Tensor]:
    """(16, 140) id batches cut from real text (FairytaleQA stories, else evsel's sample story),
    each row starting with the BOS sink token as evsel encodes chunks."""
    texts = []
    stories = data_dir() / "fairytaleqa" / "section-stories" / "val"
    if stories.is_dir():
        import csv

        for path in sorted(stories.glob("*.csv"))[:6]:
            with open(path, newline="", encoding="utf-8") as handle:
                texts += [row["text"] for row in csv.DictReader(handle)]
    else:
        from evsel.paths import sample_story_path

        texts.append(sample_story_path().read_text(encoding="utf-8"))
    ids = [i for t in texts for i in backbone.tokenizer(t, add_special_tokens=False)["input_ids"]]
    need = n_batches * BATCH * (TOKENS - 1)
    while len(ids) < need:
        ids = ids + ids
    rows = torch.tensor(ids[:need]).view(n_batches, BATCH, TOKENS - 1)
    bos = torch.full((n_batches, BATCH, 1), backbone.bos_id())
    return list(torch.cat([bos, rows], dim=-1))


def encoding(backbone, roof: dict, quick: bool) -> dict:
    model = backbone.model
    plan = backbone.plan
    repeats = 2 if quick else 6
    batches = real_token_batches(backbone, repeats + 1)
    mask = torch.ones(BATCH, TOKENS, dtype=torch.long)
    out = {"dtype": plan.dtype, "device": plan.device, "reason": plan.reason, "batch": [BATCH, TOKENS],
           "threads": torch.get_num_threads(), "layers": {}}
    for layer in (20, model.config.num_hidden_layers):
        backbone.hidden_states_at(batches[0], mask, layer)  # warm-up
        times = []
        for ids in batches[1:]:
            t = time.perf_counter()
            states = backbone.hidden_states_at(ids, mask, layer)
            times.append(time.perf_counter() - t)
            assert states.shape == (BATCH, TOKENS, model.config.hidden_size)
        best, med = min(times), statistics.median(times)
        flops = flops_per_token(model.config, layer, TOKENS)
        tokens = BATCH * TOKENS
        achieved = tokens * flops["flops_per_token"] / med
        out["layers"][str(layer)] = {
            **flops,
            "tokens_per_s_median": tokens / med,
            "tokens_per_s_best": tokens / best,
            "achieved_flops": achieved,
            "share_of_bf16_roofline": achieved / roof["bf16"]["flops"],
            "share_of_fp32_roofline": achieved / roof["fp32"]["flops"],
            "seconds_per_batch": times,
        }
    return out


# 1b. encoding variants (--only encode-variants) ----------------------------------------------------

BOOK = HERE.parent.parent / "shared" / "data" / "nocha" / "books" / "the_adventures_of_sherlock_holmes_arthur_conan_doyle.txt"
OP_GROUPS = {  # profiler op -> where the time goes
    "matmul": ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm"),
    "attention": ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_softmax", "aten::softmax"),
    "norms, rope, activations (elementwise)": ("aten::mul", "aten::add", "aten::pow", "aten::silu", "aten::cat",
                                               "aten::neg", "aten::copy_", "aten::mean", "aten::rsqrt", "aten::sum",
                                               "aten::div_", "aten::sub", "aten::add_", "aten::mul_"),
}


def book_chunk_texts(backbone, limit: int) -> list[str]:
    """The first `limit` chunks of the Sherlock Holmes book as evsel ingests it (140-token chunks)."""
    from evsel.ingest import chunker
    from evsel.ingest.parsers import parse_file

    if not BOOK.is_file():
        return []
    texts = []
    for doc in parse_file(BOOK):
        texts += [c.text for c in chunker.chunk_document(doc, backbone)]
        if len(texts) >= limit:
            break
    return texts[:limit]


def op_breakdown(run, x) -> dict:
    """Share of the profiled self CPU time of one forward pass, by OP_GROUPS (the rest: overhead)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run(x)
    totals = {name: 0.0 for name in OP_GROUPS}
    whole = 0.0
    for event in prof.key_averages():
        whole += event.self_cpu_time_total
        for name, ops in OP_GROUPS.items():
            fused = name.startswith("norms") and "cpp_fused" in event.key  # torch.compile's fused kernels
            if event.key in ops or fused:
                totals[name] += event.self_cpu_time_total
    out = {name: t / whole for name, t in totals.items()}
    out["other (framework overhead, small ops)"] = 1.0 - sum(out.values())
    out["profiled_s"] = whole / 1e6
    return out


def thread_choice(backbone, texts: list[str], real_tokens: int, rounds: int) -> dict | None:
    """The real encode path (ChunkEncoder to layer 20, today's budget) at torch's default thread count
    (one per CPU: what evsel ran before, EVSEL_THREADS unset) and at the count models/runtime/cpu_threads.py
    measures and records at the first load on this machine (measured again here, in this run),
    alternated in rounds. The states are the same (tests/test_cpu_threads.py)."""
    from evsel.models.runtime import cpu_threads
    from evsel.models.runtime.backbone import probe_pass
    from evsel.models.unreal.selection import ChunkEncoder

    cpus = cpu_threads.usable_cpus()
    if cpus < 2:
        return None
    started = time.perf_counter()
    measured = cpu_threads.measure(lambda: probe_pass(backbone.model), cpu_threads.candidates(cpus))
    measure_s = time.perf_counter() - started
    chosen = max(measured, key=measured.get)
    seconds: dict = {n: [] for n in sorted({cpus, chosen})}
    for _ in range(rounds):
        for n in seconds:
            torch.set_num_threads(n)
            encoder = ChunkEncoder(backbone, [20], 7)
            t = time.perf_counter()
            encoder.encode(texts)
            seconds[n].append(time.perf_counter() - t)
    speed = {n: real_tokens / statistics.median(t) for n, t in seconds.items()}
    print(f"thread choice: measured {measured}, chose {chosen}; ChunkEncoder "
          + ", ".join(f"{n} thread(s) {v:.0f} tok/s" for n, v in speed.items()), file=sys.stderr)
    return {"cpus": cpus, "default_threads": cpus, "chosen": chosen, "measure_s": measure_s,
            "measure_tokens_per_s": {str(n): v for n, v in measured.items()},
            "chunk_encoder": {str(n): {"tokens_per_s_median": speed[n], "seconds": seconds[n]} for n in seconds},
            "speedup_vs_default": speed[chosen] / speed[cpus], "chunks": len(texts), "tokens": real_tokens}


def encode_variants(quick: bool, thread_counts: list[int]) -> dict:
    """Each way of running the chunk-encoding forward pass, alternated in rounds on the same real-text
    16x140 batches (median per variant), each against the bf16 roofline measured in the same run, in
    every round (the machine is shared: a roofline and its encodings are measured minutes apart at
    most). Then the real encode path (ChunkEncoder, the Sherlock Holmes book's chunks, sorted into
    length buckets by `sink_batches`) at today's and larger batch budgets, its padding share, and a
    profile of where one batch's time goes, eager and compiled."""
    from evsel.models.runtime.backbone import Backbone, run_layers
    from evsel.models.unreal.selection import ChunkEncoder, pool_states

    from common import load_1m

    torch.set_num_threads(thread_counts[0])
    backbone = Backbone(threads=thread_counts[0])
    model = backbone.model
    config = model.config
    rounds = 2 if quick else 3
    batches = real_token_batches(backbone, 2)
    big = torch.cat(real_token_batches(backbone, 8)[4:])  # 64 rows x 140: 4x the tokens per matmul
    out: dict = {"threads": thread_counts, "batch": [BATCH, TOKENS], "rounds": rounds, "load_1m_before": load_1m(),
                 "dtype": backbone.plan.dtype, "attention_default": config._attn_implementation}

    running = {"model": model}  # the model a variant runs: the backbone's, or a copy in another dtype

    def forward(x, layer):
        with torch.inference_mode():
            return run_layers(running["model"], [layer], input_ids=x)[layer]

    def set_attention(kind):
        config._attn_implementation = kind

    eager_forwards = {layer: layer.forward for layer in model.model.layers}
    compiled_forwards: dict = {}

    def use_compiled(on: bool):
        for layer in model.model.layers:
            layer.forward = compiled_forwards[layer] if on else eager_forwards[layer]

    reference = {depth: forward(batches[0], depth).float() for depth in (20, config.num_hidden_layers)}
    # torch.compile of each decoder layer's forward (hooks stay outside: the early stop still works)
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    warm_cache = Path(cache_dir()).is_dir() and any(Path(cache_dir()).iterdir())
    started = time.perf_counter()
    for layer in model.model.layers:
        compiled_forwards[layer] = torch.compile(eager_forwards[layer], dynamic=True)
    use_compiled(True)
    forward(batches[0], config.num_hidden_layers)
    compile_s = time.perf_counter() - started
    started = time.perf_counter()
    forward(batches[0][:13, :97], 20)  # another shape: does it recompile?
    out["compile"] = {"first_call_s": compile_s, "new_shape_s": time.perf_counter() - started,
                      "inductor_cache_warm": warm_cache}
    def deviation(got, ref):
        """Per-token relative L2 error (sink left out) and that of the 7 pooled vectors the store keeps."""
        rel = ((got - ref).norm(dim=-1) / ref.norm(dim=-1))[:, 1:]
        lengths = [got.shape[1] - 1] * got.shape[0]
        pg, pr = pool_states(got, lengths, 7), pool_states(ref, lengths, 7)
        pooled = (pg - pr).norm(dim=-1) / pr.norm(dim=-1)
        return {"max_rel_l2_per_token": rel.max().item(), "median_rel_l2_per_token": rel.median().item(),
                "max_rel_l2_pooled": pooled.max().item(), "median_rel_l2_pooled": pooled.median().item()}

    compiled_dev = {str(depth): deviation(forward(batches[0], depth).float(), ref) for depth, ref in reference.items()}
    use_compiled(False)
    # today's own spread: the same rows encoded one at a time instead of in a batch of 16
    alone_dev = {str(depth): deviation(torch.cat([forward(row[None], depth) for row in batches[0]]).float(), ref)
                 for depth, ref in reference.items()}
    out["eager_alone_vs_batched"] = alone_dev
    out["compiled_vs_eager"] = compiled_dev
    # the other dtype, and int8 dynamic quantisation of every linear layer (per-channel weights,
    # activations quantised per batch; the rest in fp32): copies of the model, the same weights
    other_dtype = torch.float32 if backbone.plan.dtype == "bfloat16" else torch.bfloat16
    copies = {"other dtype": copy.deepcopy(model).to(other_dtype)}
    copies["int8"] = torch.ao.quantization.quantize_dynamic(
        copy.deepcopy(model).float(), {torch.nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig},
        dtype=torch.qint8)

    def use_copy(name):
        running["model"] = copies[name] if name else model

    out["copies_vs_today"] = {}
    for name in copies:
        use_copy(name)
        out["copies_vs_today"][name] = {str(depth): deviation(forward(batches[0], depth).float(), ref)
                                        for depth, ref in reference.items()}
    use_copy(None)
    out["other_dtype"] = str(other_dtype).removeprefix("torch.")
    # more threads than the first count: today's path only (each variant at each count would double the run)
    torch.set_num_threads(thread_counts[-1])
    out["threads_vs_today"] = {str(depth): deviation(forward(batches[0], depth).float(), ref)
                               for depth, ref in reference.items()}
    torch.set_num_threads(thread_counts[0])

    today_name = "today (sdpa, 16x140)"
    variants = {  # name: (setup, input)
        today_name: (lambda: None, batches),
        "eager attention": (lambda: set_attention("eager"), batches),
        "8x140 batches": (lambda: None, [half for x in batches for half in x.split(BATCH // 2)]),
        "64x140 batch": (lambda: None, [big]),
        "torch.compile per layer": (lambda: use_compiled(True), batches),
        f"{out['other_dtype']} (the other dtype)": (lambda: use_copy("other dtype"), batches),
        "int8 dynamic linears": (lambda: use_copy("int8"), batches),
    }
    deviations = {"torch.compile per layer": compiled_dev, f"{out['other_dtype']} (the other dtype)":
                  out["copies_vs_today"]["other dtype"], "int8 dynamic linears": out["copies_vs_today"]["int8"]}
    depths = (20, config.num_hidden_layers)
    times: dict = {(t, name): {d: [] for d in depths} for t in thread_counts for name in variants}
    roofs: dict = {t: [] for t in thread_counts}
    for round_ in range(rounds):
        for threads in thread_counts:  # alternate thread counts and variants within each round
            torch.set_num_threads(threads)
            roofs[threads].append(max(matmul_flops(torch.bfloat16, 2048, 2048, 2048, 0.5),
                                      matmul_flops(torch.bfloat16, BATCH * TOKENS, 576, 1536, 0.5)))
            for name, (setup, inputs) in variants.items():
                if threads != thread_counts[0] and name != today_name:
                    continue
                setup()
                try:
                    for depth in depths:
                        if round_ == 0:
                            forward(inputs[0], depth)  # warm (a compiled shape, the allocator)
                        for x in inputs:
                            t = time.perf_counter()
                            forward(x, depth)
                            times[threads, name][depth].append((time.perf_counter() - t) / x.numel())
                finally:
                    set_attention(out["attention_default"])
                    use_compiled(False)
                    use_copy(None)
            print(f"round {round_ + 1}/{rounds}, {threads} thread(s): roofline {roofs[threads][-1] / 1e9:.0f} GFLOP/s; "
                  + ", ".join(f"{n} {1 / statistics.median(times[threads, n][20]):.0f}" for n in variants
                              if times[threads, n][20])
                  + " tok/s to layer 20", file=sys.stderr)
    torch.set_num_threads(thread_counts[0])
    out["roofline_bf16_flops"] = {str(t): max(r) for t, r in roofs.items()}
    out["roofline_bf16_flops_per_round"] = {str(t): r for t, r in roofs.items()}
    rows = []
    for (threads, name), by_depth in times.items():
        for depth, per_token in by_depth.items():
            if not per_token:
                continue
            med = statistics.median(per_token)
            flops = flops_per_token(config, depth, TOKENS)["flops_per_token"]
            base = statistics.median(times[thread_counts[0], today_name][depth])
            dev = out["threads_vs_today"] if threads != thread_counts[0] else deviations.get(name)
            rows.append({"variant": name, "threads": threads, "layers": depth, "tokens_per_s_median": 1 / med,
                         "share_of_bf16_roofline": flops / med / max(roofs[threads]),
                         "speedup_vs_today": base / med, "seconds_per_token": per_token,
                         "vs_today_states": dev[str(depth)] if dev else None})
    out["variants"] = rows

    # the real encode path on a book's chunks: length-bucketed batches, today's and larger budgets
    roof = max(roofs[thread_counts[0]])
    texts = book_chunk_texts(backbone, 48 if quick else 96)
    if texts:
        ids = backbone.text_ids(texts)
        real = sum(len(i) + 1 for i in ids)
        path_rows = []
        for budget in (1280, 2560, 10240):
            padded = sum(x.numel() for _, _, x in backbone.sink_batches(ids, budget))
            per_round = []
            for _ in range(rounds):
                encoder = ChunkEncoder(backbone, [20], 7, batch_tokens=budget)
                t = time.perf_counter()
                encoder.encode(texts)
                per_round.append(time.perf_counter() - t)
            med = statistics.median(per_round)
            mean_len = real / len(ids)
            flops = flops_per_token(config, 20, round(mean_len))["flops_per_token"]
            path_rows.append({"batch_tokens": budget, "chunks": len(texts), "tokens": real,
                              "padding_share": 1 - real / padded, "tokens_per_s_median": real / med,
                              "share_of_bf16_roofline": real * flops / med / roof, "seconds": per_round})
            print(f"ChunkEncoder batch_tokens {budget}: {real / med:.0f} tok/s, padding {1 - real / padded:.1%}",
                  file=sys.stderr)
        out["chunk_encoder"] = path_rows
        out["thread_choice"] = thread_choice(backbone, texts, real, rounds)
        torch.set_num_threads(thread_counts[0])

    out["where_the_time_goes"] = {"eager": op_breakdown(lambda x: forward(x, 20), batches[0])}
    use_compiled(True)
    try:
        out["where_the_time_goes"]["compiled"] = op_breakdown(lambda x: forward(x, 20), batches[0])
    finally:
        use_compiled(False)
    out["load_1m_after"] = load_1m()
    return out


# 2. selector latency vs corpus size -----------------------------------------------------------------

def word_distribution() -> tuple[list[str], np.ndarray]:
    """Words and their frequencies from real text, for synthetic chunks that BM25 sees as text."""
    counts: Counter = Counter()
    root = data_dir() / "fairytaleqa" / "section-stories"
    files = sorted(root.glob("*/*.csv"))[:80] if root.is_dir() else []
    if files:
        for path in files:
            counts.update(re.findall(r"[a-z']+", path.read_text(encoding="utf-8").lower()))
    else:
        from evsel.paths import sample_story_path

        counts.update(re.findall(r"[a-z']+", sample_story_path().read_text(encoding="utf-8").lower()))
    words, freq = zip(*counts.most_common())
    p = np.array(freq, dtype=np.float64)
    return list(words), p / p.sum()


def synthetic_chunks(n: int, words: list[str], p: np.ndarray, rng: np.random.Generator, length: int = 100):
    from evsel.store.store import ChunkRecord

    picks = rng.choice(len(words), size=(n, length), p=p)
    chunks = []
    for i, row in enumerate(picks):
        text = " ".join(words[j] for j in row)
        chunks.append(ChunkRecord(id=i + 1, doc_id=1, seq=i, text=text, content_hash=str(i), n_tokens=length,
                                  char_start=0, char_end=len(text)))
    return chunks


QUESTIONS = ["what did the king give to the youngest son", "where did the old woman hide the golden key",
             "why was the fox afraid of the wolf", "who found the ring in the river"]


def bm25_latency(sizes: list[int], per_ask_max: int, quick: bool) -> list[dict]:
    from rank_bm25 import BM25Okapi

    from evsel.models.selectors.bm25 import BM25Selector, tokenize

    words, p = word_distribution()
    rng = np.random.default_rng(0)
    out = []
    for n in sizes:
        chunks = synthetic_chunks(n, words, p, rng)
        row: dict = {"chunks": n}
        if n <= per_ask_max:  # as `evsel eval` (chunks in memory) does it: tokenize and index per ask
            selector = BM25Selector(memory_context())
            t = time.perf_counter()
            selector.rank(QUESTIONS[0], chunks, 5)
            row["per_ask_s"] = time.perf_counter() - t
        t = time.perf_counter()
        index = BM25Okapi([tokenize(c.text) for c in chunks])
        row["index_build_s"] = time.perf_counter() - t
        times = []
        for q in QUESTIONS[: 2 if quick else 4]:
            t = time.perf_counter()
            scores = index.get_scores(tokenize(q))
            np.argpartition(-scores, 5)[:5]
            times.append(time.perf_counter() - t)
        row["query_s_median"] = statistics.median(times)
        row["peak_rss_mib"] = peak_rss_mib()
        out.append(row)
        print(f"bm25 {n:>8} chunks: query {row['query_s_median'] * 1000:.1f} ms, build {row['index_build_s']:.2f} s"
              + (f", per ask {row['per_ask_s']:.2f} s" if "per_ask_s" in row else ""), file=sys.stderr)
        del chunks, index
        gc.collect()
    return out


def memory_context(store=None):
    """A selector context without a backbone: `store` None is the in-memory BM25Okapi build."""
    from evsel.models.selectors import SelectorContext

    def no_backbone():
        raise RuntimeError("BM25 needs no backbone")

    return SelectorContext(load_backbone=no_backbone, states=None, store=store)


def bm25_store(sizes: list[int], doc_chunks: int, quick: bool, small_docs: int = 0) -> dict:
    """Per-ask BM25 in-process, the way `evsel --no-daemon ask --select bm25` runs it, on a store of
    synthetic documents of `doc_chunks` chunks: today's rebuild (BM25Okapi from the scope's chunk
    texts) against the index persisted at ingest (m004), in the same run, on the same chunks. Every
    ask opens the store afresh (a new process's connection) and reads its scope's chunks (`scope_s`,
    the same for both); the selection times are `BM25Selector.rank(question, chunks, 5)` alone (as
    `bm25_latency` times today's ask), with the persisted path's `scores` alone and its `rank` of
    the whole scope (a Scored per chunk) beside it. Both must give the same scores, bit for bit.
    The questions include one with a word in more than half of the chunks, so the idf floor (the
    average idf over the scope's vocabulary) is paid too. With `small_docs`, the
    largest size is run again with documents of that many chunks (many small documents: the most
    per-document rows a scope's statistics add up)."""
    import hashlib
    import tempfile

    from rank_bm25 import BM25Okapi

    from evsel.store import bm25_index
    from evsel.store.bm25_index import chunk_tokens, tokenize
    from evsel.models.selectors.bm25 import BM25Selector
    from evsel.store.store import Store, connect

    words, p = word_distribution()
    rng = np.random.default_rng(1)
    # a word of the distribution present in more than half of the 100-word chunks: the idf floor
    sample = synthetic_chunks(2000, words, p, rng)
    df: Counter = Counter(t for c in sample for t in set(chunk_tokens(c.text)))
    common, common_df = df.most_common(1)[0]
    questions = [*QUESTIONS[: 2 if quick else 4], f"when was the {common} in the forest"]
    out = {"doc_chunks": doc_chunks, "questions": questions, "floor_word": common,
           "floor_word_chunk_share": common_df / len(sample), "sizes": []}
    index_time = [0.0]
    real_index = bm25_index.index_document

    def timed_index(*args):
        t = time.perf_counter()
        real_index(*args)
        index_time[0] += time.perf_counter() - t

    runs = [(n, doc_chunks) for n in sizes] + ([(sizes[-1], small_docs)] if small_docs else [])
    for n, doc_chunks in runs:
        with tempfile.TemporaryDirectory(prefix="evsel-bm25-") as tmp:
            path = Path(tmp) / "evsel.db"
            store = Store(connect(path))
            collections = [store.collection_id(name, create=True) for name in ("a", "b")]
            index_time[0] = 0.0
            bm25_index.index_document = timed_index
            t = time.perf_counter()
            try:
                for d, start in enumerate(range(0, n, doc_chunks)):
                    chunks = synthetic_chunks(min(doc_chunks, n - start), words, p, rng)
                    rows = [{"seq": c.seq, "text": c.text, "content_hash": hashlib.sha256(c.text.encode()).hexdigest(),
                             "n_tokens": c.n_tokens, "char_start": c.char_start, "char_end": c.char_end}
                            for c in chunks]
                    doc = {"part": "", "kind": "book", "title": f"doc {d}", "metadata": {}, "n_chars": 0, "chunks": rows}
                    store.replace_file(collections[d % 2], f"/bench/doc{d}.txt", str(d), [doc])
            finally:
                bm25_index.index_document = real_index
            row: dict = {"chunks": n, "doc_chunks": doc_chunks, "documents": len(store.documents()),
                         "ingest_s": time.perf_counter() - t, "ingest_bm25_index_s": index_time[0]}
            store.db.execute("pragma wal_checkpoint(truncate)")
            pages = dict(store.db.execute("select name, sum(pgsize) from dbstat group by name").fetchall())
            row["db_mib"] = path.stat().st_size / 2**20
            row["bm25_tables_mib"] = sum(v for k, v in pages.items() if "bm25" in k) / 2**20
            row["chunks_table_mib"] = sum(v for k, v in pages.items() if k == "chunks" or "_chunks_" in k) / 2**20
            store.db.conn.close()
            for scope, kwargs in (("store", {}), ("collection", {"collection": "a"}), ("doc", {"doc_ids": [1]})):
                if scope != "store" and row["documents"] < 2:
                    continue
                # the same scores, bit for bit, for every question (checked outside the timings)
                store = Store(connect(path))
                chunks = store.chunks(**kwargs)
                okapi = BM25Okapi([chunk_tokens(c.text) for c in chunks])
                for q in questions:
                    if BM25Selector(memory_context(store)).scores(q, chunks) != okapi.get_scores(tokenize(q)).tolist():
                        raise AssertionError(f"persisted BM25 differs from BM25Okapi at {n} chunks, scope {scope}, {q!r}")
                store.db.conn.close()
                del okapi, chunks
                gc.collect()
                timings: dict[str, list[float]] = {"scope_s": [], "rebuild_s": [], "persisted_s": [],
                                                   "persisted_scores_s": [], "persisted_rank_all_s": []}
                for q in questions:
                    t = time.perf_counter()
                    store = Store(connect(path))  # what a fresh process opens
                    chunks = store.chunks(**kwargs)
                    timings["scope_s"].append(time.perf_counter() - t)
                    t = time.perf_counter()
                    today = BM25Selector(memory_context()).rank(q, chunks, 5)
                    timings["rebuild_s"].append(time.perf_counter() - t)
                    t = time.perf_counter()
                    persisted = BM25Selector(memory_context(store)).rank(q, chunks, 5)
                    timings["persisted_s"].append(time.perf_counter() - t)
                    if [(s.chunk.id, s.score) for s in today] != [(s.chunk.id, s.score) for s in persisted]:
                        raise AssertionError(f"persisted BM25 ranks differently at {n} chunks, scope {scope}, {q!r}")
                    t = time.perf_counter()
                    BM25Selector(memory_context(store)).scores(q, chunks)
                    timings["persisted_scores_s"].append(time.perf_counter() - t)
                    t = time.perf_counter()
                    BM25Selector(memory_context(store)).rank(q, chunks)  # every chunk as a Scored, no top_n
                    timings["persisted_rank_all_s"].append(time.perf_counter() - t)
                    store.db.conn.close()
                    del today, persisted
                    gc.collect()
                med = {k: statistics.median(v) for k, v in timings.items()}
                row[scope] = {
                    "chunks": len(chunks), **{f"{k}_median": v for k, v in med.items()},
                    **{f"{k}_max": max(v) for k, v in timings.items()},
                    "floor_question": {k: v[-1] for k, v in timings.items()},
                    "ratio_select": med["persisted_s"] / med["rebuild_s"],
                    "ratio_ask": (med["scope_s"] + med["persisted_s"]) / (med["scope_s"] + med["rebuild_s"]),
                    "identical_scores": True,
                }
                del chunks
            row["peak_rss_mib"] = peak_rss_mib()
            out["sizes"].append(row)
            s = row["store"]
            print(f"bm25 store {n:>8} chunks in {row['documents']:>5} documents: rebuild {s['rebuild_s_median']:.3f} s, persisted "
                  f"{s['persisted_s_median'] * 1000:.1f} ms (x{s['ratio_select']:.3f}); scope read "
                  f"{s['scope_s_median']:.3f} s; ingest index {row['ingest_bm25_index_s']:.1f} s", file=sys.stderr)
    return out


def maxsim_scores(keys: torch.Tensor, query: torch.Tensor, block: int = 1 << 16) -> torch.Tensor:
    """MaxSim(q, k_i) = sum_a max_b <q_a, k_i,b>. keys (N, L_p, d), query (G, d) -> (N,)."""
    n = keys.shape[0]
    out = torch.empty(n, dtype=torch.float32)
    for start in range(0, n, block):
        part = keys[start:start + block]  # (B, L_p, d)
        sims = part.reshape(-1, part.shape[-1]) @ query.T  # (B*L_p, G)
        out[start:start + block] = sims.view(part.shape[0], part.shape[1], -1).amax(1).float().sum(-1)
    return out


def maxsim_latency(sizes: list[int], max_gib: float, quick: bool) -> list[dict]:
    out = []
    gen = torch.Generator().manual_seed(0)
    for n in sizes:
        need = n * L_P * DIM * 2 / 2**30
        if need > max_gib:
            out.append({"chunks": n, "skipped": f"needs {need:.1f} GiB of chunk states, over --max-gib {max_gib}"})
            print(f"maxsim {n:>8} chunks: skipped ({need:.1f} GiB)", file=sys.stderr)
            continue
        keys = torch.empty(n, L_P, DIM, dtype=torch.bfloat16)
        for start in range(0, n, 1 << 16):  # fill in blocks: no fp32 copy of the whole array
            block = keys[start:start + (1 << 16)]
            block.copy_(torch.randn(block.shape, generator=gen))
        query = torch.randn(QUERY_VECTORS, DIM, generator=gen).to(torch.bfloat16)
        maxsim_scores(keys[: min(n, 1024)], query)  # warm-up
        times = []
        for _ in range(3 if quick else 7):
            t = time.perf_counter()
            scores = maxsim_scores(keys, query)
            torch.topk(scores, 5)
            times.append(time.perf_counter() - t)
        row = {"chunks": n, "states_gib": need, "query_s_median": statistics.median(times),
               "query_s_best": min(times), "peak_rss_mib": peak_rss_mib()}
        out.append(row)
        print(f"maxsim {n:>8} chunks: {row['query_s_median'] * 1000:.1f} ms", file=sys.stderr)
        del keys
        gc.collect()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats (smoke run)")
    parser.add_argument("--max-gib", type=float, default=4.0,
                        help="largest MaxSim state array to allocate (default 4 GiB: 10^6 chunks need 7.5)")
    parser.add_argument("--bm25-max", type=int, default=100_000,
                        help="largest BM25 corpus (rank-bm25 keeps a Python dict per chunk: 10^6 needs ~6 GB)")
    parser.add_argument("--bm25-per-ask-max", type=int, default=100_000,
                        help="largest corpus for the per-ask BM25 timing (tokenizes every chunk each ask)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads for every part (default 1: on a CPU shared with other jobs, spin-waiting "
                             "OpenMP threads make multi-threaded timings meaningless; the roofline uses the same)")
    parser.add_argument("--bm25-doc-chunks", type=int, default=1000,
                        help="chunks per synthetic document in the BM25 store benchmark (1000 ~ a novel)")
    parser.add_argument("--bm25-small-docs", type=int, default=10,
                        help="also run the largest BM25 store with documents of this many chunks (0: not)")
    parser.add_argument("--only", choices=["bm25-store", "encode-variants"], default=None,
                        help="run one part alone: bm25-store writes bench/results/bm25.json, encode-variants "
                             "bench/results/encode_variants.json (unless --out)")
    parser.add_argument("--out", type=Path, default=None,
                        help="default bench/results/throughput.json (bench/results/bm25.json with --only bm25-store)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    info = run_info(["python", "bench/throughput.py", *(argv if argv is not None else sys.argv[1:])])
    store_sizes = [10**3, 10**4] if args.quick else [10**3, 10**4, 10**5]
    if args.only == "bm25-store":
        out = args.out or HERE / "results" / "bm25.json"
        started = time.perf_counter()
        result = {"benchmark": "bm25-store", "run": info,
                  "bm25_store": bm25_store(store_sizes, args.bm25_doc_chunks, args.quick, args.bm25_small_docs),
                  "peak_rss_mib": peak_rss_mib(), "seconds": time.perf_counter() - started}
        write_result(out, result)
        print(f"wrote {out}", file=sys.stderr)
        return 0
    if args.only == "encode-variants":
        out = args.out or HERE / "results" / "encode_variants.json"
        started = time.perf_counter()
        result = {"benchmark": "encode-variants", "run": info,
                  "encoding": encode_variants(args.quick, [args.threads] + ([2] if args.threads != 2 else [])),
                  "peak_rss_mib": peak_rss_mib(), "seconds": time.perf_counter() - started}
        write_result(out, result)
        print(f"wrote {out}", file=sys.stderr)
        return 0
    args.out = args.out or HERE / "results" / "throughput.json"

    from evsel.models.runtime.backbone import Backbone

    sizes = [10**3, 10**4] if args.quick else [10**3, 10**4, 10**5, 10**6]
    started = time.perf_counter()
    roof = roofline(args.quick)
    print(f"roofline: bf16 {roof['bf16']['flops'] / 1e9:.1f} GFLOP/s, fp32 {roof['fp32']['flops'] / 1e9:.1f} GFLOP/s",
          file=sys.stderr)
    backbone = Backbone()
    enc = encoding(backbone, roof, args.quick)
    for layer, row in enc["layers"].items():
        print(f"encode to layer {layer}: {row['tokens_per_s_median']:.0f} tok/s, "
              f"{row['share_of_bf16_roofline']:.1%} of bf16 roofline, {row['share_of_fp32_roofline']:.1%} of fp32",
              file=sys.stderr)
    enc["peak_rss_mib"] = peak_rss_mib()
    del backbone
    gc.collect()
    bm25 = bm25_latency([n for n in sizes if n <= args.bm25_max], args.bm25_per_ask_max, args.quick)
    store = bm25_store(store_sizes, args.bm25_doc_chunks, args.quick, args.bm25_small_docs)
    maxsim = maxsim_latency(sizes, args.max_gib, args.quick)
    result = {
        "benchmark": "throughput",
        "run": info,
        "roofline": roof,
        "encoding": enc,
        "bm25": bm25,
        "bm25_skipped_sizes": [n for n in sizes if n > args.bm25_max],
        "bm25_store": store,
        "maxsim": maxsim,
        "maxsim_layout": {"vectors_per_chunk": L_P, "dim": DIM, "query_vectors": QUERY_VECTORS, "dtype": "bfloat16"},
        "peak_rss_mib": peak_rss_mib(),
        "seconds": time.perf_counter() - started,
    }
    write_result(args.out, result)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
