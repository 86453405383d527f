"""Whole-process `evsel ask` with a warm daemon vs `--no-daemon`, on a book, in the same run.

    python bench/daemon.py                       # Sherlock Holmes from ../shared/data/nocha
    python bench/daemon.py --questions 5 --out bench/results/daemon.json
    python bench/daemon.py --versus hybrid        # warm asks of a method against BM25's: the ratio
    python bench/daemon.py --versus hybrid --home DIR   # ... in DIR, kept: a rerun skips the encode

Each question is asked twice as a user would, timed from process start to exit: once with
`--no-daemon` (the process imports torch, loads the model, reads the chunks, ranks, generates) and
once through a warm daemon (already started, model loaded, one warm-up question asked before the
timed ones). Cold and warm runs alternate so they see the same machine load. The warm ask's time
is broken down into client start (process start until the daemon has the request: interpreter,
imports, connect, version check), queue, the engine's own scope/select/generate, and client finish
(reply to exit: printing). Both answers must be identical. The same is repeated with
--evidence-only (no generation). Runs in a temporary EVSEL_HOME; the model cache is shared.
`--versus` ingests the book through the daemon and waits for its background encode (UNREAL
states, QRRanker's stored block KV) before the warm-up, as a user's asks would find it.
Like bench/run_all.sh, it runs every process (the daemon too) with one thread unless
OMP_NUM_THREADS says otherwise: on shared cores, spin-waiting OpenMP threads make generation
erratic and up to 10x slower.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT.parent / "shared" / "data" / "nocha" / "books" / "the_adventures_of_sherlock_holmes_arthur_conan_doyle.txt"
QUESTIONS = [
    "Where did the King of Bohemia meet Irene Adler?",
    "What work did Jabez Wilson do for the Red-Headed League?",
    "What was the speckled band?",
    "Where was the blue carbuncle found?",
    "Who was the man with the twisted lip?",
]
WARM_UP = "Who is Sherlock Holmes's friend?"


def evsel(args: list[str], env: dict, check: bool = True) -> tuple[float, float, subprocess.CompletedProcess]:
    started_wall = time.time()
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "evsel", *args], capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - started
    if check and result.returncode != 0:
        raise SystemExit(f"evsel {' '.join(args)} failed: {result.stderr}")
    return started_wall, elapsed, result


def daemon_status(env: dict) -> dict:
    return json.loads(evsel(["daemon", "status", "--json"], env)[2].stdout)


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def start_warm_daemon(env: dict) -> None:
    """Start the daemon and wait until it has loaded the model."""
    from common import wait_until_preloaded  # bench/ is on sys.path (main)

    evsel(["daemon", "start"], env)
    wait_until_preloaded(lambda: daemon_status(env))


STORY_QUESTIONS = ["Who keeps the light?", "What happened to the boat?", "Who came to the island?"]


def ask_median(env: dict, questions: list[str], extra: list[str], during=None) -> tuple[float, list[dict]]:
    """Median whole-process time of `evsel ask` over `questions`; `during()` (the background encode's
    progress) is read before and after each, so a run says whether the encode was mid-way throughout."""
    runs = []
    for question in questions:
        before = during() if during else None
        _, seconds, result = evsel(["ask", question, "--json", *extra], env)
        after = during() if during else None
        timings = json.loads(result.stdout)["timings"]
        runs.append({"question": question, "wall_s": round(seconds, 3), "queued_s": timings.get("queued_s"),
                     "run_s": timings.get("run_s"), "encode_before": before, "encode_after": after})
    return round(statistics.median(r["wall_s"] for r in runs), 3), runs


def background_row(args, env: dict, record: dict) -> None:
    """Ask latency on a warm daemon, idle and while it encodes a document's UNREAL chunk states in
    the background (an `evsel ingest` with EVSEL_ENCODE=1), in the same run; the ratio of medians."""
    from evsel.paths import sample_story_path

    story = sample_story_path().read_text(encoding="utf-8")
    start_warm_daemon(env)
    evsel(["ingest", str(sample_story_path())], dict(env, EVSEL_ENCODE="0"))
    questions = STORY_QUESTIONS[: args.questions]
    evsel(["ask", questions[0], "--max-new-tokens", str(args.max_new_tokens)], env)  # warm-up, not timed
    # a long document whose chunk texts all differ from the story's: none of its states exist yet
    book = Path(env["EVSEL_HOME"]) / "background-book.md"
    swaps = [(" the ", " that "), (" a ", " one "), (" and ", " & ")]
    book.write_text("\n\n".join(story.replace(old, new) for old, new in swaps), encoding="utf-8")

    def encode_progress():
        background = daemon_status(env)["queue"]["background"]
        progress = (background[0].get("progress") or {}) if background else {}
        return [progress.get("done"), progress.get("total")] if background else None

    modes = {"answer": ["--max-new-tokens", str(args.max_new_tokens)], "evidence_only": ["--evidence-only"]}
    idle = {mode: ask_median(env, questions, extra) for mode, extra in modes.items()}
    evsel(["ingest", str(book)], dict(env, EVSEL_ENCODE="1"))
    while (encode_progress() or [0])[0] in (0, None):  # the encode has stored its first slice
        time.sleep(0.2)
    busy = {mode: ask_median(env, questions, extra, encode_progress) for mode, extra in modes.items()}
    row = {}
    for mode in modes:
        row[mode] = {"idle_median_s": idle[mode][0], "during_encode_median_s": busy[mode][0],
                     "ratio": round(busy[mode][0] / idle[mode][0], 3),
                     "encode_mid_way_throughout": all(r["encode_after"] for r in busy[mode][1]),
                     "idle_runs": idle[mode][1], "during_encode_runs": busy[mode][1]}
        print(f"{mode:13s} idle {idle[mode][0]:.2f}s  during a background encode {busy[mode][0]:.2f}s  "
              f"ratio {row[mode]['ratio']:.2f}  (encode mid-way throughout: {row[mode]['encode_mid_way_throughout']})",
              flush=True)
    record["background"] = row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--book", type=Path, default=BOOK, help="the book to ask about")
    parser.add_argument("--questions", type=int, default=3, help="timed questions (each cold and warm)")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="answer length limit (the CLI default)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "daemon.json")
    parser.add_argument("--background", action="store_true",
                        help="only ask latency idle vs during a background encode, on the sample story "
                             "(default out: bench/results/daemon-background.json)")
    parser.add_argument("--versus", metavar="METHOD[,METHOD]",
                        help="only warm asks with each --select METHOD against --select bm25 on the book, and "
                             "their ratios (default out: bench/results/daemon-versus.json)")
    parser.add_argument("--home", type=Path,
                        help="with --background or --versus: run in this EVSEL_HOME and keep it (a second run "
                             "finds the book ingested and encoded); default: a temporary one")
    args = parser.parse_args()
    if args.background:
        return side_main(args, background_row, "daemon-background.json")
    if args.versus:
        return side_main(args, versus_row, "daemon-versus.json")
    if not args.book.is_file():
        raise SystemExit(f"{args.book} is absent: the shared benchmark data is not checked out beside the project")

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.path.insert(0, str(ROOT / "bench"))
    from common import wait_until_preloaded, write_result

    from evsel.evaluation.report import run_info

    home = Path(tempfile.mkdtemp(prefix="evsel-bench-daemon-"))
    os.chmod(home, 0o700)
    env = dict(os.environ, EVSEL_HOME=str(home))
    env.pop("EVSEL_NO_DAEMON", None)
    env.pop("EVSEL_DAEMON_BUILD", None)
    if "EVSEL_MODEL_CACHE" not in env:  # share the dense model copy with the user's default home
        import platformdirs

        env["EVSEL_MODEL_CACHE"] = str(Path(platformdirs.user_data_dir("evsel")) / "models")
    record: dict = {"run": run_info(["python", "bench/daemon.py", *sys.argv[1:]]), "book": str(args.book),
                    "max_new_tokens": args.max_new_tokens, "omp_num_threads": env["OMP_NUM_THREADS"],
                    "load_average_before": load_average()}
    try:
        # bm25 asks read no selector states: skip computing them at ingest (EVSEL_ENCODE=0)
        _, ingest_s, _ = evsel(["--no-daemon", "ingest", str(args.book)], dict(env, EVSEL_ENCODE="0"))
        record["ingest_s"] = round(ingest_s, 2)
        # a cold ask first, so the dense model copy and the OS file cache are warm for every timed run
        evsel(["--no-daemon", "ask", WARM_UP, "--max-new-tokens", "1"], env)

        _, start_s, _ = evsel(["daemon", "start"], env)
        record["daemon_start_s"] = round(start_s, 2)
        wait_until_preloaded(lambda: daemon_status(env))
        evsel(["ask", WARM_UP, "--max-new-tokens", str(args.max_new_tokens)], env)  # warm-up, not timed

        # the default answer step (the reader) and the rules step it replaced, in the same run
        modes = {"answer": ["--max-new-tokens", str(args.max_new_tokens)],
                 "answer_rules": ["--style", "rules", "--max-new-tokens", str(args.max_new_tokens)],
                 "evidence_only": ["--evidence-only"]}
        for mode, extra in modes.items():
            runs = []
            for question in QUESTIONS[: args.questions]:
                ask = ["ask", question, "--json", *extra]
                _, cold_s, cold = evsel(["--no-daemon", *ask], env)
                started_wall, warm_s, warm = evsel(ask, env)
                cold_result, warm_result = json.loads(cold.stdout), json.loads(warm.stdout)
                request = daemon_status(env)["recent"][-1]
                assert request["method"] == "ask" and request["status"] == "ok", request
                timings = warm_result["timings"]
                daemon_done = request["received_at"] + request["queue_s"] + request["run_s"]
                runs.append({
                    "question": question,
                    "cold_s": round(cold_s, 3),
                    "warm_s": round(warm_s, 3),
                    "ratio": round(warm_s / cold_s, 4),
                    "identical": {k: v for k, v in cold_result.items() if k != "timings"}
                    == {k: v for k, v in warm_result.items() if k != "timings"},
                    "cold_timings": cold_result["timings"],
                    "warm_breakdown": {
                        "client_start_s": round(request["received_at"] - started_wall, 3),
                        "queue_s": request["queue_s"],
                        "scope_s": timings.get("scope_s"),
                        "select_s": timings.get("select_s"),
                        "generate_s": timings.get("generate_s", 0.0),
                        "daemon_run_s": request["run_s"],
                        "client_finish_s": round(started_wall + warm_s - daemon_done, 3),
                    },
                    "answer": warm_result["answer"],
                })
                print(f"{mode:13s} cold {cold_s:6.2f}s  warm {warm_s:6.2f}s  ratio {warm_s / cold_s:.3f}  "
                      f"{question}", flush=True)
            cold = statistics.median(r["cold_s"] for r in runs)
            warm = statistics.median(r["warm_s"] for r in runs)
            breakdown = {key: round(statistics.median(r["warm_breakdown"][key] or 0.0 for r in runs), 3)
                         for key in runs[0]["warm_breakdown"]}
            # generation is the same work in both modes; what is left is what the daemon can save
            cold_rest = statistics.median(r["cold_s"] - r["cold_timings"].get("generate_s", 0.0) for r in runs)
            warm_rest = statistics.median(r["warm_s"] - (r["warm_breakdown"]["generate_s"] or 0.0) for r in runs)
            record[mode] = {"cold_median_s": round(cold, 3), "warm_median_s": round(warm, 3),
                            "ratio_of_medians": round(warm / cold, 4), "target_ratio": 0.1,
                            "cold_without_generate_median_s": round(cold_rest, 3),
                            "warm_without_generate_median_s": round(warm_rest, 3),
                            "ratio_without_generate": round(warm_rest / cold_rest, 4),
                            "cold_generate_median_s": round(statistics.median(
                                r["cold_timings"].get("generate_s", 0.0) for r in runs), 3),
                            "all_identical": all(r["identical"] for r in runs),
                            "warm_breakdown_median": breakdown, "runs": runs}
        info = daemon_status(env)
        record["daemon"] = {k: info[k] for k in ("build", "memory_mb", "cache", "backbones")}
    finally:
        subprocess.run([sys.executable, "-m", "evsel", "daemon", "stop"], env=env, capture_output=True)
        if not args.home:
            shutil.rmtree(home, ignore_errors=True)
    record["load_average_after"] = load_average()
    reader, rules = (record[m]["warm_breakdown_median"]["generate_s"] for m in ("answer", "answer_rules"))
    record["answer_step"] = {"reader_warm_median_s": reader, "rules_warm_median_s": rules,
                             "ratio": round(reader / rules, 3) if rules else None, "target_s": 1.5}
    write_result(args.out, record)
    print(f"answer step (warm): reader {reader}s, rules {rules}s, ratio {record['answer_step']['ratio']}")
    for mode in ("answer", "answer_rules", "evidence_only"):
        r = record[mode]
        print(f"{mode}: cold {r['cold_median_s']}s, warm {r['warm_median_s']}s, ratio {r['ratio_of_medians']} "
              f"(target <= 0.1; without generation {r['ratio_without_generate']}), identical: "
              f"{r['all_identical']}; warm breakdown {r['warm_breakdown_median']}")
    print(f"wrote {args.out}")
    return 0


def versus_row(args, env: dict, record: dict) -> None:
    """Warm daemon asks with each `--select METHOD` (comma-separated) against `--select bm25` on the
    book, alternating in the same run: each ratio of medians is what `evsel train hybrid
    --warm-ask-ratio METHOD=RATIO` takes (the default rule's speed condition, models/fusion/paired.py)."""
    start_warm_daemon(env)
    # as a user would: ingest through the daemon, whose background work stores what the selectors
    # read (UNREAL states, QRRanker's block KV), and ask once it is done
    started = time.monotonic()
    evsel(["ingest", str(args.book)], env)
    while daemon_status(env)["queue"]["background"]:
        time.sleep(1.0)
    record["background_encode_s"] = round(time.monotonic() - started, 1)
    methods = list(dict.fromkeys(m.strip() for m in args.versus.split(",") if m.strip() and m.strip() != "bm25"))
    methods.append("bm25")
    for method in methods:  # warm-up: each method's states and parts are resident
        evsel(["ask", WARM_UP, "--select", method, "--max-new-tokens", str(args.max_new_tokens)], env)
    runs: dict[str, list[dict]] = {method: [] for method in methods}
    for question in QUESTIONS[: args.questions]:
        for method in methods:
            _, seconds, result = evsel(["ask", question, "--json", "--select", method,
                                        "--max-new-tokens", str(args.max_new_tokens)], env)
            reply = json.loads(result.stdout)
            runs[method].append({"question": question, "wall_s": round(seconds, 3), "ran": reply["method"]["select"],
                                 "select_s": reply["timings"].get("select_s"),
                                 "generate_s": reply["timings"].get("generate_s")})
            print(f"{method:36s} warm {seconds:6.2f}s  {question}", flush=True)
    medians = {method: statistics.median(r["wall_s"] for r in rows) for method, rows in runs.items()}
    base = medians["bm25"]
    record["versus"] = {"bm25_warm_median_s": round(base, 3), "methods": {
        method: {"warm_median_s": round(medians[method], 3), "warm_ask_ratio": round(medians[method] / base, 3)}
        for method in methods[:-1]}, "runs": runs}
    for method in methods[:-1]:
        print(f"warm ask: {method} {medians[method]:.2f}s, bm25 {base:.2f}s: "
              f"--warm-ask-ratio {method}={medians[method] / base:.2f}")


def side_main(args, row, default_out: str) -> int:
    """A run of one row (`--background`, `--versus`) in its own EVSEL_HOME, with a daemon stopped at the end."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.path.insert(0, str(ROOT / "bench"))
    from common import write_result

    from evsel.evaluation.report import run_info

    out = args.out if args.out != ROOT / "bench" / "results" / "daemon.json" else ROOT / "bench" / "results" / default_out
    home = args.home or Path(tempfile.mkdtemp(prefix="evsel-bench-daemon-"))
    home.mkdir(mode=0o700, exist_ok=True)
    env = dict(os.environ, EVSEL_HOME=str(home))
    env.pop("EVSEL_NO_DAEMON", None)
    env.pop("EVSEL_DAEMON_BUILD", None)
    record: dict = {"run": run_info(["python", "bench/daemon.py", *sys.argv[1:]]),
                    "max_new_tokens": args.max_new_tokens, "omp_num_threads": env["OMP_NUM_THREADS"],
                    "load_average_before": load_average()}
    try:
        row(args, env, record)
    finally:
        subprocess.run([sys.executable, "-m", "evsel", "daemon", "stop"], env=env, capture_output=True)
        if not args.home:
            shutil.rmtree(home, ignore_errors=True)
    record["load_average_after"] = load_average()
    write_result(out, record)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
