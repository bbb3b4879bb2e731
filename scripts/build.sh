#!/usr/bin/env bash
# Configures and builds crun into ./build, or $CRUN_BUILD_DIR (Ninja, two jobs: the machines
# have two cores). Extra arguments go to the CMake configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
# The worker SDK's NCCL backend builds wherever the CUDA toolkit with NCCL is installed (it
# needs no GPU to compile and link). CRUN_WITH_NCCL=ON|OFF overrides the detection.
nccl="${CRUN_WITH_NCCL:-}"
if [ -z "$nccl" ]; then
  if command -v nvcc >/dev/null 2>&1 || [ -e /usr/local/cuda/include/nccl.h ]; then
    nccl=ON
  else
    nccl=OFF
    echo "build.sh: no CUDA toolkit found: building without the NCCL backend" >&2
  fi
fi
dir="${CRUN_BUILD_DIR:-build}"
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCRUN_WERROR=ON \
  -DCRUN_WITH_NCCL="$nccl" "$@"
# CRUN_BUILD_TARGETS="a b": only those targets (and what they need), not everything.
targets=()
for t in ${CRUN_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$dir" -j2 "${targets[@]}"
