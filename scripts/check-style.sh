#!/usr/bin/env bash
# crun's style checks, all of them, each naming its offenders (ctest's `style`):
#   scripts/format.sh --check       .clang-format, no line over 100 columns
#   scripts/check-sizes.py          no production file over 600 lines (local_agent.cc: 300), no
#                                   function over 80 lines outside its named exemptions
#   scripts/check_sizes_test.py     the size check's own scanners
#   scripts/check_layers_test.py    check-layers.sh (ctest's `layers`) fails on what it must
#   scripts/check-map.py            the README's layout and docs/architecture.md name every folder
# Every check runs; the script exits 1 if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
bad=0
bash scripts/format.sh --check || bad=1
python3 scripts/check-sizes.py || bad=1
python3 scripts/check_sizes_test.py || bad=1
python3 scripts/check_layers_test.py || bad=1
python3 scripts/check-map.py || bad=1
exit $bad
