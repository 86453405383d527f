"""Evaluation output: a rich table, a recall@k plot, and where/how a run was made."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table


def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _ms(latency: dict, stage: str) -> str:
    entry = latency.get(stage)
    if not entry:
        return "-"
    return f"{entry['median'] * 1000:.0f} / {entry['p95'] * 1000:.0f}"


def headline_k(ks: list[int]) -> int:
    return 5 if 5 in ks else ks[len(ks) // 2]


@dataclass(frozen=True)
class _Columns:
    """Which of the headline table's optional columns a result has."""

    ranked: bool  # recall columns (NoCha has no gold evidence)
    generate: bool  # answer columns
    locomo: bool
    claims: bool
    abstains: bool
    graded: bool  # abstention precision/recall (the dataset marks unanswerable questions)

    @classmethod
    def of(cls, result: dict) -> "_Columns":
        ks, methods = result["config"]["k"], result["methods"].values()
        generate = result["config"]["generate"]
        return cls(
            ranked=any(m.get(f"recall@{ks[0]}") is not None for m in methods),
            generate=generate,
            locomo=generate and any("locomo_f1" in m for m in methods),
            claims=generate and any("pair_accuracy" in m for m in methods),
            abstains=generate and any("abstention" in m for m in methods),
            graded=generate and any((m.get("abstention") or {}).get("unanswerable") for m in methods),
        )


def _headline_table(result: dict, cols: _Columns) -> Table:
    ks = result["config"]["k"]
    hk = headline_k(ks)
    data = result["dataset"]
    separate = data.get("separate_groups") or []
    caption = (f"{data['questions']} questions ({data['questions_with_gold']} with gold), "
               f"{data['documents']} documents, {data['chunks']} chunks of ~{data['chunk_tokens_mean']:.0f} tokens"
               + (f"; headline excludes {', '.join(separate)}" if separate else ""))
    table = Table(title=f"evsel eval {data['name']}", caption=caption)
    names = ["method"]
    if cols.ranked:
        names += [f"R@{k}" for k in ks] + [f"all@{hk}", "MRR"]
    if cols.generate:
        names += ["EM", "F1", "contained"]
        names += ["LoCoMo F1"] * cols.locomo + ["claim acc", "pair acc"] * cols.claims
        names += ["abstain"] * cols.abstains + ["abstain P/R"] * cols.graded + ["prompt tok"]
    names += ["select ms med/p95"] + ["generate ms med/p95"] * cols.generate + ["index s"]
    for name in names:
        table.add_column(name, **({} if name == "method" else {"justify": "right"}))
    for spec, m in result["methods"].items():
        table.add_row(*_headline_row(spec, m, cols, ks, hk))
    return table


def _headline_row(spec: str, m: dict, cols: _Columns, ks: list[int], hk: int) -> list[str]:
    row = [spec]
    if cols.ranked:
        row += [_fmt(m.get(f"recall@{k}")) for k in ks] + [_fmt(m.get(f"complete@{hk}")), _fmt(m.get("mrr"))]
    if cols.generate:
        row += [_fmt(m.get("em")), _fmt(m.get("f1")), _fmt(m.get("contained"))]
        if cols.locomo:
            row.append(_fmt(m.get("locomo_f1")))
        if cols.claims:
            row += [_fmt(m.get("correct")), _fmt(m.get("pair_accuracy"))]
        abstention = m.get("abstention") or {}
        if cols.abstains:
            row.append(_fmt(abstention.get("rate")))
        if cols.graded:
            row.append(f"{_fmt(abstention.get('precision'))} / {_fmt(abstention.get('recall'))}")
        tokens = m.get("prompt_tokens")
        note = f" ({m['not_fitting']} too long)" if m.get("not_fitting") else ""
        row.append((f"{tokens:.0f}" if tokens is not None else "-") + note)
    row.append(_ms(m["latency"], "select_s"))
    if cols.generate:
        row.append(_ms(m["latency"], "generate_s"))
    row.append(f"{m['index_s']:.1f}")
    return row


