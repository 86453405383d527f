#!/usr/bin/env bash
# docs/ANSWERS.md's reader table: the answer step with the shipped readers per kind ([short]: the
# LoRA reader for prose, the span head for dialogues, as readers.json says) beside the span head
# everywhere ([short@.../reader]) and the rules step, on BM25's evidence, one run per set, at the
# current commit. Usage: bench/readers.sh [SET...]   (sets: novels fairytaleqa hotpotqa locomo)
set -euo pipefail
cd "$(dirname "$0")/.."
export EVSEL_THREADS="${EVSEL_THREADS:-1}" EVSEL_NO_DAEMON=1
[ -x .venv/bin/evsel ] && export PATH="$PWD/.venv/bin:$PATH"  # the checkout's venv when there is one
out=bench/results
span_head="$PWD/$(ls -d models/adapters/*/reader | head -1)"
sets=("$@")
[ ${#sets[@]} -gt 0 ] || sets=(novels fairytaleqa hotpotqa locomo)
for set in "${sets[@]}"; do
  styles="short,short@$span_head,rules"
  case "$set" in
    novels) for book in bench/questions/*.jsonl; do
              name=$(basename "$book" .jsonl)
              evsel eval "$book" --methods bm25 --generate --answer-style "$styles" --json --per-question \
                > "$out/readers-$name.json.tmp"
              mv "$out/readers-$name.json.tmp" "$out/readers-$name.json"; echo "wrote $out/readers-$name.json"
            done; continue ;;
    fairytaleqa) args=(fairytaleqa --split val --methods bm25 --limit 40) ;;
    hotpotqa) args=(hotpotqa --fold 2 --methods bm25 --limit 40) ;;
    locomo) args=(locomo --fold 2 --methods bm25 --limit 60); styles="short,rules" ;;  # dialogues: short is the span head
    *) echo "bench/readers.sh: unknown set $set" >&2; exit 2 ;;
  esac
  evsel eval "${args[@]}" --generate --answer-style "$styles" --json --per-question > "$out/readers-$set.json.tmp"
  mv "$out/readers-$set.json.tmp" "$out/readers-$set.json"
  echo "wrote $out/readers-$set.json"
done
