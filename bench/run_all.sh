#!/usr/bin/env bash
# Every run behind docs/RESULTS.md, in order, then RESULTS.md itself. Each step writes its JSON
# (and plot) under bench/results/. On 2 shared cores the whole set takes about an hour and a half;
# pass step names to run only some: bench/run_all.sh fairytaleqa throughput
set -euo pipefail
cd "$(dirname "$0")/.."
R=bench/results
mkdir -p "$R"
BASE=bm25,dense,random
UNREAL=bm25,dense,intrinsic,unreal,rrf:unreal
# One thread per process: the cores are shared with other jobs, and OpenMP threads that spin-wait
# on an oversubscribed CPU run a small query 10x slower than one thread does (measured here).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

eval_run() {  # eval_run NAME ARGS...: evsel eval ARGS --json --plot, into $R/eval-NAME.json
    local name=$1; shift
    nice evsel eval "$@" --json --plot "$R/eval-$name.png" > "$R/eval-$name.json.tmp"
    mv "$R/eval-$name.json.tmp" "$R/eval-$name.json"
}

step() {
    case $1 in
        locomo) eval_run locomo locomo --methods $BASE,rrf:dense ;;
        fairytaleqa) eval_run fairytaleqa fairytaleqa --split val --methods $BASE,rrf:dense ;;
        locomo-unreal) eval_run locomo-unreal locomo --methods $UNREAL ;;
        fairytaleqa-unreal) eval_run fairytaleqa-unreal fairytaleqa --split val --methods $UNREAL ;;
        unreal) nice python bench/unreal.py ;;  # a fresh state cache, so every cold ask is cold
        unreal-layers) nice python bench/unreal_layers.py ;;
        throughput) nice python bench/throughput.py --max-gib 8 ;;  # 10^6 MaxSim chunks need 7.5 GiB
        daemon) python bench/daemon.py ;;  # not nice: it times whole processes as a user sees them
        startup) python bench/startup.py ;;  # whole processes too
        ingest) python bench/ingest.py --inline ;;  # whole processes too
        scaling) nice python bench/scaling.py --questions 20 --methods $BASE ;;
        musique) eval_run musique musique --methods $BASE ;;
        hotpotqa) eval_run hotpotqa hotpotqa --methods $BASE ;;
        mmlongbench) eval_run mmlongbench mmlongbench --methods $BASE ;;
        financebench) eval_run financebench financebench --methods $BASE ;;
        fairytaleqa-concat23) eval_run fairytaleqa-concat23 fairytaleqa --split val --concat 23 --methods $BASE ;;
        nocha) eval_run nocha nocha --methods $BASE --generate --max-new-tokens 8 ;;
        locomo-generate) eval_run locomo-generate locomo --methods $BASE,full --generate --limit 100 ;;
        fairytaleqa-generate) eval_run fairytaleqa-generate fairytaleqa --split val --methods $BASE,full --generate --limit 100 ;;
        *) echo "unknown step $1" >&2; exit 2 ;;
    esac
}

STEPS=(locomo fairytaleqa locomo-unreal fairytaleqa-unreal unreal throughput daemon startup ingest scaling musique hotpotqa mmlongbench financebench fairytaleqa-concat23 nocha
       locomo-generate fairytaleqa-generate)
for s in "${@:-${STEPS[@]}}"; do
    echo "== $s ($(date -u +%H:%M:%S))" >&2
    step "$s"
done
python bench/make_results.py
