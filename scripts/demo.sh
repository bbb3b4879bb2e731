#!/usr/bin/env bash
# The main job, end to end: installs, builds, and runs `train` (CIFAR-10 on libtorch and
# crun's worker SDK, docs/train.md) on two local CPU workers under crun, on the built-in
# synthetic CIFAR-10 data: progress per epoch, test accuracy, a final summary.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh -DCRUN_BUILD_TESTS=OFF  # crun and train only: the main job needs no test
data=$(mktemp -d /tmp/crun-demo-XXXXXX)
trap 'rm -rf "$data"' EXIT
build/launcher/crun --standalone --nproc-per-node 2 build/train/train \
  --synthetic 10000 --data-dir "$data/cifar" --epochs 3 --checkpoint-dir "$data/ckpt"
echo "demo: OK"
