#!/usr/bin/env bash
# The GPU path, for a GPU machine that has a compiler, CMake, the CUDA toolkit and PyTorch (with
# its NCCL) but none of crun's other dependencies (no gRPC, no Boost): crun comes as the
# relocatable tarball built here (docs/install.md) and launches everything there.
#
#   scripts/gpu-check.sh prepare   here: the crun tarball (scripts/package.sh from ./build) and
#                                  the header-only Catch2 the SDK's tests need, CLI11 (train's
#                                  command line) and nlohmann_json (train's metrics), into .gpu/
#   scripts/gpu-check.sh run OUT   there: crun from the tarball; stock PyTorch NCCL DDP under
#                                  `crun --nproc-per-node gpu`, then the same with a GPU worker
#                                  SIGKILLed and restarted, cold and --warm; the SDK-only
#                                  build with NCCL and its unit tests (nccl_unit_tests runs
#                                  every collective on the GPU); the allreduce/allgather
#                                  benchmark against PyTorch's ProcessGroupNCCL, both sides
#                                  launched by crun. Writes
#                                  OUT/ctest.log, OUT/ddp.log and OUT/benchmarks.md
#                                  (docs/benchmarks.md with its nccl-bench section filled in).
#   scripts/gpu-check.sh train OUT there, after run: train (ResNet-18, synthetic CIFAR-10) on
#                                  the GPU at fp32, bf16 and fp16, and PyTorch's own loop as the
#                                  anchor, all under crun; OUT/train_*.json, OUT/torch_*.json
#                                  and OUT/benchmarks.md (its train-gpu section filled in).
#   scripts/gpu-check.sh health OUT there, on its own, nothing built: the health gate's gpu
#                                  check against the real driver (also the end of faults).
#   scripts/gpu-check.sh faults OUT there, on its own: while train and the SDK's tests build,
#                                  hangs on the GPU (a spinning kernel; Gloo with CUDA tensors,
#                                  one rank blocked before its collective; one NCCL rank with
#                                  the flight recorder), CUDA OOM, device selection and NUMA
#                                  binding, snapshots of CUDA state in crun's node memory (the
#                                  Python module and train); then the nccl tests, and train's
#                                  rows beside the model's ceiling (tests/bench/ddp_cifar.py
#                                  --ceiling), train with host-synchronised averaging
#                                  (CRUN_NCCL_STREAM_ORDER=0) and PyTorch's loop, with an nsys
#                                  or torch.profiler summary where one is there. Every step is
#                                  bounded and logged in OUT/faults.log with its verdict.
# tests/integration/test_gpu_check.py rehearses the three here, without a GPU, as far as the
# first step that needs one (TORCH_CUDA_ARCH_LIST names the architecture torch cannot detect).
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
  prepare)
    rm -rf .gpu && mkdir -p .gpu/catch2/include .gpu/catch2/lib/cmake
    cp -r /usr/include/catch2 .gpu/catch2/include/
    cp -r /usr/lib/cmake/Catch2 .gpu/catch2/lib/cmake/
    cp /usr/lib/libCatch2WithMain.a .gpu/catch2/lib/
    # train writes its metrics with nlohmann_json (header-only): its headers and CMake package.
    mkdir -p .gpu/nlohmann/include .gpu/nlohmann/share/cmake
    cp -r /usr/include/nlohmann .gpu/nlohmann/include/
    cp -r /usr/share/cmake/nlohmann_json .gpu/nlohmann/share/cmake/
    # train parses its command line with CLI11 (header-only), built in both modes.
    mkdir -p .gpu/cli11/include .gpu/cli11/share/cmake
    cp -r /usr/include/CLI .gpu/cli11/include/
    cp -r /usr/share/cmake/CLI11 .gpu/cli11/share/cmake/
    bash scripts/package.sh --out .gpu/dist >/dev/null
    cp .gpu/dist/crun-*-linux-x86_64.tar.gz .gpu/ && rm -rf .gpu/dist
    # The GPU machine gets the tree without its history: the benchmarks' "Measured at" line
    # comes from here (tests/pylib/bench_support.py reads it from CRUN_MEASURED_AT).
    dirty=$(git status --porcelain --untracked-files=no | grep -q . && echo " plus uncommitted changes" || true)
    echo "Measured at commit $(git rev-parse --short HEAD)$dirty ($(git show -s --format=%cs HEAD))," \
      "on the GPU machine named above." > .gpu/measured_at
    echo "prepared .gpu/ (carry it with the run): $(ls .gpu/*.tar.gz)"
    ;;
  run | train | faults | health)
    mode=$1
    out=${2:?usage: gpu-check.sh $1 OUT}
    mkdir -p "$out"
    out=$(cd "$out" && pwd)
    py=${PYTHON:-python3}
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    tarball=$(ls .gpu/crun-*-linux-x86_64.tar.gz 2>/dev/null | head -1)
    [[ -n "$tarball" ]] || { echo "gpu-check: no crun tarball in .gpu/: run 'gpu-check.sh prepare' here first" >&2; exit 2; }
    rm -rf .gpu/crun && mkdir -p .gpu/crun
    tar -C .gpu/crun --strip-components 1 -xzf "$tarball"
    crun="$PWD/.gpu/crun/bin/crun"
    echo "gpu-check: $("$crun" --version) from $tarball; it needs: $(ldd "$crun" | awk '{print $1}' | tr '\n' ' ')"
    export PYTHON_EXEC="$(command -v "$py")"
    [[ -f .gpu/measured_at ]] && CRUN_MEASURED_AT=$(cat .gpu/measured_at) && export CRUN_MEASURED_AT
    # NCCL: the one PyTorch ships (the nvidia-nccl wheel) if there is one, else the toolkit's.
    # PyTorch's first: train links libtorch_cuda, which needs the NCCL it was built with (a
    # toolkit's older NCCL leaves symbols undefined), and the benchmark's two sides then share
    # one NCCL. The wheel has only libnccl.so.2; the SDK's build finds that (nothing is linked
    # or written into the wheel).
    nccl_root=${NCCL_ROOT:-}
    if [[ -z "$nccl_root" ]]; then
      hdr=$(find "$($py -c 'import site; print(site.getsitepackages()[0])')/nvidia" /usr/local/cuda/include \
              -name nccl.h 2>/dev/null | head -1)
      [[ -n "$hdr" ]] || { echo "gpu-check: nccl.h not found; set NCCL_ROOT" >&2; exit 1; }
      nccl_root=$(dirname "$(dirname "$hdr")")
    fi
    echo "gpu-check: NCCL from $nccl_root ($(grep -E -m3 '^#define NCCL_(MAJOR|MINOR|PATCH) ' "$nccl_root/include/nccl.h" |
      awk '{print $3}' | paste -sd.))"
    export LD_LIBRARY_PATH="$nccl_root/lib:${LD_LIBRARY_PATH:-}"
    if [[ $mode == health ]]; then
      source scripts/gpu-faults.sh
      gpu_health "$crun" "$out" "$py"
      exit 0
    fi
    prefix="$PWD/.gpu/catch2;$PWD/.gpu/cli11"
    with_torch=OFF
    if [[ $mode != run ]]; then
      # libtorch from the PyTorch package.
      prefix="$prefix;$PWD/.gpu/nlohmann;$($py -c 'import torch; print(torch.utils.cmake_prefix_path)')"
      with_torch=ON
    fi
    # CRUN_GPU_BUILD_TYPE: the rehearsal here (tests/integration/test_gpu_check.py) compiles
    # with "None" (no flags: -O0, no debug information); the build it rehearses
    # is the same otherwise, and crun's own build compiles these sources with -O2 and -Werror.
    cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE="${CRUN_GPU_BUILD_TYPE:-Release}" -DCRUN_WERROR=ON \
      -DCRUN_WORKER_SDK_ONLY=ON -DCRUN_WITH_GLOO=OFF -DCRUN_WITH_TORCH=$with_torch \
      -DCRUN_WITH_NCCL=ON -DNCCL_ROOT="$nccl_root" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_POLICY_VERSION_MINIMUM=3.5 > "$out/configure-$mode.log" 2>&1 ||
      { tail -40 "$out/configure-$mode.log"; exit 1; }
    if [[ $mode == faults ]]; then
      source scripts/gpu-faults.sh
      gpu_faults "$crun" "$out" "$py"
    elif [[ $mode == run ]]; then
      # Stock PyTorch DDP over NCCL, one worker per visible GPU; then a GPU worker SIGKILLed
      # in the first attempt and the group restarted (--max-restarts 1).
      ddp_out=$(mktemp -d)
      { PYTHONUNBUFFERED=1 "$crun" --standalone --nproc-per-node gpu tests/workers/ddp_train.py "$ddp_out" --nccl &&
        echo "gpu-check: DDP over NCCL under crun: exit 0" &&
        PYTHONUNBUFFERED=1 "$crun" --standalone --nproc-per-node gpu --max-restarts 1 \
          tests/workers/ddp_train.py "$ddp_out" --nccl --die-once &&
        echo "gpu-check: DDP over NCCL, a worker SIGKILLed and restarted under crun: exit 0" &&
        PYTHONUNBUFFERED=1 "$crun" --standalone --nproc-per-node gpu --max-restarts 1 --warm \
          tests/workers/ddp_train.py "$ddp_out" --nccl --die-once 2>&1 | tee "$ddp_out/warm.log" &&
        if grep -q "warm starts are off\|start cold\|starts cold" "$ddp_out/warm.log"; then
          echo "gpu-check: the --warm run started workers cold"; false
        else echo "gpu-check: the same with warm workers (--warm), none started cold: exit 0"; fi
      } 2>&1 |
        tee "$out/ddp.log" || echo "gpu-check: a DDP run failed (OUT/ddp.log)" >&2
      rm -rf "$ddp_out"
      cmake --build build-gpu -j "$(nproc)"
      (cd build-gpu && ctest --output-on-failure -j 1) 2>&1 | tee "$out/ctest.log" || echo "gpu-check: ctest failed" >&2
      cp docs/benchmarks.md "$out/benchmarks.md"
      PYTHONUNBUFFERED=1 $py tests/bench/nccl_bench.py --bench build-gpu/tests/nccl_allreduce \
        --crun "$crun" --torch-python "$py" --out "$out/benchmarks.md" --json-dir "$out"
    else
      # ResNet-18 on synthetic CIFAR-10 at fp32, bf16 and fp16 autocast (the latter two
      # channels-last), one worker under crun, so the NCCL group is used. The same model,
      # data and settings in PyTorch (tests/bench/ddp_cifar.py) as the anchor, under crun too.
      cmake --build build-gpu -j "$(nproc)" --target train
      data=/tmp/crun-gpu-cifar
      for m in "fp32:--amp off" "bf16:--amp bf16 --channels-last" "fp16:--amp fp16 --channels-last"; do
        name=${m%%:*}
        # shellcheck disable=SC2086
        PYTHONUNBUFFERED=1 "$crun" --standalone --nproc-per-node 1 \
          build-gpu/train/train --model resnet18 --synthetic 50000 --data-dir $data --epochs 2 \
          --batch-size 256 --device cuda --log-every 50 ${m#*:} \
          --metrics-json "$out/train_$name.json" 2>&1 | tee -a "$out/train.log"
        # shellcheck disable=SC2086
        PYTHONUNBUFFERED=1 "$crun" --standalone --nproc-per-node 1 \
          tests/bench/ddp_cifar.py $data 2 256 "$out/torch_$name.json" --model resnet18 \
          --device cuda ${m#*:} 2>&1 | tee -a "$out/train.log"
      done
      cp docs/benchmarks.md "$out/benchmarks.md"
      $py tests/bench/train_gpu_table.py --dir "$out" --out "$out/benchmarks.md" --device \
        "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)"
    fi
    ;;
  *)
    echo "usage: $0 prepare | run OUT | train OUT | faults OUT | health OUT" >&2
    exit 2
    ;;
esac
