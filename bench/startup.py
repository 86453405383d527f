"""Start-up of the `evsel` command as whole processes, against `python -c pass`, in one run.

    python bench/startup.py                          # 15 rounds
    python bench/startup.py --before 273603c         # ... and the code of that commit beside it
    python bench/startup.py --rounds 5               # a quick look
    python bench/startup.py --pin-build              # while others edit the checkout

Each round runs, as a user would (a new process, timed from start to exit), `python -c pass`,
`evsel --version`, `evsel docs list` and an evidence-only `evsel ask` through a warm daemon, and
`evsel --no-daemon docs list` (which opens the store in the process) for contrast, each with pipes
for stdout and stderr; then the warm `docs list` and `ask` again with a terminal (a pseudo-terminal
of 120x50) as both, where rich renders their output. The order is rotated every round so that
each command sees the same machine load. With --before COMMIT the
same evsel commands of that commit (its files laid out as the installed `evsel` namespace, from
`git archive`, on PYTHONPATH, talking to a daemon of their own) run in the same rounds. Reported per
command: the median wall time and the median CPU time (user + system, of that process alone: the
daemon's work is not in it), and both as ratios to `python -c pass`. CPU time moves less than wall
time when other jobs share the cores. Then each evsel command runs once more under
`python -X importtime`: what its imports cost, summed per top-level package and per module (one
run: read it as shares, not as timings).

Runs in temporary EVSEL_HOMEs holding the bundled sample story; the daemons start without loading
the model (neither `docs list` nor an evidence-only BM25 `ask` needs it). Bytecode is cached, as
after `pip install` (PYTHONDONTWRITEBYTECODE is dropped for the commands; the untimed warm-up
writes it), so the figures are those a user sees, not the compiler's.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import resource
import shlex
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EVSEL = [sys.executable, "-m", "evsel"]
QUESTION = "Who keeps the light?"
COMMANDS = {  # name: argv
    "python -c pass": [sys.executable, "-c", "pass"],
    "evsel --version": [*EVSEL, "--version"],
    "evsel docs list (warm daemon)": [*EVSEL, "docs", "list"],
    "evsel ask --evidence-only (warm daemon)": [*EVSEL, "ask", QUESTION, "--evidence-only"],
    "evsel --no-daemon docs list": [*EVSEL, "--no-daemon", "docs", "list"],
}
# run with a terminal as stdout and stderr: rich renders those (colours, live progress rows, the
# table fitted to the terminal's width)
ON_TERMINAL = {
    "evsel docs list (warm daemon, terminal)": [*EVSEL, "docs", "list"],
    "evsel ask --evidence-only (warm daemon, terminal)": [*EVSEL, "ask", QUESTION, "--evidence-only"],
}
TERMINAL_SIZE = (50, 120)  # rows, columns
BASELINE = "python -c pass"
# issue 47: --version within 1.5x the bare interpreter, a command forwarded to the daemon within 3x
TARGETS = {"evsel --version": 1.5, "evsel docs list (warm daemon)": 3.0,
           "evsel ask --evidence-only (warm daemon)": 3.0}
BEFORE = " (before)"
# the folders pyproject.toml maps into the one `evsel` namespace (as tests/test_architecture.py)
LAYOUT = {"evsel": "evsel_cli", "evsel/daemon": "daemon", "evsel/models": "models", "evsel/recipes": "recipes"}
TOP = 12  # modules and packages listed per command


def timed(argv: list[str], env: dict, terminal: bool = False) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of one process run to its exit; its stdout and stderr
    are pipes, or one pseudo-terminal (`terminal`), read as it writes."""
    if terminal:
        return _timed_on_terminal(argv, env)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    result = subprocess.run(argv, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _timed_on_terminal(argv: list[str], env: dict) -> tuple[float, float]:
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", *TERMINAL_SIZE, 0, 0))
    shown = bytearray()

    def drain() -> None:
        while True:
            try:
                chunk = os.read(leader, 1 << 16)
            except OSError:  # the terminal closed
                return
            if not chunk:
                return
            shown.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        result = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower)
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        os.close(follower)
        reader.join(10)
        os.close(leader)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({result.returncode}) on a terminal: {shown.decode(errors='replace')}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def import_costs(argv: list[str], env: dict) -> dict:
    """One run of `argv` under `python -X importtime`: microseconds per top-level package (self
    time summed) and the modules with the most cumulative time (their children included)."""
    result = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], env=env, capture_output=True, text=True)
    rows = []
    for line in result.stderr.splitlines():
        if line.startswith("import time:") and line.count("|") == 2 and "self [us]" not in line:
            own, total, name = line.removeprefix("import time:").split("|")
            rows.append((name.strip(), int(own), int(total), (len(name) - len(name.lstrip())) // 2))
    packages: dict[str, int] = {}
    for name, own, _, _ in rows:
        packages[name.split(".")[0]] = packages.get(name.split(".")[0], 0) + own
    return {"total_us": sum(own for _, own, _, _ in rows), "modules": len(rows),
            "by_package_us": dict(sorted(packages.items(), key=lambda kv: -kv[1])[:TOP]),
            "top_cumulative": [{"module": name, "cumulative_us": total, "self_us": own, "depth": depth}
                               for name, own, total, depth in sorted(rows, key=lambda r: -r[2])[:TOP]]}


def lay_out(commit: str, into: Path) -> Path:
    """The files of `commit` laid out as the installed `evsel` namespace, under `into`."""
    source, tree = into / "source", into / "tree"
    source.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
    for target, folder in LAYOUT.items():
        shutil.copytree(source / folder, tree / target)
    return tree


def start_home(env: dict) -> int:
    """A daemon (no model) with the sample story ingested in env's EVSEL_HOME; its pid."""
    subprocess.run([*EVSEL, "daemon", "start", "--no-preload"], env=env, check=True, capture_output=True)
    sample = subprocess.run([*EVSEL, "sample"], env=env, check=True, capture_output=True, text=True).stdout.strip()
    subprocess.run([*EVSEL, "ingest", sample], env=env, check=True, capture_output=True)
    return json.loads((Path(env["EVSEL_HOME"]) / "daemon.pid").read_text())["pid"]


def _on_terminal(name: str) -> bool:
    return name.removesuffix(BEFORE) in ON_TERMINAL


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15, help="runs of each command")
    parser.add_argument("--before", metavar="COMMIT", help="also run the evsel commands of this commit")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "startup.json")
    parser.add_argument("--pin-build", action="store_true",
                        help="pin the daemons' build id (EVSEL_DAEMON_BUILD): in a checkout being edited, an "
                             "edited file changes the build id and a command restarts its daemon mid-run; "
                             "pinned, no client (before or after) walks the source files to compute it")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "bench"))
    from common import load_1m, write_result

    scratch = Path(tempfile.mkdtemp(prefix="evsel-bench-startup-"))
    os.chmod(scratch, 0o700)
    env = dict(os.environ, EVSEL_ENCODE="0", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               TERM=os.environ.get("TERM", "xterm-256color"))
    for name in ("EVSEL_NO_DAEMON", "EVSEL_DAEMON_BUILD", "PYTHONDONTWRITEBYTECODE", "PYTHONPATH"):
        env.pop(name, None)
    if args.pin_build:
        env["EVSEL_DAEMON_BUILD"] = "bench-startup"
    envs = {"": dict(env, EVSEL_HOME=str(scratch / "home"))}
    before_commit = None
    if args.before:
        before_commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", args.before], check=True,
                                       capture_output=True, text=True).stdout.strip()
        envs[BEFORE] = dict(env, EVSEL_HOME=str(scratch / "home-before"),
                            PYTHONPATH=str(lay_out(before_commit, scratch / "before")))
    commands = {name: (argv, "") for name, argv in (COMMANDS | ON_TERMINAL).items()}
    if args.before:
        commands |= {name + BEFORE: (argv, BEFORE) for name, argv in (COMMANDS | ON_TERMINAL).items()
                     if argv[:3] == EVSEL}
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    load_before = load_1m()
    costs = {}
    try:
        daemons = {}
        for which, home_env in envs.items():
            os.mkdir(home_env["EVSEL_HOME"], 0o700)
            daemons[which] = start_home(home_env)
        for name, (argv, which) in commands.items():  # warm-up: the OS file cache and bytecode, not timed
            timed(argv, envs[which], _on_terminal(name))
        names = list(commands)
        for round_ in range(args.rounds):
            shift = round_ % len(names)
            for name in names[shift:] + names[:shift]:
                argv, which = commands[name]
                runs[name].append(timed(argv, envs[which], _on_terminal(name)))
        for name, (argv, which) in commands.items():
            if (argv[:3] == EVSEL or name == BASELINE) and not _on_terminal(name):
                costs[name] = import_costs(argv, envs[which])
        # every warm run went to its home's one daemon (none restarted it)
        same_daemon = all(json.loads((Path(envs[which]["EVSEL_HOME"]) / "daemon.pid").read_text())["pid"] == pid
                          for which, pid in daemons.items())
    finally:
        for home_env in envs.values():
            subprocess.run([*EVSEL, "daemon", "stop"], env=home_env, capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)

    from evsel.evaluation.report import run_info

    base_wall = statistics.median(w for w, _ in runs[BASELINE])
    base_cpu = statistics.median(c for _, c in runs[BASELINE])
    rows = {}
    for name, samples in runs.items():
        argv, which = commands[name]
        wall, cpu = statistics.median(w for w, _ in samples), statistics.median(c for _, c in samples)
        target = TARGETS.get(name)
        rows[name] = {"argv": shlex.join("python" if a == sys.executable else a for a in argv),
                      "code": f"commit {before_commit}" if which else "this checkout",
                      "output": f"terminal ({TERMINAL_SIZE[1]}x{TERMINAL_SIZE[0]})" if _on_terminal(name) else "pipes",
                      "wall_median_s": round(wall, 4), "cpu_median_s": round(cpu, 4),
                      "wall_ratio": round(wall / base_wall, 2), "cpu_ratio": round(cpu / base_cpu, 2),
                      "target_ratio": target, "target_met": None if target is None else wall / base_wall <= target,
                      "wall_s": [round(w, 4) for w, _ in samples], "cpu_s": [round(c, 4) for _, c in samples]}
        if name in costs:
            rows[name]["imports"] = costs[name]
        shown = f"  (target <= {target:g}x)" if target else ""
        print(f"{name:50s} wall {wall * 1000:6.0f} ms = {wall / base_wall:5.2f}x   "
              f"cpu {cpu * 1000:5.0f} ms = {cpu / base_cpu:5.2f}x{shown}", flush=True)
    record = {"run": run_info(["python", "bench/startup.py", *sys.argv[1:]]), "rounds": args.rounds,
              "baseline": BASELINE, "before_commit": before_commit, "bytecode": "cached (as after pip install)",
              "load_1m_before": load_before, "load_1m_after": load_1m(),
              "daemon_build": "pinned" if args.pin_build else "from the source files",
              "same_daemon_throughout": same_daemon, "commands": rows}
    write_result(args.out, record)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
