#!/bin/sh
# Writes this worker's whole environment to $1/env_$RANK.env, NUL-separated as `env -0` prints
# it, then renames it into place: a reader never sees half a file.
set -eu
env -0 >"$1/env_$RANK.tmp"
mv "$1/env_$RANK.tmp" "$1/env_$RANK.env"
