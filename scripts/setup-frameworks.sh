#!/usr/bin/env bash
# Makes (once) the virtual environments of the frameworks crun launches besides PyTorch
# (docs/frameworks.md), each from PyPI, each in its own venv under ~/.cache/crun so later runs
# on the same machine reuse them. Prints `NAME=PYTHON` per framework on stdout.
#   scripts/setup-frameworks.sh [--paths] [tf] [jax] [deepspeed] [horovod] [nvrx]
#                                (default: the first four; nvrx is the goodput benchmark's)
# --paths prints where each python will be and installs nothing (scripts/test.sh configures the
# build with them while the venvs are made).
# DeepSpeed goes into the PyTorch 2.x venv (scripts/setup-torch2.sh): it is a PyTorch library.
# Horovod is built from PyPI's source distribution (it has no wheels), with its Gloo controller
# and PyTorch, against torch 2.0.1: it does not compile against torch >= 2.1 (C++17; fixed on
# its master, never released). About 15 minutes on 2 cores, once.
set -euo pipefail
cd "$(dirname "$0")/.."
TF_VERSION="2.21.0"        # tensorflow-cpu and tf-keras (Keras 3 breaks the multi-worker guide)
JAX_VERSION="0.10.2"       # jax and jaxlib; CPU collectives over gloo
DEEPSPEED_VERSION="0.19.8"
HOROVOD_VERSION="0.28.1"
HOROVOD_TORCH_VERSION="2.0.1"
# NVIDIA's resiliency extension, for its ft_launcher (tests/bench/goodput_bench.py): 0.4.1 is the
# newest with a wheel for Debian 12's glibc 2.36 (0.5.0 and 0.6.0 need 2.39; 0.7.0 has none for
# Python 3.11). Its own venv sees the PyTorch 2.x venv's packages (a .pth file) rather than
# download torch again; its other requirements are pure Python.
NVRX_VERSION="0.4.1"
CACHE="$HOME/.cache/crun"
pip_q=(-q --disable-pip-version-check)

paths_only=0
if [ "${1:-}" = "--paths" ]; then paths_only=1; shift; fi

# venv NAME CHECK PACKAGES...: the venv's python, made or mended until CHECK passes.
venv() {
  local name=$1 check=$2
  shift 2
  local dir="$CACHE/venv-$name" py="$CACHE/venv-$name/bin/python"
  if [ $paths_only = 1 ]; then echo "$py"; return; fi
  if ! { [ -x "$py" ] && "$py" -c "$check" 2>/dev/null; }; then
    echo "setup-frameworks: installing $* into $dir" >&2
    rm -rf "$dir"
    mkdir -p "$CACHE"
    /usr/bin/python3 -m venv "$dir"
    "$dir/bin/pip" install "${pip_q[@]}" "$@" >&2
    "$py" -c "$check" || { echo "setup-frameworks: $name does not import after install" >&2; exit 1; }
  fi
  echo "$py"
}

has() {  # has PACKAGE VERSION: a check for venv()
  echo "import sys; from importlib.metadata import version; sys.exit(version('$1') != '$2')"
}

