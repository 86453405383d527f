"""Write docs/RESULTS.md from the latest run JSONs under bench/results/.

    python bench/make_results.py

Reads eval-*.json (from `evsel eval ... --json`; eval-<set>-pdf-<reader>.json side by side too), pdf-reader-ingest.json, scaling.json, throughput.json, encode_variants*.json (the latest run, then earlier machines' as encode_variants-<cpu>.json), bm25.json,
unreal.json, daemon.json, startup.json, generate.json and faults.json; every section
states the machine, commit, date and exact command of the run it shows. Nothing here is typed in
by hand: rerun a benchmark, then this script.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
OUT = HERE.parent / "docs" / "RESULTS.md"

# the order datasets appear in; others follow alphabetically
ORDER = ["locomo", "locomo-unreal", "fairytaleqa", "fairytaleqa-unreal", "fairytaleqa-concat23", "musique", "musique-llm", "hotpotqa", "hotpotqa-llm",
         "locomo-fold2-qrranker-crossfold", "locomo-fold2-qrranker-shipped", "mmlongbench", "financebench", "nocha",
         "locomo-generate", "fairytaleqa-generate"]


def f3(value) -> str:
    return "–" if value is None else f"{value:.3f}"


def ms(entry: dict | None) -> str:
    return "–" if not entry else f"{entry['median'] * 1000:.0f} / {entry['p95'] * 1000:.0f}"


def provenance(run: dict) -> list[str]:
    m = run.get("machine", {})
    return [
        f"- command: `{run.get('command', '?')}`",
        f"- commit: `{run.get('commit') or 'unknown'}`, run at {run.get('when', '?')}",
        f"- machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores ({m.get('torch_threads', '?')} torch thread(s)), "
        f"Python {m.get('python', '?')}, torch {m.get('torch', '?')}, {m.get('platform', '?')}; "
        "the CPU is shared with other jobs, so timings are upper bounds",
    ]


def eval_section(path: Path, result: dict) -> list[str]:
    data, config, methods = result["dataset"], result["config"], result["methods"]
    ks = config["k"]
    hk = 5 if 5 in ks else ks[len(ks) // 2]
    title = path.stem[len("eval-"):]
    out = [f"### {title}", ""]
    out += provenance(result.get("run", {}))
    out.append(f"- data: {data['questions']} questions ({data['questions_with_gold']} with gold evidence) of "
               f"{data['questions_in_dataset']}, {data['documents']} documents, {data['chunks']} chunks "
               f"(mean {data['chunk_tokens_mean']:.0f} tokens); gold resolved: "
               + ", ".join(f"{k} {v}" for k, v in sorted(data["gold_resolution"].items())))
    for note in data["notes"]:
        out.append(f"- {note}")
    out.append("")
    generate = config["generate"]
    ranked = any(m.get(f"recall@{ks[0]}") is not None for m in methods.values())  # NoCha has no gold evidence
    head = ["method"] + ([f"R@{k}" for k in ks] + [f"all@{hk}", "MRR"] if ranked else [])
    has_locomo = any("locomo_f1" in m for m in methods.values())
    has_pairs = any("pair_accuracy" in m for m in methods.values())
    if generate:
        head += ["EM", "F1"] + (["LoCoMo F1"] if has_locomo else []) + (["claim acc", "pair acc"] if has_pairs else [])
        abstains = any("abstention" in m for m in methods.values())
        graded = any((m.get("abstention") or {}).get("unanswerable") for m in methods.values())
        head += (["abstain"] if abstains else []) + (["abstain P / R (adversarial)"] if graded else [])
        head += ["prompt tokens", "generate ms (med / p95)"]
    head += ["select ms (med / p95)", "index s"]
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "---|" * len(head))
    for spec, m in methods.items():
        row = [f"`{spec}`"]
        if ranked:
            row += [f3(m.get(f"recall@{k}")) for k in ks] + [f3(m.get(f"complete@{hk}")), f3(m.get("mrr"))]
        if generate:
            row += [f3(m.get("em")), f3(m.get("f1"))]
            row += [f3(m.get("locomo_f1"))] if has_locomo else []
            row += [f3(m.get("correct")), f3(m.get("pair_accuracy"))] if has_pairs else []
            abstention = m.get("abstention") or {}
            row += [f3(abstention.get("rate"))] if abstains else []
            row += [f"{f3(abstention.get('precision'))} / {f3(abstention.get('recall'))}"] if graded else []
            tokens = m.get("prompt_tokens")
            row.append(("–" if tokens is None else f"{tokens:.0f}")
                       + (f" ({m['not_fitting']} did not fit)" if m.get("not_fitting") else ""))
            row.append(ms(m["latency"].get("generate_s")))
        row += [ms(m["latency"].get("select_s")), f"{m['index_s']:.1f}"]
        out.append("| " + " | ".join(row) + " |")
    separate = data.get("separate_groups") or []
    if separate:
        out.append(f"\nHeadline rows exclude {', '.join(separate)}; it is in the breakdown below.")
    # groups with no gold evidence (unanswerable questions) have no recall to show
    groups = sorted({g for m in methods.values() for g, v in m["groups"].items() if v.get("with_gold")})
    if len(groups) > 1:
        out += ["", f"recall@{hk} by group (questions with gold evidence in brackets):", ""]
        first = next(iter(methods.values()))
        out.append("| method | " + " | ".join(f"{g} ({first['groups'].get(g, {}).get('with_gold', 0)})" for g in groups) + " |")
        out.append("|" + "---|" * (len(groups) + 1))
        for spec, m in methods.items():
            out.append(f"| `{spec}` | " + " | ".join(f3(m["groups"].get(g, {}).get(f"recall@{hk}")) for g in groups) + " |")
    png = path.with_suffix(".png")
    if png.exists():
        out += ["", f"![{title} recall@k](../bench/results/{png.name})"]
    out.append("")
    return out


SCALING_1M_NOTE = (
    "The keys and embeddings of the whole 1.28M-token pool were computed once before this run, by "
    "`EVSEL_THREADS=1 python bench/scaling.py --methods bm25,dense,blocksearch:router,blocksearch:ssmax8k "
    "--questions 20 --encode-only` at nice 19 beside other jobs: BlockSearch's routing keys 1,102 s (about "
    "1,160 tokens/s), MiniLM 389 s; the run above read them back. At 1M tokens in-context retrieval does not "
    "match dense here, against the seed's report: recall@5 0.30 (router) and 0.35 (SSMax 8K) against dense's "
    "0.55 and BM25's 0.75, the gold's median rank 16.5 and 12 against 1.5 and 1. Up to 128K they are within "
    "a few ranks of dense; the gap opens past 128K (not diagnosed yet).")


def scaling_section(result: dict, throughput: dict | None = None, title: str = "Long-context scaling (bench/scaling.py)",
                    image: str = "scaling.png", note: str = "") -> list[str]:
    config = result["config"]
    lengths = config["lengths"]
    ks = config["k"]
    out = [f"## {title}", ""]
    out += provenance(result["run"])
    out += [f"- {config['questions']} FairytaleQA val questions (one gold section each); contexts padded with "
            f"distractor passages from a pool of {config['pool_passages']} passages ({config['pool_tokens']:,} "
            f"tokens: other FairytaleQA stories and the NoCha novels), seed {config['seed']}, gold at a fixed "
            "relative depth per question", ""]
    mean_tokens = result["context_tokens_mean"]
    out.append("| method | " + " | ".join(f"{int(L) // 1000}K" for L in lengths) + " |")
    out.append("|" + "---|" * (len(lengths) + 1))
    out.append("| context tokens (mean) | " + " | ".join(f"{mean_tokens[str(L)]:,.0f}" for L in lengths) + " |")
    for spec, by_length in result["methods"].items():
        if all("rank_median" in by_length[str(L)] for L in lengths):
            out.append(f"| `{spec}` gold's rank (median) | "
                       + " | ".join(f"{by_length[str(L)]['rank_median']:g}" for L in lengths) + " |")
    for k in ks:
        for spec, by_length in result["methods"].items():
            out.append(f"| `{spec}` recall@{k} | " + " | ".join(f3(by_length[str(L)][f'recall@{k}']) for L in lengths) + " |")
    for spec, by_length in result["methods"].items():
        out.append(f"| `{spec}` select s (median) | "
                   + " | ".join(f"{by_length[str(L)]['select_s_median']:.3f}" for L in lengths) + " |")
    for spec, by_length in result["methods"].items():
        out.append(f"| `{spec}` TTFT s (select + read top-{config['top_n']}) | "
                   + " | ".join(f"{by_length[str(L)]['ttft_s']:.2f}" for L in lengths) + " |")
    full = result["full_context"]
    measured = {int(k): v for k, v in full["ttft_measured_s"].items()}
    rate = None
    if throughput and "20" in throughput["encoding"]["layers"]:
        # a cold ask of UNREAL-style selection: every context token encoded to layer 20 first
        rate = throughput["encoding"]["layers"]["20"]["tokens_per_s_median"]
        out.append(f"| UNREAL-style cold ask s (projected: encode to layer 20 at {rate:,.0f} tok/s + read top-"
                   f"{config['top_n']}) | " + " | ".join(
                       f"{mean_tokens[str(L)] / rate + full['read_top_n_prefill_s']:.0f}" for L in lengths) + " |")
    out.append("| full context TTFT s | " + " | ".join(
        (f"{measured[L]:.2f}" if L in measured else f"{full['ttft_projected_s'][str(L)]:.1f} (projected)")
        for L in lengths) + " |")
    fm = result["flop_model"]
    out += ["", "Full-context time to first token, measured (one prefill of the whole prompt, best of two): "
            + ", ".join(f"{n:,} tokens {s:.2f} s" for n, s in sorted(measured.items()))
            + f". Beyond {full['projected_from']:,} tokens it is projected with the FLOP model of UNREAL Appendix C "
            "(weights 2Θ per token plus 2·L·d_a·N(N+1) attention); SmolLM2's window is "
            f"{full['window']:,} tokens, so those lengths cannot actually be read in one pass. Reading the top "
            f"{config['top_n']} passages ({full['read_top_n_tokens']} tokens) takes {full['read_top_n_prefill_s']:.2f} s.",
            "",
            f"Break-even length (Appendix C eq. 10) for this backbone: Θ = {fm['theta'] / 1e6:.1f}M matrix parameters, "
            f"κ = Θ/(L·d_a) = {fm['kappa']:.0f}, ℓ_c = {fm['l_c']} (λ = {fm['lambda']:.2f}), n = {fm['n']}, T = {fm['T']}, "
            f"|x_ret| = {fm['x_ret']}: **N\\* ≈ {fm['n_star_tokens']:,.0f} tokens**. Above it, UNREAL-style selection "
            "costs fewer FLOPs than reading everything; for a model this small the weights are cheap relative to "
            "attention, so the crossover comes early (the paper's 30B backbones cross near 18K).",
            "",
            "Selection times exclude index time, paid once per chunk and then cached: "
            + ", ".join(f"{spec} {sec:.0f} s" for spec, sec in result["index_s_total"].items())
            + f" for all {config['questions']} questions and lengths (dense: MiniLM embeddings of every pool chunk "
            "that appeared in a context). A model-internal selector pays chunk encoding the same way: the "
            "projected cold-ask row above is what the first question about an unencoded context would cost.",
            *(["", note] if note else []),
            "", f"![scaling](../bench/results/{image})", ""]
    return out


def seconds(value: float) -> str:
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def blocksearch_section(result: dict) -> list[str]:
    """bench/blocksearch.py: routing latency against scope size over cached keys, BM25 in the same run."""
    cache = result["cache"]
    out = ["## BlockSearch routing latency (bench/blocksearch.py)", ""]
    out += provenance(result["run"])
    out += [f"- {result['backbone']}, {result['threads']} thread(s); routing layer {cache['layer']}; the sample "
            f"story's keys ({cache['chunks']} chunks, {cache['key_tokens']:,} tokens) repeated to N chunks; "
            "prefix query mode, warm (keys cached and packed)", "",
            "| chunks | key tokens | MaxSim | mass | mass+SSMax | BM25 | MaxSim / BM25 | mass / BM25 | pack |",
            "|---|---|---|---|---|---|---|---|---|"]
    for row in result["scaling"]:
        out.append(f"| {row['chunks']:,} | {row['key_tokens']:,} | {seconds(row['maxsim_s'])} | "
                   f"{seconds(row['mass_s'])} | {seconds(row['mass+ssmax_s'])} | {seconds(row['bm25_s'])} | "
                   f"{row['maxsim_over_bm25']:.0f}x | {row['mass_over_bm25']:.0f}x | {seconds(row['pack_s'])} |")
    out += ["", f"Key cache: {cache['bytes_per_token_keys']} bytes a token of keys, {cache['disk_bytes_per_token']:.0f} "
            f"on disk with the file headers ({cache['disk_per_million_tokens_mb']:.0f} MiB per million tokens); "
            f"encoding the sample's keys took {cache['encode_s']:.1f} s, reading them back {cache['read_s'] * 1000:.0f} ms.",
            ""]
    return out


def throughput_section(result: dict) -> list[str]:
    enc, roof = result["encoding"], result["roofline"]
    out = ["## Throughput (bench/throughput.py)", ""]
    out += provenance(result["run"])
    out += ["", f"Matmul roofline measured in the same run ({enc['threads']} torch thread(s)): "
            f"bf16 {roof['bf16']['flops'] / 1e9:.0f} GFLOP/s, fp32 {roof['fp32']['flops'] / 1e9:.0f} GFLOP/s "
            "(best of a 2048³ product and the model's 2240×576×1536 MLP shape).", "",
            f"Chunk encoding, batch {enc['batch'][0]}×{enc['batch'][1]} tokens, {enc['dtype']} on {enc['device']} "
            f"({enc['reason']}):", "",
            "| layers run | tokens/s (median) | MFLOP/token | achieved GFLOP/s | % of bf16 roofline | % of fp32 roofline |",
            "|---|---|---|---|---|---|"]
    for layer, row in enc["layers"].items():
        out.append(f"| {layer} | {row['tokens_per_s_median']:,.0f} | {row['flops_per_token'] / 1e6:.0f} | "
                   f"{row['achieved_flops'] / 1e9:.1f} | {row['share_of_bf16_roofline']:.1%} | "
                   f"{row['share_of_fp32_roofline']:.1%} |")
    out += ["", "FLOPs per token: 2 per weight (q, k, v, o, gate, up, down) per layer run, plus causal attention "
            "2·d_a·(T+1) per layer; no LM head (the forward stops at the layer). The encoder runs in bf16, whose "
            "matmuls here (AMX) outrun the fp32 peak, so its share of the fp32 roofline can exceed 100%; the "
            "bf16 share is the one that says how much of the machine the forward pass uses (the rest goes to "
            "small matrices, attention, norms, activations and framework overhead).", "",
            "Selector latency per query vs number of chunks (synthetic chunks; BM25 words follow real word "
            "frequencies; MaxSim over 7×576 bf16 vectors per chunk, 4 query vectors):", "",
            "| chunks | BM25 per ask, index built from the chunks (s) | BM25 index build (s) | BM25 query, prebuilt index (ms) | MaxSim query (ms) |",
            "|---|---|---|---|---|"]
    bm25 = {r["chunks"]: r for r in result["bm25"]}
    maxsim = {r["chunks"]: r for r in result["maxsim"]}
    for n in sorted(set(bm25) | set(maxsim) | set(result.get("bm25_skipped_sizes", []))):
        b, m = bm25.get(n), maxsim.get(n)
        cells = [f"{n:,}",
                 f"{b['per_ask_s']:.2f}" if b and "per_ask_s" in b else "–",
                 f"{b['index_build_s']:.2f}" if b else "not run (memory)",
                 f"{b['query_s_median'] * 1000:.1f}" if b else "–",
                 (f"{m['query_s_median'] * 1000:.1f}" if m and "query_s_median" in m else f"skipped: {m['skipped']}" if m else "–")]
        out.append("| " + " | ".join(cells) + " |")
    out += ["", f"Peak RSS of the whole run: {result['peak_rss_mib']:,.0f} MiB.", ""]
    return out


def encode_variants_section(result: dict) -> list[str]:
    """Ways of running the chunk-encoding forward pass, each against the roofline of the same run."""
    enc = result["encoding"]
    cpu = result["run"].get("machine", {}).get("cpu", "?")
    out = [f"## Encoding variants against the roofline (bench/throughput.py --only encode-variants), {cpu}", ""]
    out += provenance(result["run"])
    roofs = ", ".join(f"{t} thread(s) {v / 1e9:.0f}" for t, v in enc["roofline_bf16_flops"].items())
    out += [f"- load average (1 min) {enc['load_1m_before']:.1f} before, {enc['load_1m_after']:.1f} after, on 2 cores",
            "", f"Each variant ran in each of {enc['rounds']} rounds, alternated with the others and with a bf16 "
            f"matmul roofline measured in that round (best per thread count: {roofs} GFLOP/s); medians. "
            f"Real-text batches of {enc['batch'][0]}×{enc['batch'][1]} tokens, {enc['dtype']}; speed-up is against "
            "today's path at the first thread count, in the same run.", "",
            "| variant | threads | layers run | tokens/s (median) | % of bf16 roofline | speed-up vs today | "
            "pooled-vector error vs today, max |",
            "|---|---|---|---|---|---|---|"]
    for row in enc["variants"]:
        dev = row.get("vs_today_states")
        error = "–" if dev is None else f"{dev['max_rel_l2_pooled']:.2%}"
        out.append(f"| {row['variant']} | {row['threads']} | {row['layers']} | {row['tokens_per_s_median']:,.0f} | "
                   f"{row['share_of_bf16_roofline']:.1%} | {row['speedup_vs_today']:.2f}x | {error} |")
    out += encode_variants_verdict(enc)
    comp = enc["compile"]

    def spread(dev: dict) -> str:
        return "; ".join(f"layer {k}: {v['median_rel_l2_per_token']:.2%} median / {v['max_rel_l2_per_token']:.2%} max "
                         f"per token, {v.get('median_rel_l2_pooled', float('nan')):.2%} / "
                         f"{v.get('max_rel_l2_pooled', float('nan')):.2%} per pooled vector" for k, v in dev.items())

    cache = {True: " (inductor's on-disk cache was warm)", False: " (inductor's on-disk cache was cold)"}.get(
        comp.get("inductor_cache_warm"), "")
    out += ["", f"torch.compile (each decoder layer's forward, dynamic shapes): the first call took "
            f"{comp['first_call_s']:.0f} s{cache}, a new batch shape {comp['new_shape_s']:.1f} s after it.", "",
            "Relative L2 error against today's eager states of the same 16 rows (the sink token left out; a "
            "pooled vector is one of the 7 segment means the state cache keeps):", "",
            f"- torch.compile: {spread(enc['compiled_vs_eager'])}"]
    if enc.get("eager_alone_vs_batched"):
        out.append(f"- today's eager path, each row encoded alone instead of in the batch (the spread evsel already "
                   f"has between batch shapes): {spread(enc['eager_alone_vs_batched'])}")
    out.append("")
    if enc.get("chunk_encoder"):
        out += ["The real encode path (`ChunkEncoder`, chunks sorted into length buckets by `sink_batches`) on "
                "the Sherlock Holmes book's first chunks, to layer 20:", "",
                "| batch budget (tokens) | chunks | padding share | tokens/s (median) | % of bf16 roofline |",
                "|---|---|---|---|---|"]
        for row in enc["chunk_encoder"]:
            out.append(f"| {row['batch_tokens']:,} | {row['chunks']} | {row['padding_share']:.1%} | "
                       f"{row['tokens_per_s_median']:,.0f} | {row['share_of_bf16_roofline']:.1%} |")
        out.append("")
    choice = enc.get("thread_choice")
    if choice:
        measured = ", ".join(f"{n} thread(s) {v:,.0f}" for n, v in choice["measure_tokens_per_s"].items())
        out += [f"The same path (today's 2,560-token budget, {choice['chunks']} chunks, {choice['tokens']:,} tokens) at "
                f"torch's default thread count (one per CPU: {choice['default_threads']}, what evsel ran with "
                "EVSEL_THREADS unset) and at the count `models/runtime/cpu_threads.py` measures at a model's first load on "
                f"the machine and records (measured again in this run, in {choice['measure_s']:.1f} s: {measured} "
                f"tokens/s on its short pass; it chose {choice['chosen']}), alternated in {enc['rounds']} rounds; "
                "the states are bit for bit the same (tests/test_cpu_threads.py):", "",
                "| threads | tokens/s (median) | vs torch's default |", "|---|---|---|"]
        base = choice["chunk_encoder"][str(choice["default_threads"])]["tokens_per_s_median"]
        for n, row in choice["chunk_encoder"].items():
            roles = [role for role, count in (("torch's default", choice["default_threads"]),
                                              ("measured choice", choice["chosen"])) if int(n) == count]
            label = f"{n} ({', '.join(roles)})"
            out.append(f"| {label} | {row['tokens_per_s_median']:,.0f} | {row['tokens_per_s_median'] / base:.2f}x |")
        out.append("")
    where = enc["where_the_time_goes"]
    groups = [k for k in where["eager"] if k != "profiled_s"]
    out += ["Where one 16×140 batch's time goes to layer 20 (torch.profiler, share of self CPU time):", "",
            "| | " + " | ".join(groups) + " | profiled (s) |", "|---|" + "---|" * (len(groups) + 1)]
    for name, shares in where.items():
        out.append(f"| {name} | " + " | ".join(f"{shares[g]:.0%}" for g in groups) + f" | {shares['profiled_s']:.2f} |")
    out += ["", "Compiled, the profiler sees inductor's fused C++ kernels (norms, RoPE, SiLU·mul, residual adds) only "
            "as the compiled region's own time, so the elementwise work is counted in the last column there."]
    matmul = where["eager"].get("matmul")
    if matmul:
        out += ["", f"With every operator but the matrix products taking no time at all, the eager pass would be at "
                f"most {1 / matmul:.2f}x faster (1 / the products' {matmul:.0%} share): what any fusion of the rest "
                "can give on this machine."]
    out += ["", f"Peak RSS of the run: {result['peak_rss_mib']:,.0f} MiB.", ""]
    return out


def encode_variants_verdict(enc: dict, tolerance: float = 0.02) -> list[str]:
    """Which variant won at the first thread count, to layer 20, among those whose pooled states stay
    within the tests' tolerance of today's, and which were faster but out of it."""
    rows = [r for r in enc["variants"] if r["layers"] == 20 and r["threads"] == enc["threads"][0]]
    measured = [r for r in rows if r.get("vs_today_states") is not None or r["speedup_vs_today"] == 1.0]
    if not any(r.get("vs_today_states") for r in rows):
        return []

    def error(r):
        dev = r.get("vs_today_states")
        return 0.0 if dev is None else dev["max_rel_l2_pooled"]

    within = [r for r in measured if error(r) <= tolerance]
    best = max(within, key=lambda r: r["speedup_vs_today"])
    out = ["", f"To layer 20 at {enc['threads'][0]} thread(s), of the variants whose states were compared with today's, "
           f"the fastest within the {tolerance:.0%} the tests allow is **{best['variant']}** "
           f"({best['speedup_vs_today']:.2f}x today's tokens/s in this run)."]
    outside = [r for r in measured if error(r) > tolerance]
    if outside:
        out[-1] += " Out of that tolerance: " + "; ".join(
            f"{r['variant']} {r['speedup_vs_today']:.2f}x, {error(r):.1%} max pooled error" for r in outside) + "."
    return out


def bm25_store_section(result: dict) -> list[str]:
    """BM25 per in-process ask: the index persisted at ingest (m004) against today's rebuild."""
    b = result["bm25_store"]
    sizes = b["sizes"]
    layouts = sorted({r.get("doc_chunks", b["doc_chunks"]) for r in sizes}, reverse=True)
    out = ["## BM25 per ask: persisted index vs rebuild (bench/throughput.py)", ""]
    out += provenance(result["run"])
    out += ["", "An in-process ask (`evsel --no-daemon ask --select bm25`) on a store of synthetic documents of "
            + " or ".join(f"{n:,}" for n in layouts) + " chunks (100 words each, drawn from real word frequencies; "
            "two collections). **Rebuild** is how every ask ranked before m004 (and how `evsel eval` still does, "
            "its chunks being in memory): BM25Okapi built from the scope's chunk texts, then scored. **Persisted** "
            "reads the scope's statistics and the query terms' postings from the index written at ingest "
            "(`evsel/bm25_index.py`). Both run in the same process on the same chunks, one after the other for "
            "each question, as `BM25Selector.rank(question, chunks, 5)`, and give identical scores (checked bit "
            f"for bit for every question). Times are medians over {len(b['questions'])} questions, one of which "
            f"has a word in {b['floor_word_chunk_share']:.0%} of the chunks ('{b['floor_word']}'), so the idf "
            "floor's average idf over the scope's whole vocabulary is paid too (its own time: *floor*). *Scope "
            "read* is `Store.chunks` on a freshly opened store, the same for both; the whole-ask ratio includes "
            "it.", "",
            "| chunks | documents | rebuild per ask (s) | persisted per ask (ms) | ratio | persisted, floor question (ms) "
            "| scope read (s) | whole-ask ratio, with scope read | ingest: BM25 index write (s) "
            "| BM25 tables / chunks table (MiB) |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for row in sizes:
        s = row["store"]
        out.append(f"| {row['chunks']:,} | {row['documents']:,} | {s['rebuild_s_median']:.3f} | "
                   f"{s['persisted_s_median'] * 1000:.1f} | **{s['ratio_select']:.3f}x** | "
                   f"{s['floor_question']['persisted_s'] * 1000:.1f} | {s['scope_s_median']:.3f} | "
                   f"{s['ratio_ask']:.3f}x | {row['ingest_bm25_index_s']:.1f} | "
                   f"{row.get('bm25_tables_mib', 0):.1f} / {row.get('chunks_table_mib', 0):.1f} |")
    largest = max(r["chunks"] for r in sizes)
    scoped = [(row, name) for row in sizes if row["chunks"] == largest for name in ("collection", "doc") if name in row]
    if scoped:
        out += ["", f"Narrower scopes of the {largest:,}-chunk stores (`--collection a`: half the documents; "
                "`--doc 1`):", "",
                "| documents in store | scope | chunks | rebuild per ask (s) | persisted per ask (ms) | ratio |",
                "|---|---|---|---|---|---|"]
        for row, name in scoped:
            s = row[name]
            out.append(f"| {row['documents']:,} | {name} | {s['chunks']:,} | {s['rebuild_s_median']:.3f} | "
                       f"{s['persisted_s_median'] * 1000:.1f} | {s['ratio_select']:.3f}x |")
    big = [r["store"] for r in sizes if r["chunks"] == largest]
    if big and "persisted_rank_all_s_median" in big[0]:
        out += ["", f"At {largest:,} chunks the persisted scores themselves take "
                + " / ".join(f"{s['persisted_scores_s_median'] * 1000:.0f}" for s in big)
                + " ms; ranking the whole scope (a `Scored` per chunk, no top-n) takes "
                + " / ".join(f"{s['persisted_rank_all_s_median'] * 1000:.0f}" for s in big) + " ms."]
    out += ["", f"Rerun: `{result['run'].get('command', '')}`.", ""]
    return out


def unreal_section(result: dict) -> list[str]:
    enc = result["encoding"]
    out = ["## UNREAL speed (bench/unreal.py)", ""]
    if "run" in result:
        out += provenance(result["run"])
    out += ["", f"{result['backbone']} ({result['device']}, {result['dtype']}, {result['threads']} thread(s)); chunk "
            f"states at layer {result['layer']} of {result['layers']}.", "",
            "| chunk encoding | layers run | tokens/s |", "|---|---|---|",
            f"| stopped at l_c | {enc['l_c']['depth']} | {enc['l_c']['tokens_per_s']:,.0f} |",
            f"| every layer | {enc['full']['depth']} | {enc['full']['tokens_per_s']:,.0f} |",
            "", f"Stopping at l_c encodes {enc['speedup']:.2f}x faster than running every layer.", "",
            "MaxSim per ask over a scope's keys (standardized fp32, built once per scope and kept by the daemon): "
            + ", ".join(f"{r['chunks']:,} chunks {r['seconds'] * 1000:.0f} ms"
                        + (f" (keys built in {r['keys_build_seconds']:.2f} s)" if "keys_build_seconds" in r else "")
                        for r in result["maxsim"]) + ".", "",
            "UNREAL selection time per question vs document length, model loaded (the selector's rank: C0 by BM25, "
            "the query pass, MaxSim; cold: the chunks are encoded during the ask; warm: their states come from the "
            "state cache):", "",
            "| chunks | tokens | cold (s) | warm (s) | cold s per 1K tokens |", "|---|---|---|---|---|"]
    for row in result["ask"]:
        out.append(f"| {row['chunks']} | {row['tokens']:,} | {row['cold_s']:.2f} | {row['warm_s']:.2f} | "
                   f"{row['cold_s_per_1k_tokens']:.3f} |")
    fit = result.get("cold_linear_fit")
    if fit:
        out += ["", f"Linear fit of the cold time: {fit['seconds_per_1k_tokens']:.3f} s per 1K tokens + "
                f"{fit['intercept_s']:.2f} s, R² = {fit['r2']}: cold latency grows linearly with length; the warm "
                "ask is the query pass plus MaxSim, nearly flat."]
    return out + [""]


def daemon_section(result: dict) -> list[str]:
    out = ["## Warm daemon vs in-process (bench/daemon.py)", ""]
    out += provenance(result["run"])
    answer, evidence = result["answer"], result["evidence_only"]
    out += [f"- book: `{Path(result['book']).name}`; OMP_NUM_THREADS={result['omp_num_threads']} for every "
            f"process (the daemon too); load average before/after: {result.get('load_average_before')} / "
            f"{result.get('load_average_after')}", "",
            "Whole-process `evsel ask` as a user runs it, cold (`--no-daemon`: imports, model load, chunks, "
            "ranking, generation) vs warm (through a daemon with the model loaded), alternating, median over "
            f"{len(answer['runs'])} questions; answers identical in both modes: "
            f"{answer['all_identical'] and evidence['all_identical']}.", "",
            "| ask | cold (s) | warm (s) | warm / cold (target ≤ 0.1) | without generation: cold / warm (s) | ratio |",
            "|---|---|---|---|---|---|"]
    for name, r in (("with an answer (max %d new tokens)" % result["max_new_tokens"], answer),
                    ("--evidence-only", evidence)):
        out.append(f"| {name} | {r['cold_median_s']:.2f} | {r['warm_median_s']:.2f} | {r['ratio_of_medians']:.3f} | "
                   f"{r['cold_without_generate_median_s']:.2f} / {r['warm_without_generate_median_s']:.2f} | "
                   f"{r['ratio_without_generate']:.3f} |")
    b = answer["warm_breakdown_median"]
    out += ["", "Warm ask, where the time goes (median seconds): "
            f"client start {b['client_start_s']:.2f} (interpreter, imports, connect, version check), "
            f"queue {b['queue_s']:.3f}, scope {b['scope_s']:.3f}, select {b['select_s']:.3f}, "
            f"generate {b['generate_s']:.2f}, client finish {b['client_finish_s']:.2f}. Generation is the same "
            f"work in both modes (cold median {answer['cold_generate_median_s']:.2f} s); everything else is what the "
            "daemon saves."]
    if answer["ratio_of_medians"] > answer["target_ratio"]:
        share = b["generate_s"] / answer["warm_median_s"] if answer["warm_median_s"] else 0.0
        out += ["", f"Target not met for asks that generate: generation is {share:.0%} of the warm ask on this CPU, "
                f"so no saving elsewhere can bring it to {answer['target_ratio']}x; without generation the warm "
                f"ask takes {answer['ratio_without_generate']:.3f}x the cold one."]
    return out + [""]


def startup_section(result: dict) -> list[str]:
    out = ["## Start-up of the command (bench/startup.py)", ""]
    out += provenance(result["run"])
    before = result.get("before_commit")
    out += [f"- load average (1 min) before/after: {result['load_1m_before']:.2f} / {result['load_1m_after']:.2f}; "
            f"the warm runs all went to their home's one daemon: {result['same_daemon_throughout']}",
            f"- bytecode: {result.get('bytecode', 'as found')}", "",
            f"Whole processes, each run {result['rounds']} times in a rotating order; median wall and CPU (user + "
            f"system of the process itself, not the daemon's) time, and each as a ratio to `{result['baseline']}` "
            "in the same run." + (f" Rows marked (before) run the code of commit `{before}` in the same rounds, "
                                  "against a daemon of their own." if before else ""), "",
            "| command | wall (ms) | wall ratio | CPU (ms) | CPU ratio | target (wall) |", "|---|---|---|---|---|---|"]
    for name, row in result["commands"].items():
        target = ""
        if row.get("target_ratio"):
            met = row.get("target_met")
            target = f"≤ {row['target_ratio']:g}x" + ("" if met is None else " met" if met else " not met")
        label = (f"`{row['argv']}`" + (" on a terminal" if row.get("output", "pipes") != "pipes" else "")
                 + (" (before)" if name.endswith("(before)") else ""))
        out.append(f"| {label} | {row['wall_median_s'] * 1000:.0f} | {row['wall_ratio']:.2f}x | "
                   f"{row['cpu_median_s'] * 1000:.0f} | {row['cpu_ratio']:.2f}x | {target} |")
    costs = {name: row["imports"] for name, row in result["commands"].items() if row.get("imports")}
    if costs:
        out += ["", "What each command's imports cost (one run under `python -X importtime`, so read the shares, "
                "not the exact times): the self time of its modules summed per top-level package, largest first "
                "(ms); then its modules with the most cumulative time (their own imports included).", "",
                "| command | imports in all (ms) | by package (ms) | costliest modules, cumulative (ms) |",
                "|---|---|---|---|"]
        for name, cost in costs.items():
            label = f"`{result['commands'][name]['argv']}`" + (" (before)" if name.endswith("(before)") else "")
            packages = ", ".join(f"{package} {us / 1000:.1f}" for package, us in list(cost["by_package_us"].items())[:8])
            modules = ", ".join(f"{m['module']} {m['cumulative_us'] / 1000:.1f}" for m in cost["top_cumulative"]
                                if m["depth"] <= 1)
            out.append(f"| {label} | {cost['total_us'] / 1000:.0f} ({cost['modules']} modules) | {packages} | "
                       f"{modules} |")
    out += ["", "`evsel --version` is answered before anything but the `evsel` package is imported; `docs list` and "
            "`ask` sent to a running daemon run without Typer (evsel_cli/commands/forward.py) and, writing to a pipe or a "
            "file, without rich (together about twice the interpreter's start-up), and print the bytes the Typer "
            "app prints, errors included (tests/test_startup_imports.py); any other argument, and every mistake, "
            "goes to the Typer app. On a terminal rich still renders the output (colours, the live progress rows, "
            "the table fitted to the terminal's width), which costs about the interpreter's start-up again. Of "
            "what is left, the settings, the daemon's client and the output module (dataclasses, inspect, typing, "
            "socket, json) cost about as much as the interpreter again; the ask's extra over `docs list` is "
            "mostly the client's check of --select before anything is sent, which loads the selector registry "
            "and its built-in selector modules, and a request that goes through the daemon's queue."]
    return out + [""]


def background_section(result: dict) -> list[str]:
    """bench/daemon.py --background: asks on a warm daemon, idle and during a background encode."""
    out = ["## Asks during a background encode (bench/daemon.py --background)", ""]
    out += provenance(result["run"])
    before = result.get("load_average_before")
    out += [f"- OMP_NUM_THREADS={result['omp_num_threads']} for every process; load average before: {before}",
            "- a warm daemon (model preloaded) with the sample story ingested; whole-process `evsel ask`, first "
            "idle, then while the daemon encodes a document's UNREAL states in the background; the encode's "
            "done/total read before and after each ask shows whether it was mid-way", "",
            "| ask | idle median (s) | during the encode median (s) | ratio | queued during the encode (s) | "
            "encode mid-way throughout |",
            "|---|---|---|---|---|---|"]
    names = {"answer": f"with an answer (max {result['max_new_tokens']} new tokens)",
             "evidence_only": "--evidence-only (BM25)"}
    for key, r in result["background"].items():
        queued = [run["queued_s"] for run in r["during_encode_runs"]]
        out.append(f"| {names.get(key, key)} | {r['idle_median_s']:.2f} | {r['during_encode_median_s']:.2f} | "
                   f"{r['ratio']:.2f} | {min(queued):.3f}-{max(queued):.3f} | {r['encode_mid_way_throughout']} |")
    out += ["", "Background encoding runs in slices of about 0.5 s and yields to a waiting request between them, "
            "so an ask that generates waits one slice at most; an ask that reads no model (evidence only, bm25 or "
            "random, no reranker) runs beside the encode. What is left of the ratio is the processes sharing the "
            "cores. Before the slices (16-chunk batches, ~11 s each on this CPU), asks took 6.5-12 s during an "
            "encode against 1.1-1.3 s idle."]
    return out + [""]


def first_hour_section(path: Path, result: dict) -> list[str]:
    """bench/first_hour.py: a document ingested through a fresh daemon, the default's asks beside
    BM25's from the first one on, while the background encode runs, and once it is done."""
    out = [f"## The first asks after ingest: {result['book']} (bench/first_hour.py, {path.name})", ""]
    out += provenance(result["run"])
    out += [f"- ingest returned in {result['ingest_s']} s; load average {result['load_1m_start']:.1f} at the start, "
            f"{result['load_1m_end']:.1f} at the end; each ask a whole `evsel ask --json` process through the "
            "daemon, the default's then BM25's of the same question; \"shown\": the five passages hold the "
            "question's evidence",
            f"- the default was `{result['rows'][0]['default']['method']}` on this kind at that commit; medians: "
            f"while encoding {result.get('encoding_median_ratio', '–')}x, warm {result.get('warm_median_ratio', '–')}x"
            + "".join(f", {m} warm {r}x" for m, r in (result.get("versus_median_ratio") or {}).items()), "",
            "| ask | default (s) | BM25 (s) | ratio | shown default / BM25 | the default ranked by | encode after |",
            "|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        ran = "+".join((row["default"].get("signals") or {}).get("ran") or [row["default"]["method"]])
        encode = row["encode_after"]
        where = f"{encode[2]} {encode[0]}/{encode[1]}" if encode else "done"
        out.append(f"| {row['when']} | {row['default']['wall_s']:.2f} | {row['bm25']['wall_s']:.2f} | {row['ratio']:.2f} "
                   f"| {int(row['default']['shown'])} / {int(row['bm25']['shown'])} | {ran} | {where} |")
    return out + [""]


def ingest_memory_section(result: dict) -> list[str]:
    """Peak RSS and cancel latency of a 51.5 MiB text ingest (bench/ingest.py --memory), per labelled run."""
    out = ["## Ingest memory and cancel latency (bench/ingest.py --memory)", ""]
    runs = result["runs"]
    latest = max(runs, key=lambda r: r["run"].get("when", ""))
    out += provenance(latest["run"])
    out += [f"- file: {latest['file_mib']} MiB of text (the nocha books concatenated, each copy numbered), "
            f"{latest['memory']['chunks']} chunks", "",
            "Peak RSS of `evsel --no-daemon ingest --no-encode --json BIG` as a whole process (`/usr/bin/time -v`, "
            "maximum resident set size), as a ratio to the file's size; cancel: SIGINT to a client ingesting BIG "
            "through a started daemon at a point of its progress, until the daemon's status (polled every 0.05 s "
            "over its socket) shows no running request.", "",
            "| run | peak RSS (MiB) | ratio to file | ingest (s, wall) | cancel latency (s), by point |", "|---|---|---|---|---|"]
    for r in runs:
        cancel = r.get("cancel")
        if isinstance(cancel, list):
            where = ", ".join(f"{c['point'] if isinstance(c['point'], str) else format(c['point'], '.0%') + ' stored'}: "
                              f"{c['latency_s']:.2f}" for c in cancel)
        elif cancel:
            where = f"{cancel.get('stage_when_signalled') or 'after ' + str(cancel['command'].split('after ')[-1])}: " \
                    f"{cancel['latency_s']:.2f}"
        else:
            where = "not run"
        m = r["memory"]
        out.append(f"| {r['label']} (`{r['run']['commit']}`) | {m['peak_rss_mib']:.0f} | **{m['ratio_to_file']:.2f}x** | "
                   f"{m['ingest_s']:.0f} | {where} |")
    out += ["", f"Target: peak RSS ≤ {latest['memory']['target_ratio']:g}x the file, a cancel ≤ 2 s at any point. "
            "Chunks and BM25 postings are written in batches inside one transaction (SQLite spills it to the WAL "
            "on disk), so what stays in memory is the parsed text, the document's BM25 vocabulary and one batch."]
    return out + [""]


def ingest_section(result: dict) -> list[str]:
    out = ["## Ingest through the daemon, chunk states in the background (bench/ingest.py)", ""]
    out += provenance(result["run"])
    runs = [r for r in result["runs"] if r["mode"] == "background"]
    out += [f"- book: `{Path(result['book']).name}` ({runs[0]['chunks']} chunks); OMP_NUM_THREADS="
            f"{result['omp_num_threads']}; each run in a fresh EVSEL_HOME with a started, preloaded daemon, after "
            "one untimed warm-up ingest; modes alternate", "",
            "Whole-process `evsel ingest BOOK` as a user runs it: `--no-encode` (parse, chunk, store) against the "
            "default (the same, then the UNREAL chunk states computed by the daemon in the background).", "",
            "| ingest | runs (s) | median (s) |", "|---|---|---|"]
    import statistics

    for label, key in (("`--no-encode` (baseline)", "no_encode_s"), ("default: states in the background", "background_s")):
        values = result[key]
        out.append(f"| {label} | {', '.join(f'{v:.2f}' for v in values)} | {statistics.median(values):.2f} |")
    if "inline_encode_s" in result:
        out.append(f"| `--no-daemon ingest --encode` (states before it returns) | {result['inline_encode_s']:.2f} | "
                   f"{result['inline_encode_s']:.2f} |")
    out += ["", f"Default / `--no-encode`: **{result['ratio_background_to_no_encode']:.2f}x** (target ≤ "
            f"{result['target_ratio']:g}x). The background encode then took "
            f"{', '.join(str(r['background_encode_s']) for r in runs)} s, shown in `evsel daemon status` "
            f"({all(r['background_seen_in_status'] for r in runs)}); `evsel ask --select unreal` afterwards took "
            f"{', '.join(str(r['ask_unreal_s']) for r in runs)} s (whole process, warm daemon) and cited evidence "
            f"about the band: {all(r['ask_unreal_mentions_band'] for r in runs)}."]
    return out + [""]


def pdf_readers_section(evals: dict[str, tuple[Path, dict]], ingest: dict | None) -> list[str]:
    """The PDF readers side by side: `evsel eval` of the PDF sets with EVSEL_PDF_READER=plain (the
    page-text reader) and =tables, run one after the other, and the filings' ingest time."""
    runs = {n: r for n, (_, r) in evals.items() if "-pdf-" in n and not n.endswith("-generate")}
    answered = {n: r for n, (_, r) in evals.items() if "-pdf-" in n and n.endswith("-generate")}
    if not runs:
        return []
    out = ["## PDF readers: tables, reading order, running lines (`EVSEL_PDF_READER`)", "",
           "Each row is one `evsel eval` of its own section above (same chunker, same questions); `plain` is the "
           "reader before tables (each page's text as pymupdf extracts it); `tables` (the default) and `finder` "
           "read tables as rows with their headers, in reading order without running lines, tables found from "
           "the words alone or located by pymupdf's table finder.", "",
           "| set | method | reader | R@1 | R@3 | R@5 | R@10 | MRR | chunks | questions (with gold) | command |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in sorted(runs, key=lambda n: (n.split("-pdf-")[0], n.endswith("dense"), n.split("-pdf-")[1])):
        r = runs[name]
        data = r["dataset"]
        reader = name.split("-pdf-")[1].removesuffix("-dense")
        for spec, m in r["methods"].items():
            out.append(f"| {data['name']} | `{spec}` | {reader} | {f3(m.get('recall@1'))} | {f3(m.get('recall@3'))} | "
                       f"**{f3(m.get('recall@5'))}** | {f3(m.get('recall@10'))} | {f3(m.get('mrr'))} | "
                       f"{data['chunks']} | {data['questions']} ({data['questions_with_gold']}) | "
                       f"`{r['run']['command']}` |")
    if answered:
        out += ["", "Answers (`--generate`, the default answer step on BM25's top 5), per reader, one run each: token "
                "F1, the reference contained in the answer, and for the questions whose reference is a figure "
                "printed in the filing, a numeric match ((1,577) = $1577.00).", "",
                "| set | reader | R@5 | F1 | contained | numeric (figure questions) | command |", "|---|---|---|---|---|---|---|"]
        for name in sorted(answered):
            r = answered[name]
            reader = name.split("-pdf-")[1].removesuffix("-generate")
            for spec, m in r["methods"].items():
                out.append(f"| {r['dataset']['name']} | {reader} | {f3(m.get('recall@5'))} | {f3(m.get('f1'))} | "
                           f"{f3(m.get('contained'))} | {f3(m.get('numeric'))} | `{r['run']['command']}` |")
    if ingest:
        med = ingest["median_seconds"]
        readers = [r for r in ("finder", "tables") if r in med]
        out += ["", f"Ingest of the {ingest['files']} FinanceBench filings, whole process `evsel --no-daemon ingest "
                f"--no-encode pdfs/` in a fresh home (`{ingest['run']['command']}`, commit "
                f"`{ingest['run'].get('commit')}`): plain {med['plain']:.1f} s, "
                + ", ".join(f"{r} {med[r]:.1f} s (**{med[r] / med['plain']:.2f}x**; "
                            f"{ingest['runs'][r][0]['tables']} tables, {ingest['runs'][r][0]['dropped_lines']} running "
                            f"lines left out, {ingest['runs'][r][0]['chunks']} chunks)" for r in readers)
                + f"; plain stored {ingest['runs']['plain'][0]['chunks']} chunks."]
    return out + [""]


def generate_section(result: dict) -> list[str]:
    out = ["## Generation backends: transformers vs llama-cpp-python (bench/generate.py)", ""]
    out += provenance(result["run"])
    out += [f"- llama-cpp-python {result.get('llama_cpp_python')}, {result['threads']} thread(s) for both backends; "
            f"load average before/after: {result.get('load_average_before', float('nan')):.1f} / "
            f"{result.get('load_average_after', float('nan')):.1f}", ""]
    speed = result.get("speed")
    if speed:
        tps, a = speed["tokens_per_s"], speed["answer_step"]
        med, up = a["median_s"], a["speedup_vs_transformers"]
        out += [f"Default model, in one process, variants alternating. Prefill: a {speed['prefill_prompt_tokens']}-token "
                f"prompt; decode: {speed['decode_tokens']} tokens after it, no stop token.", "",
                "| backend | prefill tokens/s | decode tokens/s |", "|---|---|---|",
                f"| transformers (bf16 dense copy) | {tps['transformers']['prefill']:.0f} | "
                f"{tps['transformers']['decode']:.1f} |",
                f"| llama-cpp-python (GGUF, quantized) | {tps['llama_cpp']['prefill']:.0f} | "
                f"{tps['llama_cpp']['decode']:.1f} |", "",
                f"The answer step as `evsel ask` runs it (`Backbone.generate`), {len(a['prompt_tokens'])} questions "
                f"x {len(a['runs_s']['transformers']) // max(1, len(a['prompt_tokens']))} repetitions, prompts of "
                f"{min(a['prompt_tokens'])}-{max(a['prompt_tokens'])} tokens, answers of at most "
                f"{a['max_new_tokens']} tokens:", "",
                "| answer step | median (s) | speed-up vs transformers |", "|---|---|---|"]
        labels = {"transformers": "transformers, 5 passages", "transformers_static": "transformers, static KV cache",
                  "llama_cpp": "llama-cpp-python, 5 passages", "transformers_3": "transformers, 3 passages",
                  "llama_cpp_3": "llama-cpp-python, 3 passages"}
        for key, label in labels.items():
            if key in med:
                out.append(f"| {label} | {med[key]:.2f} | {up[key]:.2f}x |")
        out += ["", f"Same answer text from both backends: {sum(a['same_text'])} of {len(a['same_text'])} prompts; "
                f"transformers' static cache vs its dynamic one: {sum(a['static_same_text'])} of "
                f"{len(a['static_same_text'])} (greedy answers of 15-32 tokens part at near-ties of the logits even "
                "between two transformers runs of different kernels; tests/test_generate_backends.py checks a short "
                "answer, where both backends agree).", ""]
    ground = result.get("grounded")
    if ground:
        run = result.get("grounded_run")
        out += ["The answer step evsel runs by default (`--style short`, grounded) vs free-form generation from the "
                "same 5 passages (`--style sentence`, the old default), transformers, in one process"
                + (f" (`{run['command']}`, commit `{run['commit']}`)" if run else "") + ":", "",
                "| evidence | questions | free-form (s, median) | grounded short (s, median) | speed-up | answer kinds |",
                "|---|---|---|---|---|---|"]
        for name, g in ground.items():
            kinds = ", ".join(f"{k} {g['kinds'].count(k)}" for k in sorted(set(g["kinds"])))
            out.append(f"| {name} | {g['questions']} | {g['median_s']['sentence']:.2f} | {g['median_s']['short']:.3f} | "
                       f"{g['speedup']:.0f}x | {kinds} |")
        out.append("")
    rows = result.get("models") or []
    if rows:
        out += ["Per model and backend, each in its own process: load (the dense copy already made), peak RSS, "
                "the answer step (median).", "",
                "| model | GGUF (MiB) | one-time dense copy (s) | backend | load (s) | peak RSS (MiB) | answer step (s) |",
                "|---|---|---|---|---|---|---|"]
        for row in rows:
            for backend, r in row["backends"].items():
                copy = f"{row['dense_copy_s']:.1f}" if backend == "transformers" and row.get("dense_copy_s") else "–"
                size = f"{row['gguf_mib']:.0f}" if row.get("gguf_mib") else "–"
                rss = "–" if r.get("peak_rss_mib") is None else f"{r['peak_rss_mib']:.0f}"
                out.append(f"| {row['model']} | {size} | {copy} | {backend} | {r['load_s']:.2f} | {rss} | "
                           f"{r['answer_median_s']:.2f} |")
        out.append("")
        out += [f"- {row['model']}: {row['peak_rss_note']}" for row in rows if row.get("peak_rss_note")]
        out += [f"- {row['model']}: same answer text from both backends on {sum(row['same_text'])} of "
                f"{len(row['same_text'])} prompts" for row in rows]
        out.append("")
    return out


def qrranker_section(result: dict) -> list[str]:
    """bench/qrranker.py: one 50-candidate rerank's latency, BM25 alone in the same run."""
    lat = result["latency"]
    run = result.get("latency_run") or result
    out = ["## QRRanker rerank latency (`python bench/qrranker.py`)", ""]
    out += provenance(run["run"]) + [""]
    out += [f"One 50-candidate rerank of the sample story ({lat['candidate_tokens']} candidate tokens), warm model, "
            f"{run.get('threads', result.get('threads'))} torch thread(s); medians. Cold: every candidate encoded; "
            "warm KV: the candidates' block KV cached by an earlier question.", "",
            "| configuration | depth | cold s | warm KV s | cold / BM25 alone |", "|---|---|---|---|---|"]
    bm25 = lat["bm25_s"]["median"]
    out.append(f"| BM25 alone (first stage) | | {bm25:.4f} | | 1 |")
    for name, row in lat.items():
        if not isinstance(row, dict) or "cold_s" not in row:
            continue
        warm = row.get("warm_kv_s", {}).get("median")
        out.append(f"| {name} | {row['depth']} | {row['cold_s']['median']:.2f} | "
                   f"{f3(warm) if warm is not None else ''} | {row['cold_s']['median'] / bm25:.0f}x |")
    for encoding in ("block", "causal"):
        pair = lat.get(f"{encoding}-truncated_over_full")
        if pair:
            out.append(f"\n{encoding}: truncated / full depth {pair['median_of_paired']:.2f} (median of paired ratios)")
    out.append("")
    return out


def qrranker_kv_section(result: dict) -> list[str]:
    """bench/qrranker.py --only ingest-kv: a book's first --rerank qrranker ask reading the block KV
    computed at ingest, against BM25 and against no files, in the same run; the files' disk cost."""
    kv = result["kv"]
    out = ["## QRRanker block KV at ingest (`python bench/qrranker.py --only ingest-kv`)", ""]
    out += provenance(result["run"]) + [""]
    scope = (f"the {result['kv_chunks']} chunks of the questions' BM25 top 50s ({result['kv_chunk_tokens']} tokens)"
             if "kv_chunks" in result else f"{result['background_chunks']} chunks")
    if "bits" in kv:  # the quantized format: what a file holds, against the exact bf16 layout
        held = (f"keys the QR heads read in {kv['bits'][0]} bits, the other keys of layers 0-{kv['depth'] - 2} and "
                f"their values in {kv['bits'][1]} and {kv['bits'][2]} bits, the adapter's rank-8 projections; "
                f"{kv['payload_bytes_per_block_token_at_140']:.0f} B per token of a 140-token block, against "
                f"{kv['exact_bytes_per_block_token']} B for exact bf16 K/V and k_proj inputs: "
                f"{kv['exact_bytes_per_block_token'] / result['disk_bytes_per_token']:.1f}x smaller")
    else:
        held = (f"K and V of layers 0-{kv['depth'] - 1} and the k_proj inputs of the adapter's "
                f"{len(kv['captured_layers'])} layers, {kv['bytes_per_block_token']} B per block token")
    out += [f"{result['book']} ({result['book_bytes'] / 2**10:.0f} KiB, {result['book_tokens']} tokens, "
            f"{result['chunks']} chunks), {result['threads']} torch thread(s), 1-minute load "
            f"{result['load_before']:.1f} before and {result['load_after']:.1f} after on {result['cpus']} cores. Background work "
            f"(EVSEL_QRRANKER_KV, as the daemon runs it in 0.5 s slices) over {scope}: {result['background_chunks']} "
            f"chunks in {result['background_s']:.0f} s; {result['files']} files, {result['disk_bytes'] / 2**20:.1f} MiB: "
            f"**{result['disk_bytes_per_token'] / 1024:.2f} KiB per token** ({held}).",
            "", "Each question asked `--evidence-only` by a fresh engine (cold in-memory caches, the model loaded "
            "and its load time left out); medians over the questions:", "",
            "| ask | evidence s | / BM25 |", "|---|---|---|"]
    bm25 = result["bm25_evidence_s"]
    for name, label in (("bm25", "BM25 alone"), ("qrranker_files", "--rerank qrranker, KV from ingest's files"),
                        ("qrranker_no_files", "--rerank qrranker, no files (every candidate encoded)")):
        value = result[f"{name}_evidence_s"]
        out.append(f"| {label} | {value:.3f} | {value / bm25:.1f}x |")
    same = sum(r["same_evidence"] for r in result["asks"])
    out += ["", f"With files / without: {result['files_over_no_files']:.2f} (median of paired ratios); target "
            f"{result['target_s']:.0f} s of evidence time: {'met' if result['qrranker_files_evidence_s'] <= result['target_s'] else 'missed'}. "
            f"Same top-5 evidence with and without files for {same} of {len(result['asks'])} questions (a block "
            "encoded in ingest's batches differs from one encoded in the rerank's by bf16 rounding"
            + (", and stored blocks are quantized)." if "bits" in kv else ")."), ""]
    if "bits" in kv:
        out += ["Before, the exact bf16 files (commit `46015d21d93d`, 2026-12-02, Intel Xeon, the whole book, load "
                "~9; another run, so a reference, not a same-run ratio): 28.8 KiB per token (3.79 GiB for the book); "
                "first rerank 3.955 s with the files, 11.725 s without, BM25 0.028 s. Per the profile of one "
                "50-candidate rerank from files (the sample story, same machine), reading and decoding the 50 "
                "files is 0.8 s of 4.6 s; the rest is the query pass over the 6.4K-token context (the backbone's "
                "attention 1.4 s, and transformers copying the grouped KV heads for it 0.8 s), so the 2 s target "
                "now depends on that pass, not on the files.", ""]
    return out


def faults_section(result: dict) -> list[str]:
    load, bad, proto = result["load"], result["bad_inputs"], result["protocol"]
    more = [c for cases in (result.get("surfaces") or {}).values() for c in cases if "skipped" not in c]
    out = ["## Faults and hostile input (`bench/faults.py`)", ""]
    out += provenance(result.get("run", {}))
    out += ["",
            f"- load held: {load['requests']} requests from {result['clients']} concurrent clients while an ingest "
            f"ran, p50 {load['p50_s']} s / p95 {load['p95_s']} s, {load['errors']} unexpected errors",
            f"- faults survived: {result['faults_survived']} of {len(result['faults'])} kill -9 mid-ingest "
            "(integrity_check ok, nothing stored before lost, no half-stored document)",
            f"- bad inputs tried: {bad['tried'] + len(more)} ({bad['tried']} files: {bad['failed_alone']} failed alone "
            f"with one line, {bad['good_ingested']} good file ingested beside them, {bad['unexpected']} unexpected "
            f"errors" + (f"; {len(more)} damaged trained parts, eval and train inputs and corpus files: "
                         f"{sum(c['ok'] for c in more)} one clear line, {sum(c['unexpected'] for c in more)} "
                         "unexpected" if more else "") + ")",
            f"- malformed protocol messages: {proto['answered_or_closed']} of {proto['tried']} refused; daemon up "
            f"after: {'yes' if proto['daemon_up_after'] else 'NO'}",
            f"- rows lost: **{result['rows_lost']}** (integrity_check: {result['integrity']}, "
            f"{result['documents']} documents at the end)", ""]
    if result.get("hostile"):  # runs from before the hostile cases have none
        out += [f"Hostile inputs and loads: {result['hostile_ok']} of {result['hostile_tried']} handled as a user "
                "should see them.", "", "| input or load | handled | what happened |", "|---|---|---|"]
        for case in result["hostile"]:
            handled = "skipped: " + case["skipped"] if "skipped" in case else ("yes" if case["ok"] else "**no**")
            out.append(f"| {case['input']} | {handled} | {case.get('detail', '')} |")
        out.append("")
    return out + surfaces_rows(result.get("surfaces") or {})


def surfaces_rows(surfaces: dict) -> list[str]:
    """The surfaces built after the store: one line a group, and a row for each case not handled."""
    if not surfaces:  # runs from before these cases have none
        return []
    out = ["Trained parts, eval and train inputs and the corpus (each case: one line naming the file, never "
           "\"unexpected\"):", ""]
    for group, cases in surfaces.items():
        tried = [c for c in cases if "skipped" not in c]
        skipped = [c for c in cases if "skipped" in c]
        out.append(f"- {group}: {sum(c['ok'] for c in tried)} of {len(tried)} handled, "
                   f"{sum(c['unexpected'] for c in tried)} unexpected"
                   + "".join(f"; skipped: {c['input']} ({c['skipped']})" for c in skipped))
    failed = [c for cases in surfaces.values() for c in cases if "skipped" not in c and not c["ok"]]
    if failed:
        out += ["", "| case not handled | what happened |", "|---|---|"]
        out += [f"| {c['input']} | {c['detail']} |" for c in failed]
    return out + [""]


def headline(evals: dict[str, dict], throughput: dict | None) -> list[str]:
    out = ["## Headline", ""]
    for name in ("locomo", "locomo-unreal", "fairytaleqa", "fairytaleqa-unreal"):
        r = evals.get(name)
        if not r:
            continue
        m = r["methods"]
        parts = [f"{spec} {m[spec]['recall@5']:.3f}" for spec in ("bm25", "dense", "random", "intrinsic", "unreal",
                                                                   "rrf:unreal") if spec in m
                 and m[spec].get("recall@5") is not None]
        counted = max(x.get("with_gold", 0) for x in m.values())
        out.append(f"- {name}: recall@5 " + ", ".join(parts) + f" ({counted} questions"
                   + (f"; {', '.join(r['dataset']['separate_groups'])} apart" if r["dataset"]["separate_groups"] else "")
                   + ")")
    for name in ("locomo-answers", "fairytaleqa-answers"):
        r = evals.get(name)
        if not r:
            continue
        m = r["methods"]
        metric = "locomo_f1" if any("locomo_f1" in x for x in m.values()) else "f1"
        parts = [f"{spec} {m[spec][metric]:.3f}" for spec in m if m[spec].get(metric) is not None]
        line = (f"- {name}: answer {'LoCoMo ' if metric == 'locomo_f1' else ''}F1 ({r['config'].get('answer_style', 'sentence')}"
                f" answers) with evidence from " + ", ".join(parts))
        recall = [f"{spec} {m[spec]['recall@5']:.3f}" for spec in m if m[spec].get("recall@5") is not None]
        if recall:
            line += "; recall@5 " + ", ".join(recall)
        abst = (m.get("bm25") or {}).get("abstention") or {}
        if abst.get("precision") is not None:
            line += f"; abstention on adversarial: precision {abst['precision']:.3f}, recall {abst['recall']:.3f}"
        out.append(line + f" ({r['dataset']['questions']} questions)")
    for name in ("fairytaleqa-qrranker", "locomo-qrranker", "fairytaleqa-memory", "locomo-memory"):
        r = evals.get(name)
        if not r:
            continue
        m = r["methods"]
        base = (m.get("bm25") or {}).get("recall@3")
        parts = []
        for spec, row in m.items():
            if row.get("recall@3") is None:
                continue
            delta = f" ({(row['recall@3'] - base) * 100:+.1f} pts)" if base is not None and spec != "bm25" else ""
            parts.append(f"{spec} {row['recall@3']:.3f}{delta}")
        out.append(f"- {name}: recall@3 " + ", ".join(parts) + f" ({r['dataset']['questions']} questions)")
    if throughput:
        for layer, row in throughput["encoding"]["layers"].items():
            out.append(f"- chunk encoding to layer {layer}: {row['tokens_per_s_median']:,.0f} tokens/s = "
                       f"{row['share_of_bf16_roofline']:.1%} of the bf16 matmul roofline "
                       f"({row['share_of_fp32_roofline']:.1%} of fp32)")
    out.append("")
    return out


def main() -> int:
    evals: dict[str, tuple[Path, dict]] = {}
    for path in sorted(RESULTS.glob("eval-*.json")):
        result = json.loads(path.read_text())
        evals[path.stem[len("eval-"):]] = (path, result)  # e.g. locomo, locomo-generate
    order = [n for n in ORDER if n in evals] + sorted(n for n in evals if n not in ORDER)
    scaling = json.loads((RESULTS / "scaling.json").read_text()) if (RESULTS / "scaling.json").exists() else None
    throughput = json.loads((RESULTS / "throughput.json").read_text()) if (RESULTS / "throughput.json").exists() else None
    daemon = json.loads((RESULTS / "daemon.json").read_text()) if (RESULTS / "daemon.json").exists() else None
    ingest = json.loads((RESULTS / "ingest.json").read_text()) if (RESULTS / "ingest.json").exists() else None
    unreal_speed = json.loads((RESULTS / "unreal.json").read_text()) if (RESULTS / "unreal.json").exists() else None
    # the BM25 store benchmark: from its own run (--only bm25-store) or a full throughput run, the newer
    bm25_runs = [r for r in (json.loads((RESULTS / "bm25.json").read_text()) if (RESULTS / "bm25.json").exists() else None,
                             throughput) if r and r.get("bm25_store")]
    bm25_store = max(bm25_runs, key=lambda r: r["run"].get("when", "")) if bm25_runs else None
    lines = ["# Results", "",
             "Generated by `python bench/make_results.py` from the latest runs in `bench/results/`; do not edit "
             "by hand. How to rerun each benchmark and what the numbers mean: `bench/README.md`.", "",
             "Metrics: **R@k** (recall@k) is the share of a question's gold evidence items (a dialogue turn, a "
             "section, a sentence, a page, an evidence passage) with at least one of their chunks among the top k "
             "(for LoCoMo turns and HotpotQA sentences an item is one chunk, so this is recall per gold chunk); "
             "**all@k** counts a question only when every gold item is in the top k; **MRR** is 1 / rank of the "
             "first gold chunk. The JSON also has chunk_recall@k (share of all gold chunks). Every method ranks the "
             "same chunks, made by evsel's own parsers and chunker (~140 SmolLM2 tokens). Latencies are per "
             "question, median / p95; index time (dense embeddings) is paid once per document.", ""]
    lines += headline({n: evals[n][1] for n in evals}, throughput)
    lines += ["## Evidence selection (`evsel eval`)", ""]
    for name in order:
        lines += eval_section(*evals[name])
    if scaling:
        lines += scaling_section(scaling, throughput)
    if (RESULTS / "scaling-1m.json").exists():
        lines += scaling_section(json.loads((RESULTS / "scaling-1m.json").read_text()), throughput,
                                 "Long-context scaling to 1M tokens: the BlockSearch router against BM25 and dense "
                                 "(bench/scaling.py)", "scaling-1m.png", SCALING_1M_NOTE)
    if (RESULTS / "scaling-blocksearch.json").exists():
        lines += scaling_section(json.loads((RESULTS / "scaling-blocksearch.json").read_text()), throughput,
                                 "Long-context scaling: BlockSearch (bench/scaling.py)", "scaling-blocksearch.png")
    if (RESULTS / "blocksearch.json").exists():
        lines += blocksearch_section(json.loads((RESULTS / "blocksearch.json").read_text()))
    if throughput:
        lines += throughput_section(throughput)
    for path in sorted(RESULTS.glob("encode_variants*.json"), key=lambda p: (p.name != "encode_variants.json", p.name)):  # the latest run, then earlier machines' (-<cpu>)
        lines += encode_variants_section(json.loads(path.read_text()))
    if bm25_store:
        lines += bm25_store_section(bm25_store)
    if unreal_speed:
        lines += unreal_section(unreal_speed)
    if daemon:
        lines += daemon_section(daemon)
    if (RESULTS / "startup.json").exists():
        lines += startup_section(json.loads((RESULTS / "startup.json").read_text()))
    if (RESULTS / "daemon-background.json").exists():
        lines += background_section(json.loads((RESULTS / "daemon-background.json").read_text()))
    for path in sorted(RESULTS.glob("first-hour*.json")):
        lines += first_hour_section(path, json.loads(path.read_text()))
    if ingest:
        lines += ingest_section(ingest)
    pdf_ingest = RESULTS / "pdf-reader-ingest.json"
    lines += pdf_readers_section(evals, json.loads(pdf_ingest.read_text()) if pdf_ingest.exists() else None)
    if (RESULTS / "ingest-memory.json").exists():
        lines += ingest_memory_section(json.loads((RESULTS / "ingest-memory.json").read_text()))
    if (RESULTS / "generate.json").exists():
        lines += generate_section(json.loads((RESULTS / "generate.json").read_text()))
    if (RESULTS / "qrranker.json").exists():
        lines += qrranker_section(json.loads((RESULTS / "qrranker.json").read_text()))
    if (RESULTS / "qrranker-kv.json").exists():
        lines += qrranker_kv_section(json.loads((RESULTS / "qrranker-kv.json").read_text()))
    if (RESULTS / "faults.json").exists():
        lines += faults_section(json.loads((RESULTS / "faults.json").read_text()))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines).rstrip() + "\n")
    print(f"wrote {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
