#!/usr/bin/env bash
# The main job, end to end: installs, builds, and runs a stock PyTorch DDP program (gloo,
# env://, DistributedSampler; Debian's PyTorch 1.13) on two local workers under crun, the way
# a user replaces `torchrun --standalone --nproc-per-node 2 ...`. (The C++ CIFAR-10 `train`
# program becomes the main job with issue 6.)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
PYTHON_EXEC=/usr/bin/python3 build/launcher/crun --standalone --nproc-per-node 2 \
  tests/workers/ddp_train.py
echo "demo: OK"
