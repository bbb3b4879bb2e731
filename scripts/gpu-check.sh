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
  run | train)
    mode=$1
    out=${2:?usage: gpu-check.sh $1 OUT}
    mkdir -p "$out"
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
    export LD_LIBRARY_PATH="$nccl_root/lib:${LD_LIBRARY_PATH:-}"
    prefix="$PWD/.gpu/catch2"
    with_torch=OFF
    if [[ $mode == train ]]; then
      # libtorch from the PyTorch package.
      prefix="$prefix;$($py -c 'import torch; print(torch.utils.cmake_prefix_path)')"
      with_torch=ON
    fi
    cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCRUN_WERROR=ON \
      -DCRUN_WORKER_SDK_ONLY=ON -DCRUN_WITH_GLOO=OFF -DCRUN_WITH_TORCH=$with_torch \
      -DCRUN_WITH_NCCL=ON -DNCCL_ROOT="$nccl_root" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_POLICY_VERSION_MINIMUM=3.5 > "/tmp/crun-configure-$mode.log" 2>&1 ||
      { tail -40 "/tmp/crun-configure-$mode.log"; exit 1; }
    if [[ $mode == run ]]; then
      cmake --build build-gpu -j "$(nproc)"
      (cd build-gpu && ctest --output-on-failure -j 1) 2>&1 | tee "$out/ctest.log" || echo "gpu-check: ctest failed" >&2
      cp docs/benchmarks.md "$out/benchmarks.md"
      PYTHONUNBUFFERED=1 $py tests/bench/nccl_bench.py --bench build-gpu/tests/nccl_allreduce \
        --torchrun "$py" --out "$out/benchmarks.md" --json-dir "$out"
    else
      # ResNet-18 on synthetic CIFAR-10 at fp32, bf16 and fp16 autocast (the latter two
      # channels-last), one worker launched by torchrun, so the NCCL group is used.
      # The same model, data and settings in PyTorch (tests/bench/ddp_cifar.py) as the anchor.
      cmake --build build-gpu -j "$(nproc)" --target train
      data=/tmp/crun-gpu-cifar
      for m in "fp32:--amp off" "bf16:--amp bf16 --channels-last" "fp16:--amp fp16 --channels-last"; do
        name=${m%%:*}
        # shellcheck disable=SC2086
        PYTHONUNBUFFERED=1 $py -m torch.distributed.run --standalone --nproc-per-node 1 --no-python \
          build-gpu/train/train --model resnet18 --synthetic 50000 --data-dir $data --epochs 2 \
          --batch-size 256 --device cuda --log-every 50 ${m#*:} \
          --metrics-json "$out/train_$name.json" 2>&1 | tee -a "$out/train.log"
        # shellcheck disable=SC2086
        PYTHONUNBUFFERED=1 $py -m torch.distributed.run --standalone --nproc-per-node 1 \
          tests/bench/ddp_cifar.py $data 2 256 "$out/torch_$name.json" --model resnet18 \
          --device cuda ${m#*:} 2>&1 | tee -a "$out/train.log"
      done
    fi
    ;;
  *)
    echo "usage: $0 prepare | run OUT | train OUT" >&2
    exit 2
    ;;
esac
