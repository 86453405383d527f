"""`evsel ingest` of a book through a daemon: stored at once, chunk states in the background.

    python bench/ingest.py                      # Sherlock Holmes from ../shared/data/nocha
    python bench/ingest.py --inline --out bench/results/ingest.json
    python bench/ingest.py --memory --label streaming   # peak RSS and cancel latency, 51.5 MiB text

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
    from common import wait_until_preloaded  # bench/ is on sys.path (main)

    evsel(["daemon", "start"], env)
    wait_until_preloaded(lambda: status(env))
    return home, env


def close_home(home: Path, env: dict) -> None:
    subprocess.run([sys.executable, "-m", "evsel", "daemon", "stop"], env=env, capture_output=True)
    shutil.rmtree(home, ignore_errors=True)


def make_big_text(path: Path, mib: int = 50) -> int:
    """A ~`mib` MiB plain-text file: copies of the nocha books (or generated sentences), each copy's
    paragraphs numbered so no two chunks are the same text."""
    books = sorted((ROOT.parent / "shared" / "data" / "nocha" / "books").glob("*.txt"))
    if books:
        source = "\n\n".join(b.read_text(encoding="utf-8") for b in books)
    else:
        import random

        rng = random.Random(12)
        words = ("the a lantern river quietly old house letter morning window stranger promised garden "
                 "cold silver road answered never daughter kept walked beneath bright winter").split()
        source = "\n\n".join(" ".join(rng.choice(words).capitalize() if i == 0 else rng.choice(words)
                                      for i in range(rng.randint(6, 24))) + "." for _ in range(20000))
    target = mib * 1024 * 1024
    written = 0
    with path.open("w", encoding="utf-8") as out:
        copy = 0
        while written < target:
            block = f"Copy {copy}.\n\n" + source + "\n\n"
            out.write(block)
            written += len(block.encode("utf-8"))
            copy += 1
    return path.stat().st_size


# where a cancel lands in the memory ingest (--cancel-points): reading the file, then fractions of the
# chunks stored (of the daemon's running estimate of the total); each point is a fresh ingest
CANCEL_POINTS = "parse,0.1,0.5,0.97"


def cancel_at(big: Path, env: dict, point) -> dict:
    """SIGINT to a client ingesting BIG through the daemon once its progress reaches `point`; the
    seconds until the daemon's status shows no running request (polled every 0.05 s), and whether
    the store was left as it was."""
    import signal

    from evsel.daemon import client as daemon_client, runtime

    files = runtime.DaemonFiles(Path(env["EVSEL_HOME"]))

    def status(_env: dict) -> dict:  # over the socket, in this process: a poll costs milliseconds
        return daemon_client.status(files) or {}

    before = status(env)["documents"]
    client = subprocess.Popen([sys.executable, "-m", "evsel", "ingest", "--no-encode", str(big)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    progress: dict = {}
    deadline = time.monotonic() + 1200
    while time.monotonic() < deadline:
        running = status(env)["queue"].get("running")
        progress = (running or {}).get("progress") or {}
        if point == "parse" and progress.get("task") == "parse":
            break
        if (not isinstance(point, str) and progress.get("task") == "store" and progress.get("total")
                and progress["done"] >= point * progress["total"]):
            break
        if client.poll() is not None:
            raise SystemExit(f"the ingest ended before the cancel point {point}")
        time.sleep(0.05)
    client.send_signal(signal.SIGINT)
    sent = time.perf_counter()
    info: dict = {}
    while time.perf_counter() - sent < 300:
        info = status(env)
        if info["queue"].get("running") is None:
            break
        time.sleep(0.05)
    latency = time.perf_counter() - sent
    try:
        client.wait(timeout=30)
    except subprocess.TimeoutExpired:
        client.kill()
    job_id = (running or {}).get("id")
    entry: dict = {}
    until = time.monotonic() + 30  # the daemon records the request's outcome just after it stops
    while not entry and time.monotonic() < until:
        entry = next((r for r in status(env).get("recent") or [] if r.get("id") == job_id), {})
        time.sleep(0.05)
    row = {"point": point, "progress_when_signalled": {k: progress.get(k) for k in ("task", "done", "total")},
           "latency_s": round(latency, 2), "target_s": 2.0, "last_status": entry.get("status"),
           "client_rc": client.returncode, "store_unchanged": info.get("documents") == before}
    print(json.dumps(row), flush=True)
    return row


def memory_mode(args, base: dict) -> int:
    """Peak RSS of `evsel --no-daemon ingest --no-encode BIG` (a 51.5 MiB text file) and its ratio to
    the file size; and cancel latency at `CANCEL_POINTS`: SIGINT to a client ingesting BIG through a
    daemon, until the daemon's status shows no running request."""

    sys.path.insert(0, str(ROOT / "bench"))
    from common import write_result

    from evsel.evaluation.report import run_info

    work = Path(tempfile.mkdtemp(prefix="evsel-bench-memory-"))
    big = work / "big.txt"
    size = make_big_text(big, args.memory_mib)
    record: dict = {"run": run_info(["python", "bench/ingest.py", *sys.argv[1:]]), "label": args.label,
                    "file_bytes": size, "file_mib": round(size / 2**20, 1)}
    print(f"wrote {big}: {size / 2**20:.1f} MiB", flush=True)
    out = args.out if args.out != DEFAULT_OUT else ROOT / "bench" / "results" / "ingest-memory.json"

    def save() -> None:  # after each step: a long run stopped half-way keeps what it measured
        previous = json.loads(out.read_text()) if out.is_file() else {}
        runs = [r for r in previous.get("runs", []) if r.get("label") != args.label] + [record]
        write_result(out, {"runs": runs})

    earlier = [r for r in (json.loads(out.read_text()) if out.is_file() else {}).get("runs", [])
               if r.get("label") == args.label]
    if args.cancel_only and earlier:  # more cancel points for a run measured already
        record = {**earlier[0], "cancel": list(earlier[0].get("cancel") or [])}
    try:
        # 1. peak RSS of an in-process ingest, measured by /usr/bin/time -v (else getrusage of the child)
        if not (args.cancel_only and earlier):
            home = work / "home-rss"
            home.mkdir(mode=0o700)
            env = dict(base, EVSEL_HOME=str(home))
            command = [sys.executable, "-m", "evsel", "--no-daemon", "ingest", "--no-encode", "--json", str(big)]
            timer = shutil.which("time") or ("/usr/bin/time" if Path("/usr/bin/time").exists() else None)
            started = time.perf_counter()
            if timer:
                result = subprocess.run([timer, "-v", *command], capture_output=True, text=True, env=env)
                line = next(l for l in result.stderr.splitlines() if "Maximum resident set size" in l)
                peak_kib = int(line.rsplit(":", 1)[1])
            else:
                import resource

                result = subprocess.run(command, capture_output=True, text=True, env=env)
                peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            seconds = time.perf_counter() - started
            if result.returncode != 0:
                raise SystemExit(f"ingest failed: {result.stderr[-2000:]}")
            files = json.loads(result.stdout)["files"]
            record["memory"] = {"command": "evsel --no-daemon ingest --no-encode --json BIG", "measured_by":
                                "/usr/bin/time -v" if timer else "getrusage(RUSAGE_CHILDREN)",
                                "peak_rss_mib": round(peak_kib / 1024, 1),
                                "ratio_to_file": round(peak_kib * 1024 / size, 2), "target_ratio": 10.0,
                                "ingest_s": round(seconds, 1), "chunks": files[0]["chunks"]}
            print(json.dumps(record["memory"]), flush=True)
            save()
            shutil.rmtree(home, ignore_errors=True)
        # 2. cancel latency through a daemon, at several points of the same ingest
        home = work / "home-cancel"
        home.mkdir(mode=0o700)
        env = dict(base, EVSEL_HOME=str(home))
        evsel(["daemon", "start", "--no-preload"], env)
        try:
            record.setdefault("cancel", [])
            for point in args.cancel_points.split(","):
                record["cancel"].append(cancel_at(big, env, point if point == "parse" else float(point)))
                record["cancel_max_s"] = max(c["latency_s"] for c in record["cancel"])
                save()
        finally:
            subprocess.run([sys.executable, "-m", "evsel", "daemon", "stop"], env=env, capture_output=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    save()
    print(f"wrote {out}")
    return 0


DEFAULT_OUT = ROOT / "bench" / "results" / "ingest.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--book", type=Path, default=BOOK)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each ingest, alternating")
    parser.add_argument("--inline", action="store_true", help="also time --no-daemon ingest --encode")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--memory", action="store_true",
                        help="peak RSS and cancel latency of a ~50 MiB text ingest (bench/results/ingest-memory.json)")
    parser.add_argument("--memory-mib", type=int, default=50)
    parser.add_argument("--cancel-only", action="store_true",
                        help="--memory: add cancel points to the run of this --label, without measuring memory again")
    parser.add_argument("--cancel-points", default=CANCEL_POINTS,
                        help="--memory: where each cancel lands: parse, or a fraction of the chunks stored")
    parser.add_argument("--label", default="current", help="--memory: the run's name (e.g. before, after)")
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
    if args.memory:
        return memory_mode(args, base)
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
