"""`evsel ingest` of a book through a daemon: stored at once, chunk states in the background.

    python bench/ingest.py                      # Sherlock Holmes from ../shared/data/nocha
    python bench/ingest.py --inline --out bench/results/ingest.json

Whole processes, as a user runs them, each in a fresh EVSEL_HOME with a started, preloaded daemon
(the dense model copy is shared), after one untimed warm-up ingest: `evsel ingest --no-encode BOOK`
(the baseline: parse, chunk, store), then `evsel ingest BOOK` (the same, and the UNREAL states computed by the daemon in the
background), timed from process start to exit, in alternating order over `--repeats`. After the
encoding ingest it measures how long the background job takes, checks `evsel daemon status` shows
it, and runs `evsel ask --select unreal` (timed, with its answer checked to cite evidence).
`--inline` adds `evsel --no-daemon ingest --encode BOOK` (states computed before the command
returns). Runs with one thread, like the other benchmarks.
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
QUESTION = "What was the speckled band?"


def evsel(args: list[str], env: dict) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "evsel", *args], capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"evsel {' '.join(args)} failed: {result.stderr}")
    return elapsed, result


def status(env: dict) -> dict:
    return json.loads(evsel(["daemon", "status", "--json"], env)[1].stdout)


def fresh_home(base_env: dict) -> tuple[Path, dict]:
    home = Path(tempfile.mkdtemp(prefix="evsel-bench-ingest-"))
    os.chmod(home, 0o700)
    env = dict(base_env, EVSEL_HOME=str(home))
    evsel(["daemon", "start"], env)
    deadline = time.monotonic() + 600
    while status(env)["preload"] != "done":
        if time.monotonic() > deadline:
            raise SystemExit("the daemon did not load the model within 10 minutes")
        time.sleep(0.5)
    return home, env


def close_home(home: Path, env: dict) -> None:
    subprocess.run([sys.executable, "-m", "evsel", "daemon", "stop"], env=env, capture_output=True)
    shutil.rmtree(home, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--book", type=Path, default=BOOK)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each ingest, alternating")
    parser.add_argument("--inline", action="store_true", help="also time --no-daemon ingest --encode")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "ingest.json")
    args = parser.parse_args()
    if not args.book.is_file():
        raise SystemExit(f"{args.book} is absent: the shared benchmark data is not checked out beside the project")
    sys.path.insert(0, str(ROOT / "bench"))
    from common import write_result

    from evsel.evaluation.report import run_info

    base = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    for name in ("EVSEL_NO_DAEMON", "EVSEL_DAEMON_BUILD", "EVSEL_ENCODE", "EVSEL_HOME"):
        base.pop(name, None)
    if "EVSEL_MODEL_CACHE" not in base:  # share the dense model copy with the user's default home
        import platformdirs

        base["EVSEL_MODEL_CACHE"] = str(Path(platformdirs.user_data_dir("evsel")) / "models")
    record: dict = {"run": run_info(["python", "bench/ingest.py", *sys.argv[1:]]), "book": str(args.book),
                    "omp_num_threads": base["OMP_NUM_THREADS"], "no_encode_s": [], "background_s": [],
                    "runs": []}
    home, env = fresh_home(base)  # warm-up, not timed: the OS file cache, the dense model copy
    try:
        evsel(["ingest", "--no-encode", str(args.book)], env)
    finally:
        close_home(home, env)
    for repeat in range(args.repeats):
        order = ["no_encode", "background"] if repeat % 2 == 0 else ["background", "no_encode"]
        for mode in order:
            home, env = fresh_home(base)
            try:
                flags = ["--no-encode"] if mode == "no_encode" else []
                seconds, result = evsel(["ingest", *flags, "--json", str(args.book)], env)
                files = json.loads(result.stdout)["files"]
                run = {"mode": mode, "ingest_s": round(seconds, 2), "chunks": files[0]["chunks"]}
                if mode == "background":
                    assert files[0].get("states") == "background", files[0]
                    info = status(env)
                    run["background_seen_in_status"] = bool(info["queue"]["background"])
                    started = time.perf_counter()
                    while status(env)["queue"]["background"]:
                        time.sleep(1.0)
                    run["background_encode_s"] = round(time.perf_counter() - started, 1)
                    ask_s, asked = evsel(["ask", "--select", "unreal", "--evidence-only", "--json", QUESTION], env)
                    evidence = json.loads(asked.stdout)["evidence"]
                    run["ask_unreal_s"] = round(ask_s, 2)
                    run["ask_unreal_evidence"] = len(evidence)
                    run["ask_unreal_mentions_band"] = any("band" in e["text"].lower() for e in evidence)
                record[f"{mode}_s"].append(run["ingest_s"])
                record["runs"].append(run)
                print(json.dumps(run), flush=True)
            finally:
                close_home(home, env)
    if args.inline:
        home = Path(tempfile.mkdtemp(prefix="evsel-bench-ingest-"))
        env = dict(base, EVSEL_HOME=str(home))
        try:
            seconds, _ = evsel(["--no-daemon", "ingest", "--encode", str(args.book)], env)
            record["inline_encode_s"] = round(seconds, 2)
            print(f"inline ingest --encode: {seconds:.1f}s", flush=True)
        finally:
            shutil.rmtree(home, ignore_errors=True)
    no_encode = statistics.median(record["no_encode_s"])
    background = statistics.median(record["background_s"])
    record["ratio_background_to_no_encode"] = round(background / no_encode, 3)
    record["target_ratio"] = 2.0
    write_result(args.out, record)
    print(f"ingest through the daemon: --no-encode {no_encode:.2f}s, with background states {background:.2f}s, "
          f"ratio {record['ratio_background_to_no_encode']} (target <= 2)")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
