#!/bin/sh
# A worker that writes $1 numbered lines of about 100 bytes to its stderr as fast as it can
# ("rank R line 000042 xxx..."), then, given a file $2, waits for it to exist (at most 600 s),
# then exits 0 (tests/integration/test_output_stall.py).
set -eu
pad=$(printf '%080d' 0 | tr 0 x)
seq -f "rank $RANK line %06g $pad" 0 $(($1 - 1)) >&2
if [ $# -ge 2 ]; then
  i=0
  while [ ! -e "$2" ] && [ $i -lt 12000 ]; do sleep 0.05; i=$((i + 1)); done
fi
