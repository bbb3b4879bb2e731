#!/usr/bin/env bash
# Makes (once) the virtual environments of the frameworks crun launches besides PyTorch
# (docs/frameworks.md), each from PyPI, each in its own venv under ~/.cache/crun so later runs
# on the same machine reuse them. Prints `NAME=PYTHON` per framework on stdout.
#   scripts/setup-frameworks.sh [tf] [jax] [deepspeed]     (default: all three)
# DeepSpeed goes into the PyTorch 2.x venv (scripts/setup-torch2.sh): it is a PyTorch library.
set -euo pipefail
cd "$(dirname "$0")/.."
TF_VERSION="2.21.0"        # tensorflow-cpu and tf-keras (Keras 3 breaks the multi-worker guide)
JAX_VERSION="0.10.2"       # jax and jaxlib; CPU collectives over gloo
DEEPSPEED_VERSION="0.19.8"
CACHE="$HOME/.cache/crun"
pip_q=(-q --disable-pip-version-check)

# venv NAME CHECK PACKAGES...: the venv's python, made or mended until CHECK passes.
venv() {
  local name=$1 check=$2
  shift 2
  local dir="$CACHE/venv-$name" py="$CACHE/venv-$name/bin/python"
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
[ ${#wanted[@]} -gt 0 ] || wanted=(tf jax deepspeed)
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
      py=$(bash scripts/setup-torch2.sh)
      if ! "$py" -c "$(has deepspeed $DEEPSPEED_VERSION)" 2>/dev/null; then
        echo "setup-frameworks: installing deepspeed==$DEEPSPEED_VERSION beside torch" >&2
        # No compiled ops (DS_BUILD_OPS=0, the default): its launcher, init_distributed and
        # collectives are Python over torch.distributed.
        "$(dirname "$py")/pip" install "${pip_q[@]}" "deepspeed==$DEEPSPEED_VERSION" >&2
      fi
      ;;
    *)
      echo "setup-frameworks: unknown framework '$w' (expected tf, jax, deepspeed)" >&2
      exit 2
      ;;
  esac
  echo "$w=$py"
done
