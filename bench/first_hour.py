"""The first hour of a new user: ingest a whole novel through a fresh daemon, ask at once with the
default, then ask again every --interval seconds while the background encode runs, each default
ask beside a BM25 ask of the same question in the same run; then, with --warm, once the encode has
finished. Prints a table (ratios to BM25's whole-process time) and writes JSON.

    python bench/first_hour.py --questions bench/questions/anne.jsonl --out bench/results/first-hour.json
    python bench/first_hour.py --locomo conv-26 --warm 5 --out bench/results/first-hour-chat.json

Each ask is a whole `evsel ask --json` process through the daemon, as a user's shell runs it.
"Shown" is whether the five passages shown hold the question's evidence passage (the file's
"evidence" strings), so the default's evidence is compared with BM25's at every point of the
encode. The daemon's load (its model, one thread unless EVSEL_THREADS says) is what a user has.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def evsel(args: list[str], env: dict) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "evsel", *args], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"evsel {' '.join(args[:2])} failed: {result.stderr.strip()}")
    return time.perf_counter() - started, result


def encode_progress(env: dict) -> list | None:
    """[done, total, label] of the running background job, or None when none is left."""
    status = json.loads(evsel(["daemon", "status", "--json"], env)[1].stdout)
    background = status["queue"]["background"]
    if not background:
        return None
    progress = background[0].get("progress") or {}
    return [progress.get("done"), progress.get("total"), progress.get("label")]


def shown(reply: dict, evidence: list[str]) -> bool:
    return any(e in item["text"] for item in reply["evidence"] for e in evidence)


def ask(env: dict, question: dict, select: str | None) -> dict:
    extra = ["--select", select] if select else []
    seconds, result = evsel(["ask", question["question"], "--json", *extra], env)
    reply = json.loads(result.stdout)
    return {"wall_s": round(seconds, 3), "method": reply["method"]["select"],
            "signals": reply["method"].get("signals"), "shown": shown(reply, question["evidence"]),
            "answer": reply["answer"], "timings": reply["timings"]}


def pair(env: dict, question: dict, label: str, versus: list[str] = ()) -> dict:
    """The default ask, then BM25's, of one question (and each of `versus`'s); the encode's
    progress before and after."""
    before = encode_progress(env)
    default = ask(env, question, None)
    bm25 = ask(env, question, "bm25")
    row = {"when": label, "question": question["question"], "encode_before": before,
           "encode_after": encode_progress(env), "default": default, "bm25": bm25,
           "ratio": round(default["wall_s"] / bm25["wall_s"], 2)}
    for method in versus:
        other = ask(env, question, method)
        row.setdefault("versus", {})[method] = dict(other, ratio=round(other["wall_s"] / bm25["wall_s"], 2))
    ran = "+".join((default["signals"] or {}).get("ran", [])) or default["method"]
    print(f"{label:14s} default {default['wall_s']:7.2f}s  bm25 {bm25['wall_s']:6.2f}s  ratio {row['ratio']:6.2f}  "
          f"shown {int(default['shown'])}/{int(bm25['shown'])}  ran {ran}  encode {row['encode_after']}", flush=True)
    return row


def locomo_conversation(name: str, folder: Path) -> tuple[Path, list[dict]]:
    """One conversation of LoCoMo as its own file, and its answerable questions with their
    evidence turns' text (what a shown passage must hold)."""
    from common import data_dir

    conversations = json.loads((data_dir() / "locomo" / "locomo10.json").read_text())
    conversation = next(c for c in conversations if c["sample_id"] == name)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(conversation))
    turns = {t["dia_id"]: t["text"] for key, session in conversation["conversation"].items()
             if key.startswith("session_") and isinstance(session, list) for t in session}
    questions = [{"question": qa["question"], "evidence": [turns[e] for e in qa["evidence"] if e in turns]}
                 for qa in conversation["qa"] if qa.get("category") != 5 and qa.get("evidence")]
    return path, [q for q in questions if q["evidence"]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=Path, default=ROOT / "bench" / "questions" / "anne.jsonl",
                        help="an evsel eval question file on one book (question, document, evidence)")
    parser.add_argument("--locomo", metavar="CONV",
                        help="instead: one LoCoMo conversation (e.g. conv-26) cut out of ../shared/data, as the "
                             "README does, asked its own questions (a chat's default)")
    parser.add_argument("--asks", type=int, default=5, help="asks while the background encode runs")
    parser.add_argument("--interval", type=float, default=15.0, help="seconds between those asks")
    parser.add_argument("--warm", type=int, default=0,
                        help="then wait for the encode to finish (up to --wait-s) and ask this many more")
    parser.add_argument("--wait-s", type=float, default=3600.0)
    parser.add_argument("--versus", default="", help="with --warm: other methods asked beside (comma-separated), "
                                                     "each as a ratio to the same BM25 ask")
    parser.add_argument("--home", type=Path, help="a fresh EVSEL_HOME to use (default: a temporary one)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "first-hour.json")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "bench"))
    from common import load_1m, wait_until_preloaded, write_result

    from evsel.evaluation.report import run_info

    home = args.home or Path(tempfile.mkdtemp(prefix="evsel-first-hour-"))
    home.mkdir(parents=True, exist_ok=True)
    os.chmod(home, 0o700)
    if args.locomo:
        book, questions = locomo_conversation(args.locomo, home)
    else:
        questions = [json.loads(line) for line in args.questions.read_text().splitlines() if line.strip()]
        book = (args.questions.parent / questions[0]["document"]).resolve()
    env = dict(os.environ, EVSEL_HOME=str(home))
    evsel(["daemon", "start"], env)
    record = {"run": run_info(), "book": book.name, "questions_file": str(args.questions), "load_1m_start": load_1m(),
              "rows": []}
    try:
        wait_until_preloaded(lambda: json.loads(evsel(["daemon", "status", "--json"], env)[1].stdout))
        seconds, result = evsel(["ingest", str(book)], env)
        record["ingest_s"] = round(seconds, 2)
        print(f"ingested {book.name} in {seconds:.1f}s: {result.stdout.strip() or result.stderr.strip()[-200:]}",
              flush=True)
        record["rows"].append(pair(env, questions[0], "first ask"))
        for number, question in enumerate(questions[1:args.asks + 1], 1):
            time.sleep(args.interval)
            record["rows"].append(pair(env, question, f"encoding #{number}"))
        if args.warm:
            deadline = time.monotonic() + args.wait_s
            while encode_progress(env) is not None and time.monotonic() < deadline:
                time.sleep(5)
            record["encode_done_s"] = round(time.monotonic() - (deadline - args.wait_s), 1)
            rest = questions[args.asks + 1:] or questions
            for number, question in enumerate(rest[: args.warm], 1):
                record["rows"].append(pair(env, question, f"warm #{number}", [m for m in args.versus.split(",") if m]))
    finally:
        evsel(["daemon", "stop"], env)
        record["load_1m_end"] = load_1m()
        if args.home is None:
            shutil.rmtree(home, ignore_errors=True)
    for when in ("first ask", "encoding", "warm"):
        rows = [r for r in record["rows"] if r["when"].startswith(when)]
        if rows:
            record[when.replace(" ", "_") + "_worst_ratio"] = max(r["ratio"] for r in rows)
            record[when.replace(" ", "_") + "_shown"] = [sum(r[m]["shown"] for r in rows) for m in ("default", "bm25")]
            ratios = sorted(r["ratio"] for r in rows)
            record[when.replace(" ", "_") + "_median_ratio"] = ratios[len(ratios) // 2]
    for method in [m for m in args.versus.split(",") if m]:
        ratios = sorted(r["versus"][method]["ratio"] for r in record["rows"] if method in r.get("versus", {}))
        if ratios:
            record.setdefault("versus_median_ratio", {})[method] = ratios[len(ratios) // 2]
    write_result(args.out, record)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
