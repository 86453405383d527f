#!/usr/bin/env bash
# docs/ANSWERS.md's LoRA reader table: today's answer step ([short], the shipped reader) beside the
# LoRA reader in READER ([short@READER]) on BM25's evidence, one run per set, at the current commit.
# Usage: bench/lora_reader.sh READER [SET...]   (sets: novels fairytaleqa locomo hotpotqa)
set -euo pipefail
cd "$(dirname "$0")/.."
reader="$1"; shift
export EVSEL_THREADS="${EVSEL_THREADS:-1}" EVSEL_NO_DAEMON=1
[ -x .venv/bin/evsel ] && export PATH="$PWD/.venv/bin:$PATH"  # the checkout's venv when there is one
out=bench/results
sets=("$@")
[ ${#sets[@]} -gt 0 ] || sets=(novels fairytaleqa locomo hotpotqa)
styles="short,short@$reader"
for set in "${sets[@]}"; do
  case "$set" in
    novels) for book in bench/questions/*.jsonl; do
              name=$(basename "$book" .jsonl)
              evsel eval "$book" --methods bm25 --generate --answer-style "$styles" --json --per-question \
                > "$out/lora-reader-$name.json.tmp"
              mv "$out/lora-reader-$name.json.tmp" "$out/lora-reader-$name.json"; echo "wrote $out/lora-reader-$name.json"
            done; continue ;;
    fairytaleqa) args=(fairytaleqa --split val --methods bm25 --limit 40) ;;
    hotpotqa) args=(hotpotqa --fold 2 --methods bm25 --limit 40); styles="$styles,rules" ;;
    locomo) args=(locomo --fold 2 --methods bm25 --limit 60) ;;
    *) echo "bench/lora_reader.sh: unknown set $set" >&2; exit 2 ;;
  esac
  evsel eval "${args[@]}" --generate --answer-style "$styles" --json --per-question > "$out/lora-reader-$set.json.tmp"
  mv "$out/lora-reader-$set.json.tmp" "$out/lora-reader-$set.json"
  echo "wrote $out/lora-reader-$set.json"
  styles="short,short@$reader"
done
