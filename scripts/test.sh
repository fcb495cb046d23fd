#!/usr/bin/env bash
# Set up .venv with the test extras and run every check: ruff, mypy, then the whole pytest suite.
set -euo pipefail
cd "$(dirname "$0")/.."
DTPROF_EXTRAS=test bash scripts/setup.sh
bash scripts/browser.sh   # headless Chromium for tests/system/test_dashboard_browser.py
. .venv/bin/activate
echo "== ruff"; ruff check dtprof dashboard tests benchmarks sample_traces examples
echo "== mypy"; mypy
echo "== pytest"; python -m pytest -q -p no:cacheprovider "$@"
