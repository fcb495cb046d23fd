#!/usr/bin/env bash
# Create .venv with dtprof installed in it. Torch is installed only if the environment has none:
# TORCH_SPEC (default torch==2.13.0) picks the build; users with their own torch keep it.
# DTPROF_EXTRAS=test adds the test tools. pip's output goes to .venv/setup.log. A C++ compiler is
# made sure of first (scripts/native.sh), so that the install builds the native profiler-trace
# reader; after it, the native recording kernel (DDP's buckets, the backward phase) is built. The sources are compiled to bytecode, as pip
# would.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
log=.venv/setup.log
pip_install() {
  if ! python -m pip install --disable-pip-version-check "$@" >>"$log" 2>&1; then
    tail -n 30 "$log" >&2
    echo "setup: pip install $* failed; the whole log is in $log" >&2
    exit 1
  fi
}
: >"$log"
if ! python -c "import torch" 2>/dev/null; then
  echo "setup: installing ${TORCH_SPEC:-torch==2.13.0}"
  pip_install "${TORCH_SPEC:-torch==2.13.0}"
fi
bash scripts/native.sh --compiler
extras=${DTPROF_EXTRAS:+[$DTPROF_EXTRAS]}
echo "setup: installing dtprof$extras (editable)"
pip_install -e ".$extras"
# what pip does for a regular install: bytecode compiled once, not at every command's start
# (where PYTHONDONTWRITEBYTECODE is set, Python would otherwise compile dtprof every time)
python -m compileall -q dtprof dashboard >/dev/null
python -c "import torch, dtprof; print(f'setup: dtprof {dtprof.__version__}, torch {torch.__version__}')"
bash scripts/native.sh
