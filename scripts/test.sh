#!/usr/bin/env bash
# Installs everything, builds, and runs every test (unit, integration, PyTorch 1.13 and 2.x
# compatibility). Ends with ctest's summary line; fails when a test fails or none ran.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
TORCH2_PYTHON="$(bash scripts/setup-torch2.sh)"
# TensorFlow, JAX, DeepSpeed and Horovod for --contract's suites: tf=..., jax=..., ...
frameworks=$(bash scripts/setup-frameworks.sh)
declare -A FRAMEWORK
while IFS== read -r name py; do FRAMEWORK[$name]=$py; done <<< "$frameworks"
bash scripts/build.sh -DCRUN_BUILD_TESTS=ON -DCRUN_TORCH2_PYTHON="$TORCH2_PYTHON" \
  -DCRUN_TF_PYTHON="${FRAMEWORK[tf]}" -DCRUN_JAX_PYTHON="${FRAMEWORK[jax]}" \
  -DCRUN_DEEPSPEED_PYTHON="${FRAMEWORK[deepspeed]}" -DCRUN_HOROVOD_PYTHON="${FRAMEWORK[horovod]}"
ctest --test-dir build --output-on-failure --no-tests=error -j2
