#!/usr/bin/env bash
# Configures and builds crun into ./build (Ninja, two jobs: the machines have two cores).
# Extra arguments go to the CMake configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCRUN_WERROR=ON "$@"
cmake --build build -j2
