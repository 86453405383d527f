"""Start-up of the `evsel` command as whole processes, against `python -c pass`, in one run.

    python bench/startup.py                  # 15 rounds
    python bench/startup.py --rounds 5       # a quick look

Each round runs, as a user would (a new process, timed from start to exit), `python -c pass`,
`evsel --version`, `evsel docs list` through a warm daemon, and `evsel --no-daemon docs list`
(which opens the store in the process) for contrast; the order is rotated every round so that each
command sees the same machine load. Reported per command: the median wall time and the median CPU
time (user + system, of that process alone: the daemon's work is not in it), and both as ratios to
`python -c pass`. CPU time moves less than wall time when other jobs share the cores. Runs in a
temporary EVSEL_HOME holding the bundled sample story; the daemon starts without loading the model
(`docs list` needs none).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EVSEL = [sys.executable, "-m", "evsel"]
COMMANDS = {  # name: argv
    "python -c pass": [sys.executable, "-c", "pass"],
    "evsel --version": [*EVSEL, "--version"],
    "evsel docs list (warm daemon)": [*EVSEL, "docs", "list"],
    "evsel --no-daemon docs list": [*EVSEL, "--no-daemon", "docs", "list"],
}
BASELINE = "python -c pass"
TARGETS = {"evsel --version": 3.0, "evsel docs list (warm daemon)": 5.0}  # issue 24


def timed(argv: list[str], env: dict) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of one process run to its exit."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    result = subprocess.run(argv, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15, help="runs of each command")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "startup.json")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "bench"))
    from common import load_1m, write_result

    home = Path(tempfile.mkdtemp(prefix="evsel-bench-startup-"))
    os.chmod(home, 0o700)
    env = dict(os.environ, EVSEL_HOME=str(home), EVSEL_ENCODE="0", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    for name in ("EVSEL_NO_DAEMON", "EVSEL_DAEMON_BUILD"):
        env.pop(name, None)
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in COMMANDS}
    load_before = load_1m()
    try:
        subprocess.run([*EVSEL, "daemon", "start", "--no-preload"], env=env, check=True, capture_output=True)
        sample = subprocess.run([*EVSEL, "sample"], env=env, check=True, capture_output=True, text=True).stdout.strip()
        subprocess.run([*EVSEL, "ingest", sample], env=env, check=True, capture_output=True)
        daemon_pid = json.loads((home / "daemon.pid").read_text())["pid"]
        for argv in COMMANDS.values():  # warm-up: the OS file cache and bytecode, not timed
            timed(argv, env)
        names = list(COMMANDS)
        for round_ in range(args.rounds):
            shift = round_ % len(names)
            for name in names[shift:] + names[:shift]:
                runs[name].append(timed(COMMANDS[name], env))
        # every warm run went to the one daemon (none restarted it)
        same_daemon = json.loads((home / "daemon.pid").read_text())["pid"] == daemon_pid
    finally:
        subprocess.run([*EVSEL, "daemon", "stop"], env=env, capture_output=True)
        shutil.rmtree(home, ignore_errors=True)

    from evsel.evaluation.report import run_info

    base_wall = statistics.median(w for w, _ in runs[BASELINE])
    base_cpu = statistics.median(c for _, c in runs[BASELINE])
    rows = {}
    for name, samples in runs.items():
        wall, cpu = statistics.median(w for w, _ in samples), statistics.median(c for _, c in samples)
        rows[name] = {"argv": " ".join(Path(a).name if a == sys.executable else a for a in COMMANDS[name]),
                      "wall_median_s": round(wall, 4), "cpu_median_s": round(cpu, 4),
                      "wall_ratio": round(wall / base_wall, 2), "cpu_ratio": round(cpu / base_cpu, 2),
                      "target_ratio": TARGETS.get(name),
                      "wall_s": [round(w, 4) for w, _ in samples], "cpu_s": [round(c, 4) for _, c in samples]}
        target = f"  (target <= {TARGETS[name]:g}x)" if name in TARGETS else ""
        print(f"{name:32s} wall {wall * 1000:6.0f} ms = {wall / base_wall:5.2f}x   "
              f"cpu {cpu * 1000:5.0f} ms = {cpu / base_cpu:5.2f}x{target}", flush=True)
    record = {"run": run_info(["python", "bench/startup.py", *sys.argv[1:]]), "rounds": args.rounds,
              "baseline": BASELINE, "load_1m_before": load_before, "load_1m_after": load_1m(),
              "same_daemon_throughout": same_daemon, "commands": rows}
    write_result(args.out, record)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
