#!/usr/bin/env bash
# docs/ANSWERS.md's table: the answer step on each set, the reader ([short]) beside the rules step
# and random/oracle evidence in the same run, one run per set, at the current commit.
# Usage: bench/answers.sh [SET...]   (sets: sherlock gatsby fairytaleqa hotpotqa locomo musique)
set -euo pipefail
cd "$(dirname "$0")/.."
export EVSEL_THREADS="${EVSEL_THREADS:-1}" EVSEL_NO_DAEMON=1
out=bench/results
sets=("$@")
[ ${#sets[@]} -gt 0 ] || sets=(sherlock gatsby fairytaleqa hotpotqa locomo musique)
for set in "${sets[@]}"; do
  case "$set" in
    sherlock|gatsby) args=(bench/questions/$set.jsonl --methods bm25,oracle) ;;
    fairytaleqa) args=(fairytaleqa --split val --methods bm25,random,oracle --limit 40) ;;
    hotpotqa|musique) args=($set --fold 2 --methods bm25,random,oracle --limit 40) ;;
    locomo) args=(locomo --fold 2 --methods bm25,random,oracle --limit 60) ;;
    *) echo "bench/answers.sh: unknown set $set" >&2; exit 2 ;;
  esac
  evsel eval "${args[@]}" --generate --answer-style short,rules --json --per-question > "$out/answers-reader-$set.json.tmp"
  mv "$out/answers-reader-$set.json.tmp" "$out/answers-reader-$set.json"
  echo "wrote $out/answers-reader-$set.json"
done
