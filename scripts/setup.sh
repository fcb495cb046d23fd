#!/usr/bin/env bash
# Create .venv with dtprof installed in it. Torch is installed only if the environment has none:
# TORCH_SPEC (default torch==2.13.0) picks the build; users with their own torch keep it.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
if ! python -c "import torch" 2>/dev/null; then
  echo "setup: installing ${TORCH_SPEC:-torch==2.13.0}"
  python -m pip install -q "${TORCH_SPEC:-torch==2.13.0}" 2>&1 | grep -v "^WARNING: Location" || true
fi
extras=${DTPROF_EXTRAS:-}
python -m pip install -q -e ".${extras:+[$extras]}" 2>&1 | grep -v "^WARNING: Location" || true
python -c "import torch, dtprof; print(f'setup: dtprof {dtprof.__version__}, torch {torch.__version__}')"
