#!/usr/bin/env bash
# docs/ANSWERS.md's span-decoder table: the answer step with the span decoder (the frozen LLM
# generating its answer copied from the shown passages, models/reader/span_decoder.py) beside the
# shipped readers ([short]: start/end scoring) in the same run, on BM25's evidence, at the current
# commit. Usage: bench/span_decoder.sh [SET...]   (sets: novels fairytaleqa hotpotqa)
set -euo pipefail
cd "$(dirname "$0")/.."
export EVSEL_THREADS="${EVSEL_THREADS:-1}" EVSEL_NO_DAEMON=1
[ -x .venv/bin/evsel ] && export PATH="$PWD/.venv/bin:$PATH"
out=bench/results
decoder="$PWD/$(ls -d models/adapters/*/span-decoder | head -1)"
styles="short,short@$decoder"
sets=("$@")
[ ${#sets[@]} -gt 0 ] || sets=(novels fairytaleqa hotpotqa)
for set in "${sets[@]}"; do
  case "$set" in
    novels) for book in bench/questions/*.jsonl; do
              name=$(basename "$book" .jsonl)
              evsel eval "$book" --methods bm25 --generate --answer-style "$styles" --json --per-question \
                > "$out/span-decoder-$name.json.tmp"
              mv "$out/span-decoder-$name.json.tmp" "$out/span-decoder-$name.json"; echo "wrote $out/span-decoder-$name.json"
            done; continue ;;
    fairytaleqa) args=(fairytaleqa --split val --methods bm25 --limit 40) ;;
    hotpotqa) args=(hotpotqa --fold 2 --methods bm25 --limit 40) ;;
    *) echo "bench/span_decoder.sh: unknown set $set" >&2; exit 2 ;;
  esac
  evsel eval "${args[@]}" --generate --answer-style "$styles" --json --per-question > "$out/span-decoder-$set.json.tmp"
  mv "$out/span-decoder-$set.json.tmp" "$out/span-decoder-$set.json"
  echo "wrote $out/span-decoder-$set.json"
done
