"""Generation backends, in one run: transformers (dense bf16 copy) vs llama-cpp-python (the GGUF
file, quantized), for evsel-shaped prompts.

    python bench/generate.py                          # SmolLM2, plus every other model given
    python bench/generate.py --model ~/models/gemma-3-270m-q4_k_m.gguf --out bench/results/generate.json

Part 1, in this process, on the default model: prefill and decode tokens/s of each backend (a
~1K-token prompt, 32 tokens decoded without stopping), and the whole answer step as `evsel ask`
runs it (`Backbone.generate`: chat template, tokenizing, generation, decoding) for prompts of 5
passages of ~140 tokens from the bundled sample and a 32-token answer; also transformers with a
static KV cache and with 3 passages instead of 5. Variants alternate within each repetition, so
they see the same machine load; ratios are against transformers' median in this run.

Part 2, one subprocess per (model, backend), so memory and load time are each its own: load time
(with the dense copy already made, and the one-time dense copy itself), peak RSS, the answer step.

Threads: --threads (default 1 for both backends, as bench/run_all.sh runs everything: the cores
are shared with other jobs). Needs llama_cpp importable (pip install '.[llama]').
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
QUESTIONS = [
    "Who killed Ambrose Tenterden?",
    "Where was the body found?",
    "What did the keeper see from the lamp room?",
    "Who arrived on the supply boat?",
    "What was missing from the study?",
]


def evidence_prompts(backbone, n_passages: int, questions: list[str]) -> list[list[dict]]:
    """Chat messages as `evsel ask` builds them: `n_passages` chunks (~140 tokens, evsel's own
    chunker on the bundled sample), a different window of the story for each question."""
    from evsel.answer.step import build_messages
    from evsel.ingest.chunker import chunk_document
    from evsel.ingest.parsers.text import parse_book
    from evsel.paths import sample_story_path

    path = sample_story_path()
    doc = parse_book(path, path.read_text())
    chunks = chunk_document(doc, backbone)
    out = []
    for i, question in enumerate(questions):
        window = chunks[(i * 7) % (len(chunks) - n_passages):][:n_passages]
        scored = [SimpleNamespace(chunk=SimpleNamespace(text=c.text, title=doc.title, page_start=None, page_end=None,
                                                        session=None, time_start=None)) for c in window]
        out.append(build_messages(question, scored))
    return out


def long_prompt(backbone, tokens: int) -> list[int]:
    from evsel.paths import sample_story_path

    ids = backbone.tokenizer(sample_story_path().read_text(), add_special_tokens=False)["input_ids"]
    return ids[:tokens]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


# part 1: speed, in process
def hf_prefill_decode(backbone, prompt: list[int], n_decode: int) -> tuple[float, float]:
    """transformers: one forward pass over the prompt, then n_decode single-token steps on the KV
    cache (greedy), as generate runs them but without its per-step bookkeeping."""
    import torch
    from transformers import DynamicCache

    model = backbone.model
    ids = torch.tensor([prompt], device=backbone.plan.device)
    with torch.inference_mode():
        started = time.perf_counter()
        cache = DynamicCache(config=model.config)
        out = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        prefill = time.perf_counter() - started
        token = out.logits[:, -1:].argmax(-1)
        started = time.perf_counter()
        for _ in range(n_decode):
            out = model(input_ids=token, cache=cache, use_cache=True)
            token = out.logits[:, -1:].argmax(-1)
        decode = time.perf_counter() - started
    return prefill, decode


def hf_generate(backbone, messages, max_new: int, **extra) -> tuple[float, dict]:
    """The answer step on transformers with generate() options (e.g. a static cache)."""
    import torch

    started = time.perf_counter()
    ids = backbone.chat_ids(messages).to(backbone.plan.device)
    with torch.inference_mode():
        out = backbone.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                                      do_sample=False, repetition_penalty=1.1,
                                      pad_token_id=backbone.tokenizer.eos_token_id, **extra)
    new = out[0, ids.shape[1]:].tolist()
    text = backbone.tokenizer.decode(new, skip_special_tokens=True).strip()
    return time.perf_counter() - started, {"text": text, "generated_tokens": len(new)}


def timed_answer(backbone, messages, max_new: int) -> tuple[float, dict]:
    started = time.perf_counter()
    out = backbone.generate(messages, max_new)
    return time.perf_counter() - started, out


def speed(args) -> dict:
    from evsel.models.runtime.backbone import Backbone

    hf = Backbone(generator="transformers", threads=args.threads)
    ll = Backbone(generator="llama-cpp", threads=args.threads)
    _ = hf.model
    ll.llama.load()
    prompt = long_prompt(hf, args.prefill_tokens)
    five = evidence_prompts(hf, 5, QUESTIONS[: args.questions])
    three = evidence_prompts(hf, 3, QUESTIONS[: args.questions])
    prompt_tokens = [int(hf.chat_ids(m).shape[1]) for m in five]
    # warm-up: first calls pay for allocations and one-time kernel setup
    hf_prefill_decode(hf, prompt[:64], 2)
    ll.llama.generate(prompt[:64], 2, 1.1, set())
    timed_answer(hf, five[0], 4)
    timed_answer(ll, five[0], 4)
    hf_generate(hf, five[0], 4, cache_implementation="static")

    raw = {k: [] for k in ("hf_prefill", "hf_decode", "ll_prefill", "ll_decode")}
    answer = {k: [] for k in ("transformers", "transformers_static", "llama_cpp", "transformers_3", "llama_cpp_3")}
    texts = {"transformers": [], "llama_cpp": [], "transformers_static": []}
    tokens = {"transformers": [], "llama_cpp": []}
    for rep in range(args.repeats):
        p, d = hf_prefill_decode(hf, prompt, args.decode_tokens)
        raw["hf_prefill"].append(p)
        raw["hf_decode"].append(d)
        _, t = ll.llama.generate(prompt, args.decode_tokens, 1.1, set())  # no stop token: all of them
        raw["ll_prefill"].append(t["prefill_s"])
        raw["ll_decode"].append(t["decode_s"])
        for i, messages in enumerate(five):
            s, out = timed_answer(hf, messages, args.answer_tokens)
            answer["transformers"].append(s)
            s2, out2 = timed_answer(ll, messages, args.answer_tokens)
            answer["llama_cpp"].append(s2)
            s3, out3 = hf_generate(hf, messages, args.answer_tokens, cache_implementation="static")
            answer["transformers_static"].append(s3)
            answer["transformers_3"].append(timed_answer(hf, three[i], args.answer_tokens)[0])
            answer["llama_cpp_3"].append(timed_answer(ll, three[i], args.answer_tokens)[0])
            if rep == 0:
                texts["transformers"].append(out["text"])
                texts["llama_cpp"].append(out2["text"])
                texts["transformers_static"].append(out3["text"])
                tokens["transformers"].append(out["generated_tokens"])
                tokens["llama_cpp"].append(out2["generated_tokens"])
        print(f"rep {rep + 1}/{args.repeats}: answer step transformers {median(answer['transformers']):.2f}s, "
              f"llama.cpp {median(answer['llama_cpp']):.2f}s", file=sys.stderr)
    n = len(prompt)
    result = {
        "prefill_prompt_tokens": n,
        "decode_tokens": args.decode_tokens,
        "tokens_per_s": {
            "transformers": {"prefill": n / median(raw["hf_prefill"]),
                             "decode": args.decode_tokens / median(raw["hf_decode"])},
            "llama_cpp": {"prefill": n / median(raw["ll_prefill"]),
                          "decode": args.decode_tokens / median(raw["ll_decode"])},
        },
        "raw_s": raw,
        "answer_step": {
            "passages": 5,
            "prompt_tokens": prompt_tokens,
            "max_new_tokens": args.answer_tokens,
            "median_s": {k: median(v) for k, v in answer.items()},
            "runs_s": answer,
            "generated_tokens": tokens,
            "texts": texts,
            "same_text": [a == b for a, b in zip(texts["transformers"], texts["llama_cpp"])],
            "static_same_text": [a == b for a, b in zip(texts["transformers"], texts["transformers_static"])],
        },
    }
    base = result["answer_step"]["median_s"]["transformers"]
    result["answer_step"]["speedup_vs_transformers"] = {k: base / v for k, v in result["answer_step"]["median_s"].items()}
    tps = result["tokens_per_s"]
    result["ratios"] = {"prefill_llama_over_transformers": tps["llama_cpp"]["prefill"] / tps["transformers"]["prefill"],
                        "decode_llama_over_transformers": tps["llama_cpp"]["decode"] / tps["transformers"]["decode"]}
    return result


# part 3: the answer step evsel runs by default (grounded short answers) vs free-form generation
DIALOGUE_QUESTIONS = [
    "What did Melanie sign up for?",
    "Where did Caroline move from?",
    "What does Melanie do to destress?",
    "When did Caroline go to the LGBTQ support group?",
    "What kind of art does Caroline make?",
]


def _records(doc, backbone, start: int, n: int) -> list:
    from evsel.ingest.chunker import chunk_document
    from evsel.models.selectors import Scored
    from evsel.store.store import ChunkRecord

    chunks = list(chunk_document(doc, backbone))[start:start + n]
    return [Scored(ChunkRecord(id=i + 1, doc_id=1, title=doc.title, kind=doc.kind, path="", **c.record()), 1.0, i + 1)
            for i, c in enumerate(chunks)]


def grounded(args) -> dict:
    """Whole answer step (`evsel.pipeline.answer`) on the same 5-passage evidence, in one process,
    variants alternating: free-form (--style sentence, the old default) vs grounded short answers,
    on the bundled story (prose) and on a LoCoMo conversation (dialogue, when ../shared is there)."""
    from evsel.models.runtime.backbone import Backbone
    from evsel.ingest.parsers import parse_file
    from evsel.paths import sample_story_path
    from evsel.pipeline import answer

    hf = Backbone(generator="transformers", threads=args.threads)
    _ = hf.model
    story = parse_file(sample_story_path())[0]
    sets = {"prose": [(q, _records(story, hf, (i * 7) % 100, 5)) for i, q in enumerate(QUESTIONS[: args.questions])]}
    locomo = ROOT.parent / "shared" / "data" / "locomo" / "locomo10.json"
    if locomo.is_file():
        conv = parse_file(locomo)[0]
        sets["dialogue"] = [(q, _records(conv, hf, 20 + i * 9, 5)) for i, q in enumerate(DIALOGUE_QUESTIONS[: args.questions])]
    answer(hf, QUESTIONS[0], sets["prose"][0][1], 4, "sentence")  # warm-up
    out = {}
    for name, items in sets.items():
        runs = {"sentence": [], "short": []}
        kinds = []
        for _ in range(args.repeats):
            for question, evidence in items:
                for style in ("sentence", "short"):
                    got = answer(hf, question, evidence, args.answer_tokens, style)
                    runs[style].append(got["generate_s"])
                    if style == "short" and len(kinds) < len(items):
                        kinds.append(got["kind"])
        med = {k: median(v) for k, v in runs.items()}
        out[name] = {"median_s": med, "runs_s": runs, "speedup": med["sentence"] / med["short"], "kinds": kinds,
                     "questions": len(items)}
        print(f"{name}: free-form {med['sentence']:.2f}s, grounded {med['short']:.3f}s", file=sys.stderr)
    return out


# part 2: per model and backend, each in its own process
def child(args) -> int:
    """One (model, backend): load, answer the evsel-shaped prompts, print JSON."""
    from evsel.models.runtime.backbone import Backbone

    started = time.perf_counter()
    bb = Backbone(args.model or None, threads=args.threads, generator=args.child)
    _ = bb.tokenizer
    tokenizer_s = time.perf_counter() - started
    load_s = bb.load_generator()
    prompts = evidence_prompts(bb, 5, QUESTIONS[: args.questions])
    timed_answer(bb, prompts[0], 4)  # warm-up
    runs, texts = [], []
    for messages in prompts:
        s, out = timed_answer(bb, messages, args.answer_tokens)
        runs.append(s)
        texts.append(out["text"])
    print(json.dumps({"backend": bb.generation.backend, "tokenizer_s": tokenizer_s, "load_s": load_s,
                      "peak_rss_mib": peak_rss_mib(),
                      "answer_median_s": median(runs), "answer_runs_s": runs, "texts": texts}))
    return 0


def peak_rss_mib() -> float:
    """This process's peak RSS (VmHWM: unlike ru_maxrss, not carried over from the parent across exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_child(model: str | None, backend: str, args, cache: str) -> dict:
    cmd = [sys.executable, __file__, "--child", backend, "--threads", str(args.threads),
           "--questions", str(args.questions), "--answer-tokens", str(args.answer_tokens)]
    if model:
        cmd += ["--model", model]
    env = dict(os.environ, EVSEL_MODEL_CACHE=cache)
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def dense_copy_s(model: str | None, args) -> float:
    """The one-time dense copy transformers needs of a GGUF file, timed in an empty model cache."""
    with tempfile.TemporaryDirectory(prefix="evsel-bench-gen-") as cache:
        code = ("import sys,time; from evsel.models.runtime.backbone import Backbone; "
                "b=Backbone(sys.argv[1] or None, threads=int(sys.argv[2])); _=b.tokenizer; t=time.perf_counter(); "
                "b._dequantize_gguf(b.cache_dir / 'dense'); print(time.perf_counter()-t)")
        done = subprocess.run([sys.executable, "-c", code, model or "", str(args.threads)], check=False, capture_output=True,
                              text=True, env=dict(os.environ, EVSEL_MODEL_CACHE=cache))
        if done.returncode != 0:
            raise SystemExit(f"timing the dense copy failed:\n{done.stderr[-3000:]}")
        return float(done.stdout.strip().splitlines()[-1])