def _answer_type_table(methods: dict) -> Table | None:
    """The answer step by what each question asks for (person, place, ...)."""
    kinds = sorted({t for m in methods.values() for t in m.get("answer_types", {})})
    if not kinds:
        return None
    table = Table(title="answers by type: EM / F1 / contained (questions)")
    table.add_column("method")
    for t in kinds:
        n = max(m.get("answer_types", {}).get(t, {}).get("questions", 0) for m in methods.values())
        table.add_column(f"{t} ({n})", justify="right")
    for spec, m in methods.items():
        cells = []
        for t in kinds:
            v = m.get("answer_types", {}).get(t)
            cells.append("-" if not v else f"{_fmt(v.get('em'), 2)} / {_fmt(v.get('f1'), 2)} / {_fmt(v.get('contained'), 2)}")
        table.add_row(spec, *cells)
    return table


def _group_table(methods: dict, hk: int) -> Table | None:
    """recall@hk per group, where the dataset has more than one group with gold."""
    groups = sorted({g for m in methods.values() for g, v in m["groups"].items() if v.get("with_gold")})
    if len(groups) < 2:
        return None
    table = Table(title=f"recall@{hk} by group (questions with gold)")
    table.add_column("method")
    for g in groups:
        n = next(m["groups"][g]["with_gold"] for m in methods.values() if g in m["groups"])
        table.add_column(f"{g} ({n})", justify="right")
    for spec, m in methods.items():
        table.add_row(spec, *[_fmt(m["groups"].get(g, {}).get(f"recall@{hk}")) for g in groups])
    return table


def tables(result: dict) -> list[Table]:
    """The headline table (one row per method), answers by type (with --generate) and a per-group
    recall table."""
    cols = _Columns.of(result)
    methods = result["methods"]
    by_type = _answer_type_table(methods) if cols.generate else None
    by_group = _group_table(methods, headline_k(result["config"]["k"]))
    return [t for t in (_headline_table(result, cols), by_type, by_group) if t is not None]


def plot(result: dict, path: Path) -> bool:
    """recall@k against k, one line per ranking method. False (no file) when no method has recall."""
    ks = result["config"]["k"]
    if not any(all(m.get(f"recall@{k}") is not None for k in ks) for m in result["methods"].values()):
        return False
    import matplotlib

    matplotlib.use("Agg")  # no display: write the file only
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for spec, m in result["methods"].items():
        values = [m.get(f"recall@{k}") for k in ks]
        if all(v is not None for v in values):
            ax.plot(ks, values, marker="o", label=spec)
    data = result["dataset"]
    counted = max((m.get("with_gold", 0) for m in result["methods"].values()), default=0)
    apart = f", {'/'.join(data['separate_groups'])} apart" if data.get("separate_groups") else ""
    ax.set_title(f"{data['name']}: evidence recall@k ({counted} questions{apart})")
    ax.set_xlabel("k (chunks selected)")
    ax.set_ylabel("recall@k")
    ax.set_xticks(ks)
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)  # into a folder that exists: the command checked it before the run
    plt.close(fig)
    return True


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit() -> str | None:
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
                                capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit or None


def run_info(argv: list[str] | None = None) -> dict:
    """Machine, commit, command (with the EVSEL_ settings that chose its model and adapters) and
    time of a run, for RESULTS.md."""
    import shlex

    import torch

    from evsel.settings import RUN_VARIABLES, variables_named

    env = [f"{k}={shlex.quote(v)}" for k, v in variables_named(RUN_VARIABLES).items()]
    return {
        "command": " ".join(env + list(argv if argv is not None else sys.argv)),
        "commit": git_commit(),
        "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "cpu": _cpu_model(),
            "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "platform": platform.platform(terse=True),
        },
    }
