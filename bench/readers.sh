#!/usr/bin/env bash
# docs/ANSWERS.md's reader table: the answer step with the shipped readers per kind ([short]: the
# LoRA reader for prose, the span head for dialogues, as readers.json says) beside the span head
# everywhere ([short@.../reader]) and the rules step, on BM25's evidence, one run per set, at the
# current commit. Usage: bench/readers.sh [SET...]   (sets: novels fairytaleqa hotpotqa locomo)
# READERS_STYLES (answer styles for every set) and READERS_PREFIX (results/PREFIX-<set>.json) let
# another comparison run the same sets: bench/span_decoder.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
export EVSEL_THREADS="${EVSEL_THREADS:-1}" EVSEL_NO_DAEMON=1
[ -x .venv/bin/evsel ] && export PATH="$PWD/.venv/bin:$PATH"  # the checkout's venv when there is one
out=bench/results
span_head="$PWD/$(ls -d models/adapters/*/reader | head -1)"
sets=("$@")
[ ${#sets[@]} -gt 0 ] || sets=(novels fairytaleqa hotpotqa locomo)
prefix="${READERS_PREFIX:-readers}"
for set in "${sets[@]}"; do
  styles="${READERS_STYLES:-short,short@$span_head,rules}"
  case "$set" in
    novels) for book in bench/questions/*.jsonl; do
              name=$(basename "$book" .jsonl)
              evsel eval "$book" --methods bm25 --generate --answer-style "$styles" --json --per-question \
                > "$out/$prefix-$name.json.tmp"
              mv "$out/$prefix-$name.json.tmp" "$out/$prefix-$name.json"; echo "wrote $out/$prefix-$name.json"
            done; continue ;;
    fairytaleqa) args=(fairytaleqa --split val --methods bm25 --limit 40) ;;
    hotpotqa) args=(hotpotqa --fold 2 --methods bm25 --limit 40) ;;
    locomo) args=(locomo --fold 2 --methods bm25 --limit 60); styles="${READERS_STYLES:-short,rules}" ;;  # dialogues: short is the span head
    *) echo "$(basename "$0"): unknown set $set" >&2; exit 2 ;;
  esac
  evsel eval "${args[@]}" --generate --answer-style "$styles" --json --per-question > "$out/$prefix-$set.json.tmp"
  mv "$out/$prefix-$set.json.tmp" "$out/$prefix-$set.json"
  echo "wrote $out/$prefix-$set.json"
done
