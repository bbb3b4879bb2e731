#!/usr/bin/env bash
# Makes (once) a virtual environment with PyTorch 2.x from PyPI, used by the compatibility and
# benchmark suites beside Debian's PyTorch 1.13, with the frameworks the compatibility suite
# runs under crun (PyTorch Lightning, Hugging Face accelerate). Prints the environment's python
# on stdout. The environment lives outside the checkout so later runs on the same machine
# reuse it; one made before a framework was added gets it installed.
#   scripts/setup-torch2.sh [--path]    --path: print where its python will be; install nothing
set -euo pipefail
TORCH2_VERSION="${CRUN_TORCH2_VERSION:-2.15.0}"
LIGHTNING_VERSION="2.6.6"
ACCELERATE_VERSION="1.15.0"
PY_SPY_VERSION="0.4.3"
VENV="${CRUN_TORCH2_VENV:-$HOME/.cache/crun/venv-torch-$TORCH2_VERSION}"
PY="$VENV/bin/python"
if [ "${1:-}" = "--path" ]; then echo "$PY"; exit 0; fi
if ! { [ -x "$PY" ] && "$PY" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH2_VERSION')" 2>/dev/null; }; then
  echo "setup-torch2: installing torch==$TORCH2_VERSION from PyPI into $VENV" >&2
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  /usr/bin/python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "torch==$TORCH2_VERSION" numpy >&2
fi
if ! "$PY" -c "
import sys
from importlib.metadata import version
sys.exit(version('lightning') != '$LIGHTNING_VERSION' or version('accelerate') != '$ACCELERATE_VERSION')
" 2>/dev/null; then
  echo "setup-torch2: installing lightning==$LIGHTNING_VERSION accelerate==$ACCELERATE_VERSION" >&2
  "$VENV/bin/pip" install -q --disable-pip-version-check "torch==$TORCH2_VERSION" \
    "lightning==$LIGHTNING_VERSION" "accelerate==$ACCELERATE_VERSION" >&2
fi
# py-spy beside the interpreter: crun finds it there and reads these workers' Python stacks
# with it (docs/hangs.md); Debian's python3 goes without, so both ways are tested.
if ! [ -x "$VENV/bin/py-spy" ] || [ "$("$VENV/bin/py-spy" --version)" != "py-spy $PY_SPY_VERSION" ]; then
  echo "setup-torch2: installing py-spy==$PY_SPY_VERSION" >&2
  "$VENV/bin/pip" install -q --disable-pip-version-check "py-spy==$PY_SPY_VERSION" >&2
fi
"$PY" -c "import torch, lightning, accelerate; print('setup-torch2: torch', torch.__version__, 'lightning', lightning.__version__, 'accelerate', accelerate.__version__)" >&2
echo "$PY"