def models(args) -> list[dict]:
    import platformdirs
    from evsel.models.runtime.backbone import Backbone

    cache = os.environ.get("EVSEL_MODEL_CACHE") or str(Path(platformdirs.user_data_dir("evsel")) / "models")
    out = []
    for model in [None, *args.model]:
        bb = Backbone(model or None)
        row = {"model": bb.name, "path": str(bb.path), "gguf_mib": bb.path.stat().st_size / 2**20
               if bb.path.is_file() else None, "backends": {}}
        for backend in ("transformers", "llama-cpp"):
            row["backends"][backend] = run_child(model, backend, args, cache)  # the first makes the dense copy
        if args.dense_copy and bb.path.is_file():
            row["dense_copy_s"] = dense_copy_s(model, args)
        t, ll = row["backends"]["transformers"], row["backends"]["llama-cpp"]
        row["answer_speedup_llama"] = t["answer_median_s"] / ll["answer_median_s"]
        row["same_text"] = [a == b for a, b in zip(t["texts"], ll["texts"])]
        print(f"{row['model']}: transformers {t['answer_median_s']:.2f}s {t['peak_rss_mib']:.0f} MiB, llama.cpp "
              f"{ll['answer_median_s']:.2f}s {ll['peak_rss_mib']:.0f} MiB", file=sys.stderr)
        out.append(row)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", default=[], help="another GGUF file for part 2 (repeatable)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for both backends")
    parser.add_argument("--repeats", type=int, default=3, help="repetitions of part 1")
    parser.add_argument("--questions", type=int, default=5, help="evsel-shaped prompts per repetition")
    parser.add_argument("--prefill-tokens", type=int, default=1024)
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--answer-tokens", type=int, default=32, help="max new tokens of the answer step")
    parser.add_argument("--no-dense-copy", dest="dense_copy", action="store_false",
                        help="skip timing the one-time dense copy of each GGUF")
    parser.add_argument("--skip-speed", action="store_true", help="part 2 only")
    parser.add_argument("--grounded-only", action="store_true",
                        help="only part 3 (grounded vs free-form answer step), merged into an existing --out")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "generate.json")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    if args.child:
        args.model = args.model[0] if args.model else None
        return child(args)

    sys.path.insert(0, str(ROOT / "bench"))
    from common import load_1m, write_result
    from evsel.evaluation.report import run_info
    from evsel.models.runtime import llamacpp

    if args.grounded_only:
        record = json.loads(args.out.read_text()) if args.out.is_file() else {}
        record["grounded_run"] = run_info(["python", "bench/generate.py", *sys.argv[1:]])
        record["grounded"] = grounded(args)
        write_result(args.out, record)
        print(f"wrote {args.out}", file=sys.stderr)
        return 0
    ok, why = llamacpp.importable()
    if not ok:
        raise SystemExit(f"llama_cpp does not import ({why}): pip install '.[llama]' first")
    args.model = [str(Path(m).expanduser().resolve()) for m in args.model]
    record = {"run": run_info(["python", "bench/generate.py", *sys.argv[1:]]), "threads": args.threads,
              "llama_cpp_python": llamacpp.version(), "load_average_before": load_1m()}
    if not args.skip_speed:
        record["speed"] = speed(args)
        record["grounded"] = grounded(args)
    record["models"] = models(args)
    record["load_average_after"] = load_1m()
    write_result(args.out, record)
    print(json.dumps({k: record[k] for k in ("speed",) if k in record}, indent=1, default=str)[:3000])
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
