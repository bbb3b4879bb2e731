#!/usr/bin/env bash
# Exploration, by hand or in a job of its own (ctest only replays the corpus: replay.sh): runs
# one libFuzzer target for a bounded time over a copy of its seed corpus (the repo's copy stays
# as it is). A crash, leak, sanitizer report or disagreement fails it; the input that did is
# kept under the work directory and named in the output; add it to the corpus once fixed.
#   explore.sh TARGET CORPUS_DIR SECONDS
#   e.g. tests/fuzz/explore.sh build/tests/fuzz/store_parser_fuzz tests/fuzz/corpus/store_parser_fuzz 600
set -euo pipefail
target=$1 corpus=$2 seconds=$3
work=$(mktemp -d "${TMPDIR:-/tmp}/crun-fuzz-XXXXXX")
mkdir -p "$work/corpus"
cp -r "$corpus"/. "$work/corpus/"
if "$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$work/" "$work/corpus" > "$work/log" 2>&1; then
  grep -E "^(stat::number_of_executed_units|Done)" "$work/log" || true
  rm -rf "$work"
else
  tail -60 "$work/log"
  echo "fuzzer failed; inputs and log kept in $work" >&2
  exit 1
fi
