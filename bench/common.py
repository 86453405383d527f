"""Helpers shared by the benchmark scripts."""

from __future__ import annotations

import json
import os
import resource
from pathlib import Path


def data_dir() -> Path:
    """$EVSEL_DATA, else ../shared/data beside the checkout (as `evsel eval` finds it)."""
    from evsel.evaluation.datasets import default_data_dir

    return default_data_dir()


def load_1m() -> float:
    """The 1-minute load average (nan where the platform has none), recorded beside timings."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def write_result(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(result, indent=1, default=str) + "\n")
    tmp.replace(path)


def wait_until_preloaded(read_status, limit_s: float = 600) -> None:
    """Wait until the started daemon has loaded the model (`read_status()`: `evsel daemon status --json`)."""
    import time

    deadline = time.monotonic() + limit_s
    while read_status()["preload"] != "done":
        if time.monotonic() > deadline:
            raise SystemExit(f"the daemon did not load the model within {limit_s / 60:.0f} minutes")
        time.sleep(0.5)
