#!/usr/bin/env bash
# Makes (once) a virtual environment with PyTorch 2.x from PyPI, used by the compatibility and
# benchmark suites beside Debian's PyTorch 1.13. Prints the environment's python on stdout.
# The environment lives outside the checkout so later runs on the same machine reuse it.
set -euo pipefail
TORCH2_VERSION="${CRUN_TORCH2_VERSION:-2.15.0}"
VENV="${CRUN_TORCH2_VENV:-$HOME/.cache/crun/venv-torch-$TORCH2_VERSION}"
PY="$VENV/bin/python"
if [ -x "$PY" ] && "$PY" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH2_VERSION')" 2>/dev/null; then
  echo "$PY"
  exit 0
fi
echo "setup-torch2: installing torch==$TORCH2_VERSION from PyPI into $VENV" >&2
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
/usr/bin/python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check "torch==$TORCH2_VERSION" numpy >&2
"$PY" -c "import torch; print('setup-torch2: torch', torch.__version__)" >&2
echo "$PY"
