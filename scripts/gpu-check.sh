#!/usr/bin/env bash
# The worker SDK's GPU checks, for a GPU machine that has a compiler, CMake, the CUDA toolkit and
# PyTorch (with its NCCL) but none of crun's other dependencies (docs/worker_sdk.md).
#
#   scripts/gpu-check.sh prepare   here: put the header-only Catch2 the tests need into .gpu/
#   scripts/gpu-check.sh run OUT   there: SDK-only build with NCCL; the SDK's unit tests
#                                  (nccl_unit_tests runs every collective on the GPU); the
#                                  allreduce/allgather benchmark against PyTorch's
#                                  ProcessGroupNCCL, launched by torchrun. Writes OUT/ctest.log
#                                  and OUT/benchmarks.md (docs/benchmarks.md with its
#                                  nccl-bench section filled in).
#   scripts/gpu-check.sh train OUT there, after run: train (ResNet-18, synthetic CIFAR-10) on
#                                  the GPU at fp32, bf16 and fp16; OUT/train_*.json.
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
  prepare)
    rm -rf .gpu/catch2 && mkdir -p .gpu/catch2/include .gpu/catch2/lib/cmake
    cp -r /usr/include/catch2 .gpu/catch2/include/
    cp -r /usr/lib/cmake/Catch2 .gpu/catch2/lib/cmake/
    cp /usr/lib/libCatch2WithMain.a .gpu/catch2/lib/
    echo "prepared .gpu/ (carry it with the run)"
    ;;
  run)
    out=${2:?usage: gpu-check.sh run OUT}
    py=${PYTHON:-python3}
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    # NCCL: the toolkit's if it has one, else the one PyTorch ships (the nvidia-nccl wheel).
    nccl_root=${NCCL_ROOT:-}
    if [[ -z "$nccl_root" ]]; then
      hdr=$(find /usr/local/cuda/include "$($py -c 'import site; print(site.getsitepackages()[0])')/nvidia" \
              -name nccl.h 2>/dev/null | head -1)
      [[ -n "$hdr" ]] || { echo "gpu-check: nccl.h not found; set NCCL_ROOT" >&2; exit 1; }
      nccl_root=$(dirname "$(dirname "$hdr")")
    fi
    if [[ ! -e "$nccl_root/lib/libnccl.so" && -e "$nccl_root/lib/libnccl.so.2" ]]; then
      ln -sf libnccl.so.2 "$nccl_root/lib/libnccl.so"
    fi
    echo "gpu-check: NCCL from $nccl_root"
    cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCRUN_WERROR=ON \
      -DCRUN_WORKER_SDK_ONLY=ON -DCRUN_WITH_GLOO=OFF -DCRUN_WITH_TORCH=OFF -DCRUN_WITH_NCCL=ON \
      -DNCCL_ROOT="$nccl_root" -DCMAKE_PREFIX_PATH="$PWD/.gpu/catch2" \
      -DCMAKE_POLICY_VERSION_MINIMUM=3.5
    cmake --build build-gpu -j "$(nproc)"
    export LD_LIBRARY_PATH="$nccl_root/lib:${LD_LIBRARY_PATH:-}"
    mkdir -p "$out"
    (cd build-gpu && ctest --output-on-failure -j 1) 2>&1 | tee "$out/ctest.log" || echo "gpu-check: ctest failed" >&2
    cp docs/benchmarks.md "$out/benchmarks.md"
    PYTHONUNBUFFERED=1 $py tests/bench/nccl_bench.py --bench build-gpu/tests/nccl_allreduce \
      --torchrun "$py" --out "$out/benchmarks.md" --json-dir "$out"
    ;;
  train)
    # train on the GPU: libtorch from the PyTorch package, NCCL from run's build. ResNet-18
    # on synthetic CIFAR-10 at fp32, bf16 and fp16 autocast (channels-last), launched by
    # torchrun: OUT/train_*.json hold the metrics, OUT/train.log the output.
    out=${2:?usage: gpu-check.sh train OUT}
    py=${PYTHON:-python3}
    torch_cmake=$($py -c 'import torch; print(torch.utils.cmake_prefix_path)')
    cmake -S . -B build-gpu -DCRUN_WITH_TORCH=ON -DCMAKE_PREFIX_PATH="$PWD/.gpu/catch2;$torch_cmake" \
      -DCMAKE_POLICY_VERSION_MINIMUM=3.5 > "$out/train-configure.log" 2>&1 ||
      { tail -40 "$out/train-configure.log"; exit 1; }
    cmake --build build-gpu -j "$(nproc)" --target train
    mkdir -p "$out"
    for mode in "fp32:--amp off" "bf16:--amp bf16 --channels-last" "fp16:--amp fp16 --channels-last"; do
      name=${mode%%:*}
      # shellcheck disable=SC2086
      PYTHONUNBUFFERED=1 $py -m torch.distributed.run --standalone --nproc-per-node 1 --no-python \
        build-gpu/train/train --model resnet18 --synthetic 50000 --epochs 2 --batch-size 256 \
        --device cuda --log-every 50 ${mode#*:} --metrics-json "$out/train_$name.json" 2>&1 |
        tee -a "$out/train.log"
    done
    ;;
  *)
    echo "usage: $0 prepare | run OUT | train OUT" >&2
    exit 2
    ;;
esac
