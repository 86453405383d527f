"""How many CPU threads torch runs the backbone with on this machine when EVSEL_THREADS does not
say: measured once, at the first load of a model on the CPU, and recorded beside its dense copy.

The measure is a short encode pass at each candidate thread count, alternated in rounds so that
each count sees the same load; the fastest median wins. On a CPU shared with other jobs, OpenMP
threads that spin at every operator's barrier can make two threads several times slower than
one (bench/throughput.py --only encode-variants, docs/RESULTS.md); on an idle machine more threads
win. The thread count changes no state (each product is computed whole by one thread: the states
are bit for bit the same, tests/test_cpu_threads.py). Delete the record to measure again."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

RECORD = "cpu_threads.json"
ROUNDS = 3


@dataclass
class ThreadChoice:
    threads: int
    tokens_per_s: dict[str, float]  # candidate thread count -> median tokens/s of the measure
    machine: str
    measured_at: str
    load_1m: float | None

    def describe(self, path: Path) -> str:
        speeds = ", ".join(f"{n} thread(s) {v:,.0f} tokens/s" for n, v in self.tokens_per_s.items())
        return f"measured at the first load on this machine ({speeds}; {path}); EVSEL_THREADS overrides"


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def candidates(cpus: int) -> list[int]:
    """One thread, half the CPUs and all of them."""
    return sorted({1, max(1, cpus // 2), cpus})


def machine_key(cpus: int) -> str:
    """What the measure holds for: the CPU model, the CPUs this process may use, torch's version."""
    import torch

    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model} | {cpus} cpus | torch {torch.__version__}"


def load_1m() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read(path: Path, key: str) -> ThreadChoice | None:
    """The recorded choice for this machine, or None (absent, damaged, or another machine's): every
    field of its own type, else the record is measured again rather than failing each model load."""
    try:
        data = json.loads(path.read_text())
        choice = ThreadChoice(**data)
    except (OSError, ValueError, TypeError, RecursionError):
        return None
    speeds = choice.tokens_per_s
    if choice.machine != key or not isinstance(choice.threads, int) or isinstance(choice.threads, bool) \
            or choice.threads < 1 or not isinstance(speeds, dict) \
            or not all(isinstance(n, str) and _number(v) for n, v in speeds.items()) \
            or not isinstance(choice.measured_at, str) or not (choice.load_1m is None or _number(choice.load_1m)):
        return None
    return choice


def measure(run_pass: Callable[[], int], counts: list[int], rounds: int = ROUNDS) -> dict[int, float]:
    """Median tokens/s of `run_pass` (one encode pass; returns its tokens) at each thread count,
    the counts alternated within each round after one warm-up pass each."""
    import torch

    times: dict[int, list[float]] = {n: [] for n in counts}
    tokens = 0
    for n in counts:
        torch.set_num_threads(n)
        tokens = run_pass()
    for _ in range(rounds):
        for n in counts:
            torch.set_num_threads(n)
            started = time.perf_counter()
            run_pass()
            times[n].append(time.perf_counter() - started)
    return {n: tokens / statistics.median(t) for n, t in times.items()}


def choose(path: Path, run_pass: Callable[[], int], cpus: int | None = None) -> ThreadChoice:
    """The recorded choice for this machine, else measured now and recorded (written atomically:
    two processes measuring at once both leave a valid record)."""
    cpus = cpus or usable_cpus()
    key = machine_key(cpus)
    recorded = read(path, key)
    if recorded is not None:
        recorded.threads = min(recorded.threads, cpus)  # never more threads than CPUs this process may use
        return recorded
    speeds = measure(run_pass, candidates(cpus))
    best = max(speeds, key=speeds.get)
    choice = ThreadChoice(threads=best, tokens_per_s={str(n): round(v, 1) for n, v in speeds.items()},
                          machine=key, measured_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"), load_1m=load_1m())
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(json.dumps(asdict(choice), indent=1))
        tmp.replace(path)
    except OSError:  # a read-only model cache: the choice holds for this process, measured again next time
        tmp.unlink(missing_ok=True)
    return choice
