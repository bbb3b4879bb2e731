#!/usr/bin/env bash
# What ctest runs for a fuzz target: every input of its corpus once, in a fixed order (the
# seeds and the regression inputs of bugs found so far), so the result is the same on every
# run. A crash, leak, sanitizer report or disagreement fails it. Exploration for new inputs is
# explore.sh's job.
#   replay.sh TARGET CORPUS_DIR
set -euo pipefail
target=$1 corpus=$2
mapfile -t inputs < <(find "$corpus" -type f | LC_ALL=C sort)
if [ "${#inputs[@]}" -eq 0 ]; then
  echo "replay.sh: no inputs in $corpus" >&2
  exit 1
fi
log=$(mktemp "${TMPDIR:-/tmp}/crun-fuzz-replay-XXXXXX")
if "$target" -timeout=10 -rss_limit_mb=2048 "${inputs[@]}" > "$log" 2>&1; then
  echo "replayed ${#inputs[@]} inputs of $corpus: $(grep -c '^Executed ' "$log") executed, no finding"
  rm -f "$log"
else
  tail -60 "$log"
  echo "replay of $corpus failed; log kept in $log" >&2
  exit 1
fi