wanted=("$@")
[ ${#wanted[@]} -gt 0 ] || wanted=(tf jax deepspeed horovod)
for w in "${wanted[@]}"; do
  case "$w" in
    tf)
      py=$(venv "tf-$TF_VERSION" "$(has tensorflow-cpu $TF_VERSION); import tensorflow, tf_keras" \
        "tensorflow-cpu==$TF_VERSION" "tf-keras==$TF_VERSION")
      ;;
    jax)
      py=$(venv "jax-$JAX_VERSION" "$(has jax $JAX_VERSION); import jax" \
        "jax==$JAX_VERSION" "jaxlib==$JAX_VERSION")
      ;;
    deepspeed)
      if [ $paths_only = 1 ]; then
        py=$(bash scripts/setup-torch2.sh --path)
      else
        py=$(bash scripts/setup-torch2.sh)
      fi
      if [ $paths_only = 0 ] && ! "$py" -c "$(has deepspeed $DEEPSPEED_VERSION)" 2>/dev/null; then
        echo "setup-frameworks: installing deepspeed==$DEEPSPEED_VERSION beside torch" >&2
        # No compiled ops (DS_BUILD_OPS=0, the default): its launcher, init_distributed and
        # collectives are Python over torch.distributed.
        "$(dirname "$py")/pip" install "${pip_q[@]}" "deepspeed==$DEEPSPEED_VERSION" >&2
      fi
      # On CPU, DeepSpeed compiles its shared-memory collectives (deepspeed_shm_comm, C++ over
      # torch's headers) at a job's first init_distributed: about a minute alone, minutes on a
      # loaded machine, inside a test's time, and a build killed half way leaves a lock that
      # makes the next one wait for good. It is compiled here, once, into the venv; the tests
      # point TORCH_EXTENSIONS_DIR at it (tests/integration/CMakeLists.txt).
      ext="$(dirname "$(dirname "$py")")/torch_extensions"
      if [ $paths_only = 0 ] && [ ! -e "$ext/deepspeed_shm_comm/deepspeed_shm_comm.so" ]; then
        echo "setup-frameworks: compiling DeepSpeed's CPU op deepspeed_shm_comm into $ext" >&2
        rm -rf "$ext"
        TORCH_EXTENSIONS_DIR="$ext" "$py" -c 'from deepspeed.accelerator import get_accelerator
get_accelerator().create_op_builder("ShareMemCommBuilder").load()' > /dev/null 2>&1 ||
          { echo "setup-frameworks: compiling deepspeed_shm_comm failed" >&2; exit 1; }
      fi
      ;;
    horovod)
      dir="$CACHE/venv-horovod-$HOROVOD_VERSION"
      check="$(has horovod $HOROVOD_VERSION); import horovod.torch"
      py="$dir/bin/python"
      if [ $paths_only = 0 ] && ! { [ -x "$py" ] && "$py" -c "$check" 2>/dev/null; }; then
        echo "setup-frameworks: building horovod==$HOROVOD_VERSION (Gloo, PyTorch" \
          "$HOROVOD_TORCH_VERSION) into $dir" >&2
        rm -rf "$dir"
        /usr/bin/python3 -m venv "$dir"
        "$dir/bin/pip" install "${pip_q[@]}" "torch==$HOROVOD_TORCH_VERSION" "numpy<2" \
          cloudpickle psutil pyyaml packaging cffi wheel setuptools >&2
        HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITH_PYTORCH=1 \
          HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$(nproc)" \
          "$dir/bin/pip" install "${pip_q[@]}" --no-build-isolation --no-cache-dir \
          "horovod[pytorch]==$HOROVOD_VERSION" >&2
        "$py" -c "$check" || { echo "setup-frameworks: horovod does not import after its build" >&2; exit 1; }
      fi
      ;;
    nvrx)
      dir="$CACHE/venv-nvrx-$NVRX_VERSION"
      check="$(has nvidia-resiliency-ext $NVRX_VERSION); import torch, nvidia_resiliency_ext.fault_tolerance"
      py="$dir/bin/python"
      if [ $paths_only = 0 ] && ! { [ -x "$py" ] && "$py" -c "$check" 2>/dev/null; }; then
        torch_py=$(bash scripts/setup-torch2.sh)
        echo "setup-frameworks: installing nvidia-resiliency-ext==$NVRX_VERSION into $dir" >&2
        rm -rf "$dir"
        /usr/bin/python3 -m venv "$dir"
        "$torch_py" -c 'import site; print(site.getsitepackages()[0])' \
          > "$("$py" -c 'import site; print(site.getsitepackages()[0])')/crun-torch2.pth"
        "$dir/bin/pip" install "${pip_q[@]}" --no-deps "nvidia-resiliency-ext==$NVRX_VERSION" \
          defusedxml "psutil>=6" pyyaml packaging "pynvml>=12" "nvidia-ml-py>=12.570.86" >&2
        "$py" -c "$check" || { echo "setup-frameworks: nvrx does not import after install" >&2; exit 1; }
      fi
      ;;
    *)
      echo "setup-frameworks: unknown framework '$w' (expected tf, jax, deepspeed, horovod, nvrx)" >&2
      exit 2
      ;;
  esac
  echo "$w=$py"
done
