#!/usr/bin/env bash
# docs/ANSWERS.md's span-decoder table: the answer step with the span decoder (the frozen LLM
# generating its answer copied from the shown passages, models/reader/span_decoder.py) beside the
# shipped readers ([short]: start/end scoring) in the same run, on BM25's evidence, at the current
# commit, by bench/readers.sh's runs. Usage: bench/span_decoder.sh [SET...]
# (sets: novels fairytaleqa hotpotqa; files results/span-decoder-<set>.json)
set -euo pipefail
cd "$(dirname "$0")/.."
decoder="$PWD/$(ls -d models/adapters/*/span-decoder | head -1)"
[ $# -gt 0 ] || set -- novels fairytaleqa hotpotqa
READERS_STYLES="short,short@$decoder" READERS_PREFIX=span-decoder exec bench/readers.sh "$@"
